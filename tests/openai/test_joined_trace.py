"""Issue 4 acceptance 1 and 2, issue 2 acceptance 6: one trace from the caller through ``vllm serve``.

Both processes export over OTLP/HTTP to the same in-test receiver: the client with no
OpenTelemetry set-up beyond ``otel_llm.instrument()`` (the example's client script), the
server with ``opentelemetry-instrument`` and our ``vllm`` entry point.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import urllib.request
import json
from pathlib import Path
from typing import Any

from otel_llm import semconv as sc
from support.otlp_sink import OTLPSink, SinkSpan
from support.server import VLLMServer

import openai

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "client_server" / "client.py"
PHASES = {"llm.queue", "llm.prefill", "llm.decode"}


def server_span_of(sink: OTLPSink, trace_id: str, parent_span_id: str) -> tuple[SinkSpan, list[SinkSpan]]:
    """The server's request span under ``parent_span_id``, and its children, once exported."""
    def ready(spans: list[SinkSpan]) -> bool:
        roots = [s for s in spans if s.kind == "SERVER" and s.parent_span_id == parent_span_id]
        return bool(roots) and PHASES <= {s.name for s in spans if s.parent_span_id == roots[0].span_id}
    spans = sink.wait_for(ready, timeout=30, trace_id=trace_id)
    roots = [s for s in spans if s.kind == "SERVER" and s.parent_span_id == parent_span_id]
    assert len(roots) == 1, [(s.name, s.kind, s.parent_span_id) for s in spans]
    return roots[0], [s for s in spans if s.parent_span_id == roots[0].span_id]


def test_one_trace_from_client_through_server_to_engine_phases(sink: OTLPSink, server: VLLMServer) -> None:
    env = {**os.environ, "OTEL_SERVICE_NAME": "example-client", "OTEL_TRACES_EXPORTER": "otlp",
           "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_LLM_ENGINE_STEPS": "false"}
    run = subprocess.run([sys.executable, str(EXAMPLE), "--base-url", server.base_url, "--requests", "2",
                          "--max-tokens", "8"], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    clients = sink.wait_for(lambda ss: len([s for s in ss if s.service == "example-client"]) >= 2)
    clients = [s for s in clients if s.service == "example-client"]
    assert len(clients) == 2 and len({c.trace_id for c in clients}) == 2
    for c in clients:
        assert c.kind == "CLIENT" and c.parent_span_id == "" and c.name == f"chat {server.model}"
        root, children = server_span_of(sink, c.trace_id, c.span_id)
        assert root.service == "vllm-server" and root.service != c.service  # two processes, two exporters
        assert root.name == f"chat {server.model}"
        assert PHASES <= {s.name for s in children}
        # the server's work lies within the client's call (1 ms: the two wall clocks are one machine's)
        assert c.start_ns - 1_000_000 <= root.start_ns and root.end_ns <= c.end_ns + 1_000_000


def test_incoming_traceparent_parents_the_server_span(sink: OTLPSink, server: VLLMServer) -> None:
    """Issue 2, acceptance 6: any W3C caller (here a bare HTTP request, no client instrumentation)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    body = json.dumps({"model": server.model, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{server.base_url}/chat/completions", data=body, method="POST", headers={
        "Content-Type": "application/json", "traceparent": f"00-{trace_id}-{span_id}-01"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
    root, children = server_span_of(sink, trace_id, span_id)
    assert root.kind == "SERVER" and root.trace_id == trace_id
    assert all(s.trace_id == trace_id for s in children)


def test_client_ttft_covers_server_ttft(client: Any, sink: OTLPSink, server: VLLMServer) -> None:
    """Acceptance 2: for every request the client's TTFT >= the server's; the difference is reported."""
    c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    for i in range(6):
        for _ in c.chat.completions.create(model=server.model, stream=True, max_tokens=16,
                                           messages=[{"role": "user", "content": f"request {i} " * (i + 1)}]):
            pass
    overheads = []
    for span in client.finished():
        ctx = span.get_span_context()
        root, _ = server_span_of(sink, f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
        # transport + serving overhead: the client's first chunk minus the engine's first token (the
        # collector's ttft_join records the same difference as llm.client.overhead.time_to_first_chunk)
        overhead = span.attributes[sc.RESPONSE_TIME_TO_FIRST_CHUNK] - root.attributes[sc.LATENCY_TTFT]
        assert overhead >= 0, (span.attributes, root.attributes)
        overheads.append(overhead)
    assert len(overheads) == 6
    print("\nclient TTFT - server TTFT (transport + serving overhead), ms:",
          ", ".join(f"{o * 1e3:.2f}" for o in overheads))
