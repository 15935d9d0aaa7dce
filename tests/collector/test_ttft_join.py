"""The client's time to first chunk joined with the engine's TTFT of the same trace, in either arrival order."""

from __future__ import annotations

from collector_testkit import export_request, loopback_config, request_attrs, span
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.ttft_join import OVERHEAD, TTFTJoin

from otel_llm import semconv as sc
from support.metrics import points_by_name


def client_span(trace: int, ttfc: float, model: str = "m") -> Span:
    s = span(trace, 1, name=f"chat {model}", attrs={sc.RESPONSE_TIME_TO_FIRST_CHUNK: ttfc, sc.REQUEST_MODEL: model,
                                                   sc.REQUEST_STREAM: True})
    s.kind = Span.SPAN_KIND_CLIENT
    return s


def overhead_points(g: Gateway) -> list:
    return points_by_name(g.metric_reader.get_metrics_data())[OVERHEAD]


def test_client_and_server_halves_join_in_either_order():
    g = Gateway(loopback_config(), manual_ticks=True)
    # client first, then its server request span (a child, from another process)
    g.ingest(export_request(client_span(0xA1, ttfc=0.150), service="app"))
    g.ingest(export_request(span(0xA1, 2, parent=1, attrs=request_attrs(ttft=0.100)), service="vllm"))
    # server first
    g.ingest(export_request(span(0xA2, 2, parent=1, attrs=request_attrs(ttft=0.200)), service="vllm"))
    g.ingest(export_request(client_span(0xA2, ttfc=0.230), service="app"))
    # a server request with no client span, and a non-streamed client call: nothing to join
    g.ingest(export_request(span(0xA3, 2, attrs=request_attrs(ttft=0.1)), service="vllm"))
    (p,) = overhead_points(g)
    assert p.count == 2 and abs(p.sum - (0.050 + 0.030)) < 1e-9
    assert dict(p.attributes) == {"service.name": "app", sc.REQUEST_MODEL: "m"}
    assert not g.ttft_join._servers  # a request span without a parent had no caller: it waits for nobody


def test_unjoined_halves_are_bounded():
    g = Gateway(loopback_config(), manual_ticks=True)
    join = TTFTJoin(g.meter_provider, g.telemetry, max_pending=3)
    from otel_llm_collector.spans import extract

    for t in range(10):
        join.process(extract(export_request(client_span(0xB00 + t, ttfc=0.1))))
    assert len(join._clients) == 3
    assert g.telemetry.registry.get_sample_value("otelcol_llm_ttft_join_forgotten_total") == 7
