"""OpenInference attributes for Phoenix: span kinds on our spans, the verdict in the request's metadata,
nothing added to a span that is not ours; the processor never raises into the host."""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import semconv as sc
from otel_llm.views.phoenix import METADATA, SPAN_KIND, OpenInferenceSpans, openinference_attributes


def test_request_spans_are_llm_spans_with_the_verdict_first_in_their_metadata() -> None:
    a = {sc.LATENCY_E2E: 2.0, sc.RESPONSE_MODEL: "tiny", sc.USAGE_INPUT_TOKENS: 40, sc.USAGE_OUTPUT_TOKENS: 10,
         sc.SLOW_CAUSE: sc.SLOW_QUEUE_MAX_SEQS, sc.SLOW_SECONDS[sc.SLOW_QUEUE_MAX_SEQS]: 1.25,
         sc.SLO_BREACHED: ("ttft",), sc.SLO_TTFT: 0.25, sc.SLO_TPOT: 0.05, sc.SAMPLING_REASON: "slo_breach:ttft"}
    out = openinference_attributes("chat tiny", a)
    assert out[SPAN_KIND] == "LLM" and out["llm.model_name"] == "tiny" and out["llm.token_count.total"] == 50
    meta = json.loads(out[METADATA])
    assert list(meta)[0] == "slow_cause" and meta == {"slow_cause": "queue_max_seqs", "slow_seconds": 1.25,
                                                      "slo_breached": ["ttft"], "slo": {"ttft": 0.25},
                                                      "kept_for": "slo_breach:ttft"}
    for name in (sc.SPAN_QUEUE, sc.SPAN_DECODE_STEP, sc.SPAN_ENGINE_STEP):
        assert openinference_attributes(name, {}) == {SPAN_KIND: "CHAIN"}
    assert openinference_attributes("GET /health", {"http.method": "GET"}) == {}


def test_the_processor_marks_spans_as_they_start() -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(OpenInferenceSpans())
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    tracer.start_span("chat tiny", attributes={sc.LATENCY_E2E: 1.0, sc.SLOW_CAUSE: "preemption"}).end()
    tracer.start_span(sc.SPAN_PREFILL).end()
    tracer.start_span("unrelated").end()
    kinds = [(s.name, (s.attributes or {}).get(SPAN_KIND)) for s in memory.get_finished_spans()]
    assert kinds == [("chat tiny", "LLM"), (sc.SPAN_PREFILL, "CHAIN"), ("unrelated", None)]


def test_a_span_it_cannot_read_is_left_alone() -> None:
    class Odd:
        name = "chat"

        @property
        def attributes(self):
            raise RuntimeError("no attributes here")

    OpenInferenceSpans().on_start(Odd())  # no exception reaches the host
