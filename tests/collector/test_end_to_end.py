"""Acceptance 1: the SDK's own OTLP exporters -> gateway (tail sampling) -> a second gateway writing a file.

The downstream file must hold exactly the kept traces, every span of them, and nothing of
the dropped ones. Decisions are driven by a fake clock; ``flush`` waits for delivery.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from collector_testkit import FakeClock, loopback_config, request_attrs
from otel_llm_collector.gateway import Gateway


@pytest.fixture
def downstream(tmp_path: Path):
    out = tmp_path / "kept.jsonl"
    g = Gateway(loopback_config(processors={"tail_sampling": None},
                                exporters={"file": {"path": str(out)}, "prometheus": None}),
                manual_ticks=True).start()
    yield g, out
    g.shutdown()


@pytest.fixture
def upstream(downstream, clock: FakeClock):
    g2, _ = downstream
    policies = [{"name": "errors", "type": "error"}, {"name": "slo_breach", "type": "slo"}]
    g = Gateway(loopback_config(processors={"llm_metrics": {"slo": "ttft=0.5"},
                                            "tail_sampling": {"policies": policies}},
                                exporters={"otlp": {"endpoint": g2.grpc_endpoint}}),
                clock=clock, manual_ticks=True).start()
    yield g
    g.shutdown()


def emit_traces(provider: TracerProvider, prefix: str) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """Ten requests, each a request span with two children; 2 breach TTFT, 1 errors, 7 are fine."""
    tracer = provider.get_tracer("e2e")
    kept: dict[int, set[int]] = {}
    dropped: dict[int, set[int]] = {}
    for i in range(10):
        ttft = 0.9 if i in (1, 4) else 0.1
        with tracer.start_as_current_span(f"{prefix} text_completion m", attributes=request_attrs(ttft=ttft)) as root:
            ids = {root.get_span_context().span_id}
            for child in ("llm.queue", "llm.decode"):
                with tracer.start_as_current_span(child) as c:
                    ids.add(c.get_span_context().span_id)
                    if i == 7 and child == "llm.decode":
                        c.set_status(Status(StatusCode.ERROR, "engine died"))
        (kept if i in (1, 4, 7) else dropped)[root.get_span_context().trace_id] = ids
    return kept, dropped


def read_spans(path: Path) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            assert attrs["service.name"] == {"stringValue": "e2e-app"}  # resource preserved
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    out.setdefault(int(s["traceId"], 16), set()).add(int(s["spanId"], 16))
    return out


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_exporters_to_gateway_downstream_gets_exactly_the_kept_traces(transport, upstream, downstream,
                                                                          clock: FakeClock) -> None:
    _, out = downstream
    exporter = (GrpcExporter(endpoint=upstream.grpc_endpoint, insecure=True) if transport == "grpc"
                else HttpExporter(endpoint=upstream.http_endpoint + "/v1/traces"))
    provider = TracerProvider(resource=Resource.create({"service.name": "e2e-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    kept, dropped = emit_traces(provider, transport)
    provider.shutdown()

    clock.advance(1.5)  # past decision_wait_after_root_received
    assert upstream.tick() == 10
    assert upstream.flush(10)
    assert downstream[0].flush(10)

    got = read_spans(out)
    assert got == kept  # exactly the kept traces, complete; none of the dropped ones
    t = upstream.telemetry
    assert t.value("receiver_accepted_spans", transport=transport) == 30
    assert t.value("count_traces_sampled", policy="slo_breach", decision="sampled") == 2
    assert t.value("count_traces_sampled", policy="errors", decision="sampled") == 1
    assert t.value("exporter_sent_spans", exporter="otlp") == 9


def test_export_failure_retries_then_drops_counted_and_never_blocks(clock: FakeClock) -> None:
    """A dead backend: sends fail, retry with backoff, then the batch is dropped and counted."""
    cfg = loopback_config(
        processors={"tail_sampling": {"policies": [{"name": "all", "type": "always_sample"}]}},
        exporters={"otlp": {"endpoint": "127.0.0.1:9", "timeout": "200ms",
                            "retry_on_failure": {"initial_interval": "10ms", "max_elapsed_time": "100ms"},
                            "sending_queue": {"queue_size": 1}}})
    from collector_testkit import export_request, span

    with Gateway(cfg, clock=clock, manual_ticks=True) as g:
        for i in range(1, 6):  # ingest returns at once even though the backend is down
            g.ingest(export_request(span(i, 1)))
            clock.advance(31)
            g.tick()
        assert g.flush(30)
        t = g.telemetry
        dropped = (t.value("exporter_dropped_spans", exporter="otlp", reason="retries_exhausted")
                   + t.value("exporter_dropped_spans", exporter="otlp", reason="queue_full"))
        assert dropped == 5
        assert t.value("exporter_send_failures", exporter="otlp") >= 2
        assert t.value("exporter_sent_spans", exporter="otlp") == 0
