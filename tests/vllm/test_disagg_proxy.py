"""The example disaggregation proxy against stand-in instances (httpx's mock transport): what it sends
to P and to D, what it streams back, and the trace it makes. The real instances: test_vllm_disagg_serve."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.testclient import TestClient

from otel_llm import semconv as sc

PROXY = Path(__file__).resolve().parents[2] / "examples" / "disagg_proxy.py"
P, D = "http://10.0.0.5:8100", "http://10.0.0.6:8200"
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _proxy_module():
    spec = importlib.util.spec_from_file_location("disagg_proxy", PROXY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(p_status: int = 200):
    seen: list[tuple[str, dict, dict]] = []

    def instance(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((str(request.url), body, dict(request.headers)))
        if request.url.port == 8100:
            return httpx.Response(p_status, json={"choices": [{"text": "x"}], "kv_transfer_params": {"remote": "p0"}})
        return httpx.Response(200, content=b"data: {\"choices\": [{\"text\": \"a\"}]}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    proxy = _proxy_module().DisaggProxy(P, D, provider.get_tracer("t"), transport=httpx.MockTransport(instance))
    with TestClient(proxy.app()) as client:
        r = client.post("/v1/completions", headers={"traceparent": CALLER},
                        json={"model": "m", "prompt": "hi", "max_tokens": 16, "stream": True,
                              "stream_options": {"include_usage": True}})
    return r, seen, {s.name.split()[0]: s for s in exporter.get_finished_spans()}


def test_prefill_gets_one_token_then_decode_the_whole_request_with_ps_kv_parameters():
    r, seen, _ = _run()
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    (p_url, p_body, _), (d_url, d_body, _) = seen
    assert p_url == f"{P}/v1/completions" and d_url == f"{D}/v1/completions"
    assert p_body["max_tokens"] == 1 and p_body["stream"] is False and "stream_options" not in p_body
    assert d_body["max_tokens"] == 16 and d_body["stream"] is True
    assert d_body["kv_transfer_params"] == {"remote": "p0"}


def test_one_trace_under_the_callers_span_each_instance_under_its_hop():
    _, seen, spans = _run()
    router, prefill, decode = spans["router"], spans["prefill"], spans["decode"]
    assert router.kind is SpanKind.SERVER and f"{router.context.trace_id:032x}" == CALLER.split("-")[1]
    assert router.parent.span_id == int(CALLER.split("-")[2], 16)
    for hop, (_, _, headers), port in ((prefill, seen[0], 8100), (decode, seen[1], 8200)):
        assert hop.kind is SpanKind.CLIENT and hop.parent.span_id == router.context.span_id
        assert hop.attributes[sc.SERVER_PORT] == port
        # the instance's request span goes under this hop
        assert headers["traceparent"].split("-")[2] == f"{hop.context.span_id:016x}"
    assert prefill.attributes[sc.DISAGG_HOP] == sc.DISAGG_ROLE_PREFILL
    assert prefill.end_time <= decode.start_time
    assert 0 < router.attributes[sc.DISAGG_TTFT] <= router.attributes[sc.DISAGG_E2E]


def test_a_failed_prefill_is_the_users_answer_and_an_error_on_the_router():
    r, seen, spans = _run(p_status=503)
    assert r.status_code == 503 and len(seen) == 1  # D never asked
    assert spans["router"].status.status_code is StatusCode.ERROR


def test_a_body_that_is_not_an_object_is_refused_clearly():
    proxy = _proxy_module().DisaggProxy(P, D, TracerProvider().get_tracer("t"),
                                        transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    with TestClient(proxy.app()) as client:
        r = client.post("/v1/completions", content=b"[1, 2]")
    assert r.status_code == 400 and "not a JSON object" in r.json()["error"]["message"]
