"""``VLLM_USE_RUST_FRONTEND=1 vllm serve`` under ``opentelemetry-instrument``: no Python frontend exists, so the
EngineCore is its requests' source (docs/design/enginecore-source.md). Streamed and non-streamed
``/v1/completions`` each get one SERVER request span with its phases and linked engine steps; its timings lie
within what the client observed; the metrics count every request, as ``vllm-rs``'s own do; and what
``vllm-rs`` forwards to the engine (``trace_headers``, ``external_req_id``) is what the docs say. Once with one
EngineCore, once with two (``--data-parallel-size 2``). With one, the traces go through the real gateway
(``otel-llm-collector``) with the callers' client spans for two of the requests: those two server traces end up
in their caller's trace (``trace_join``, joined on the response id), the other two go on alone.

Needs the ``vllm-rs`` binary of the tested release: ``VLLM_RUST_FRONTEND_PATH``, else ``.cache/vllm-rs/vllm-rs``
(scripts/setup.sh extracts it from the ``vllm`` wheel)."""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm import semconv as sc
from otel_llm.core.metrics import SERVER_HISTOGRAMS
from otel_llm.core.summary import ATTRIBUTE_OF_FIELD
from support.gateway_process import GatewayProcess
from support.otlp_sink import OTLPSink
from support.server import VLLMServer

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

_REPO = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
MAX_TOKENS = 8


def _binary() -> str | None:
    path = os.environ.get("VLLM_RUST_FRONTEND_PATH") or str(_REPO / ".cache" / "vllm-rs" / "vllm-rs")
    return path if os.access(path, os.X_OK) else None


def _metric(field: str) -> str:
    return next(h.name for h in SERVER_HISTOGRAMS if h.field == field)


def _complete(base_url: str, model: str, prompt: list[int], stream: bool, traceparent: str) -> dict:
    """One ``/v1/completions`` over plain HTTP (the headers exactly as given), with what the client saw:
    when it sent, its first and last chunk (wall clock)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                       "stream": stream}).encode()
    req = urllib.request.Request(f"{base_url}/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "traceparent": traceparent})
    sent = time.time()
    first = None
    ids = set()
    with urllib.request.urlopen(req, timeout=120) as r:
        if stream:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                if first is None:
                    first = time.time()
                ids.add(json.loads(line[5:])["id"])
        else:
            ids.add(json.loads(r.read())["id"])
    last = time.time()
    (rid,) = ids
    return {"id": rid, "sent": sent, "first": first or last, "last": last}


def _client_spans(calls: list[tuple[int, dict]]) -> bytes:
    """The callers' CLIENT spans (as our openai instrumentation records them: the response id the client got) in
    the trace and under the span id their ``traceparent`` named, encoded as one export request."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="caller")))
    ss = rs.scope_spans.add()
    for i, c in calls:
        span = ss.spans.add(trace_id=bytes.fromhex(TRACE), span_id=(i + 1).to_bytes(8, "big"),
                            name="text_completion", kind=Span.SPAN_KIND_CLIENT,
                            start_time_unix_nano=int(c["sent"] * 1e9), end_time_unix_nano=int(c["last"] * 1e9))
        span.attributes.append(KeyValue(key=sc.RESPONSE_ID, value=AnyValue(string_value=c["id"])))
    return req.SerializeToString()


def _prometheus(url: str) -> dict[str, float]:
    """A Prometheus text page's unlabelled sums per series name (labels dropped, values added)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0].strip()
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return out


@pytest.mark.skipif(_binary() is None, reason="the vllm-rs binary of the tested release is not here "
                    "(scripts/setup.sh extracts it into .cache/vllm-rs)")
@pytest.mark.parametrize("dp", [1, 2])
def test_rust_frontend_requests_are_traced_from_the_engine_core(dp: int, tmp_path):
    env = {"VLLM_USE_RUST_FRONTEND": "1", "VLLM_RUST_FRONTEND_PATH": _binary(), "OTEL_LLM_BASELINE_DETAIL": "steps",
           "OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "500"}
    # data parallelism runs on the CPU build: two EngineCores, both their requests' source, one agent
    extra = ("--data-parallel-size", str(dp)) if dp > 1 else ()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(OTLPSink())
        gateway = stack.enter_context(GatewayProcess(tmp_path, sink.endpoint)) if dp == 1 else None
        if gateway is not None:  # the traces through the real gateway; the metrics straight to the sink
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = gateway.traces_endpoint
        s = stack.enter_context(VLLMServer(otlp_endpoint=sink.endpoint, env=env, cli=True, extra_args=extra))
        seen = []
        for i, stream in enumerate((True, False, True, False)):
            prompt = [3 + (i * 7 + j) % 400 for j in range(24 + 40 * (i % 2))]
            seen.append(_complete(s.base_url, s.model, prompt, stream, f"00-{TRACE}-{i + 1:016x}-01"))
        # the callers of the first two (one streamed, one not) traced their calls; the other two callers did not
        callers = {c["id"]: f"{i + 1:016x}" for i, c in enumerate(seen[:2])} if gateway is not None else {}
        if gateway is not None:
            assert gateway.export(_client_spans(list(enumerate(seen[:2])))) == 200

        def ready(spans):
            return sum(x.kind == "SERVER" for x in spans) == len(seen)
        spans = sink.wait_for(ready, timeout=60)
        joined = gateway.counter("trace_join_joined") if gateway is not None else 0
        theirs = _prometheus(s.base_url.rsplit("/v1", 1)[0] + "/metrics")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # cumulative: the last export holds every request
            points = sink.metric_points(_metric("e2e"))
            if points and points[-1].count == len(seen):
                break
            time.sleep(0.2)
    servers = [x for x in spans if x.kind == "SERVER"]
    assert len(servers) == len(seen), s.log_tail()
    by_id = {}
    for x in servers:
        response_id = x.attributes[sc.RESPONSE_ID]
        # external_req_id under vllm-rs 0.32.0: exactly the id the client got (no prompt index appended)
        match = [c for c in seen if response_id == c["id"]]
        assert len(match) == 1, (response_id, [c["id"] for c in seen])
        by_id[match[0]["id"]] = x
    steps = [x for x in spans if x.name == sc.SPAN_ENGINE_STEP]
    for c in seen:
        x = by_id[c["id"]]
        if c["id"] in callers:  # joined at the gateway: one trace with its caller's client span
            assert x.trace_id == TRACE and x.parent_span_id == callers[c["id"]]
            assert any(y.kind == "CLIENT" and y.span_id == x.parent_span_id and y.trace_id == TRACE for y in spans)
        else:  # vllm-rs forwards no trace headers to the engine (vLLM's RFC #44757): each request is its own trace
            assert x.parent_span_id == "" and x.trace_id != TRACE
        children = {y.name for y in spans if y.parent_span_id == x.span_id}
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} <= children
        assert any((x.trace_id, x.span_id) in y.links for y in steps)
        # a request cannot start before the client sent it nor finish after its last chunk
        assert c["sent"] - 0.002 <= x.start_ns / 1e9 and x.end_ns / 1e9 <= c["last"] + 0.002
        ttft, e2e = x.attributes[ATTRIBUTE_OF_FIELD["ttft"]], x.attributes[ATTRIBUTE_OF_FIELD["e2e"]]
        assert 0 < ttft <= e2e <= c["last"] - c["sent"] + 0.002
        assert ttft <= c["first"] - c["sent"] + 0.002
        assert x.attributes[sc.USAGE_OUTPUT_TOKENS] == MAX_TOKENS
    assert joined == len(callers)
    # 100 % of requests in the metrics (cumulative histograms: the last export holds them all)
    assert points and points[-1].count == len(seen)
    ttft_points = sink.metric_points(_metric("ttft"))
    assert ttft_points and ttft_points[-1].count == len(seen)
    # vllm-rs's own histograms: the same requests; ours end where the engine let them go, before vllm-rs got
    # the output (TTFT: the engine's step end against vllm-rs's receipt of the first token), so never longer
    ours = {"e2e": sum(x.attributes[ATTRIBUTE_OF_FIELD["e2e"]] for x in servers),
            "ttft": sum(x.attributes[ATTRIBUTE_OF_FIELD["ttft"]] for x in servers)}
    for field, name in (("e2e", "vllm:e2e_request_latency_seconds"), ("ttft", "vllm:time_to_first_token_seconds")):
        assert theirs.get(name + "_count") == len(seen), (name, sorted(theirs))
        assert ours[field] <= theirs[name + "_sum"] + 0.001 * len(seen), (field, ours[field], theirs[name + "_sum"])
