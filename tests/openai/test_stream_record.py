"""Unit tier, no server: the chunk record's gap profile and the stream proxy's end-exactly-once contract,
over real ``openai`` chunk objects and a real SDK tracer and meter."""

from __future__ import annotations

import gc
import math
from typing import Any, Iterator

import pytest
from openai.types.chat import ChatCompletionChunk
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_llm.core.client_metrics import ClientMetrics
from otel_llm.core.config import Config
from otel_llm.guard import Guard
from otel_llm.instrumentation.openai.ops import Chat
from otel_llm.instrumentation.openai.record import CallRecord
from otel_llm.instrumentation.openai.stream import StreamProxy
from otel_llm.instrumentation.openai.wrappers import ClientState


def chunk(text: str | None, finish: str | None = None, usage: dict | None = None) -> ChatCompletionChunk:
    choices = [] if usage else [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]
    return ChatCompletionChunk.model_validate({"id": "c1", "object": "chat.completion.chunk", "created": 0,
                                               "model": "m", "choices": choices, "usage": usage})


CHUNKS = [chunk(""), chunk("Hello"), chunk(" wor"), chunk("ld", "length"),
          chunk(None, usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})]


@pytest.fixture
def setup() -> Iterator[tuple[ClientState, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"slo": "tpot=0.01"})
    metrics = ClientMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t"), config.slo)
    yield ClientState(config, tp.get_tracer("t"), metrics, Guard()), exporter


def record(t: ClientState) -> CallRecord:
    return CallRecord(t, t.tracer.start_span("chat m"), "chat", "m", True, ("h", 1), 0, False)


def test_gap_profile_counts_every_output_chunk(setup: Any) -> None:
    """Every output chunk is timed, with content or not (the conventions' chunk, ``vllm bench serve``'s);
    lifecycle events (-1) are not; the first chunk with content is stamped apart."""
    t, _ = setup
    rec = record(t)
    for now, n in [(0.9, -1), (1.0, 0), (1.1, 5), (1.105, -1), (1.108, 4), (1.15, 2)]:
        rec.chunk(now, n)
    assert (rec.first, rec.first_content, rec.last, rec.n, rec.chars) == (1.0, 1.1, 1.15, 4, 11)
    assert rec.max_gap == pytest.approx(0.1) and rec.over == 2  # 8 ms is under the 10 ms SLO; 100 and 42 ms over
    assert record(ClientState(Config(), t.tracer, ClientMetrics(
        MeterProvider().get_meter("x"), Config().slo), Guard())).tpot_limit == math.inf  # no SLO: nothing is "over"


def test_exhausted_stream_ends_once_with_usage(setup: Any) -> None:
    t, exporter = setup
    proxy = StreamProxy((c for c in CHUNKS), record(t), Chat.chunk)
    assert list(proxy) == CHUNKS  # the caller's chunks, unchanged
    proxy.close()
    del proxy
    gc.collect()
    (span,) = exporter.get_finished_spans()
    a = span.attributes
    assert a["llm.client.stream.end"] == "complete" and a["llm.client.chunks"] == 4  # the usage chunk is not one
    assert a["llm.client.output_characters"] == len("Hello world")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (5, 3)
    assert a["gen_ai.response.finish_reasons"] == ("length",) and a["gen_ai.response.id"] == "c1"


def test_dropped_stream_is_abandoned_once(setup: Any) -> None:
    t, exporter = setup
    proxy = StreamProxy(iter(CHUNKS), record(t), Chat.chunk)
    next(proxy), next(proxy)
    del proxy  # never closed, never drained
    gc.collect()
    (span,) = exporter.get_finished_spans()
    assert span.attributes["llm.client.stream.end"] == "abandoned"
    assert span.status.status_code == StatusCode.UNSET


def test_error_while_reading_is_an_error_span(setup: Any) -> None:
    t, exporter = setup

    def broken() -> Iterator[ChatCompletionChunk]:
        yield CHUNKS[1]
        raise TimeoutError("read timed out")

    proxy = StreamProxy(broken(), record(t), Chat.chunk)
    with pytest.raises(TimeoutError):
        list(proxy)
    proxy.close()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "TimeoutError" and span.attributes["llm.client.stream.end"] == "error"


def test_instrumentation_error_never_reaches_the_caller(setup: Any) -> None:
    t, exporter = setup

    def bad_reader(rec: CallRecord, c: Any, now: float) -> None:
        raise RuntimeError("bug in our chunk reader")

    proxy = StreamProxy(iter(CHUNKS), record(t), bad_reader)
    assert list(proxy) == CHUNKS
    assert t.guard.errors["openai stream chunk"] == len(CHUNKS)  # in the owner's guard
    (span,) = exporter.get_finished_spans()
    assert span.attributes["llm.client.stream.end"] == "complete"


def test_instrument_uninstrument_idempotent(client_side: Any) -> None:
    import wrapt
    from openai.resources.chat.completions.completions import AsyncCompletions, Completions
    from openai.resources.completions import Completions as TextCompletions
    from openai.resources.responses.responses import Responses

    from otel_llm.instrumentation.openai import OpenAIInstrumentor

    targets = [(Completions, "create"), (AsyncCompletions, "create"), (TextCompletions, "create"),
               (Responses, "create")]
    inst = OpenAIInstrumentor()  # BaseInstrumentor is a singleton: the session fixture's instance
    inst.uninstrument()
    inst.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    inst.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())  # no-op
    try:
        assert all(isinstance(owner.__dict__[name], wrapt.FunctionWrapper) for owner, name in targets)
    finally:
        inst.uninstrument()
        inst.uninstrument()  # no-op
    try:
        assert not any(isinstance(owner.__dict__[name], wrapt.FunctionWrapper) for owner, name in targets)
    finally:
        client_side.reinstrument()  # as the session fixture left it


def test_our_failure_before_the_call_leaves_the_call_as_the_caller_made_it(setup: Any) -> None:
    import openai

    from otel_llm.instrumentation.openai.wrappers import OpenAIWrappers

    t, exporter = setup
    t.config = Config.resolve({"capture_content": "true"})

    class Broken(Chat):
        @staticmethod
        def capture_input(rec: CallRecord, kwargs: dict) -> None:
            raise RuntimeError("bug in our capture")

    seen: list[dict] = []

    def create(**kwargs: Any) -> str:
        seen.append(kwargs)
        return "result"

    resource = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x").chat.completions
    kwargs = {"model": "m", "messages": [], "extra_headers": {"x-a": "1"}}
    assert OpenAIWrappers(t, (openai.Stream, openai.AsyncStream)).sync(Broken)(create, resource, (), kwargs) == "result"
    assert seen == [kwargs]  # no traceparent added: the arguments as the caller gave them
    assert t.guard.errors["openai chat (before)"] == 1
    (span,) = exporter.get_finished_spans()  # the started span is ended, not leaked


def test_time_per_output_chunk_is_one_value_per_chunk_after_the_first(setup: Any) -> None:
    """The conventions' histogram: every gap between chunks of a successful stream, bucketed when the
    stream ends and added in one call; the span keeps the per-stream mean."""
    from opentelemetry.sdk.metrics import MeterProvider as Provider

    from otel_llm.core.client_metrics import TIME_PER_OUTPUT_CHUNK

    t, exporter = setup
    reader = InMemoryMetricReader()
    t = ClientState(t.config, t.tracer, ClientMetrics(Provider(metric_readers=[reader]).get_meter("t"), t.config.slo),
                    t.guard)
    stamps = [1.0, 1.004, 1.03, 1.2, 1.2005]
    for ok in (True, False):
        rec = record(t)
        for now in stamps:
            rec.chunk(now, 1)
        rec.finish("complete" if ok else "error", None if ok else RuntimeError("cut"), at=1.3)
    (metric,) = [m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics if m.name == TIME_PER_OUTPUT_CHUNK.name]
    (point,) = metric.data.data_points
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    bounds = list(TIME_PER_OUTPUT_CHUNK.buckets)
    expected = [0] * (len(bounds) + 1)
    for g in gaps:  # a value belongs to the first bucket whose boundary is >= it
        expected[next((i for i, b in enumerate(bounds) if g <= b), len(bounds))] += 1
    assert point.count == len(stamps) - 1  # the failed stream adds nothing
    assert list(point.bucket_counts) == expected
    assert point.sum == pytest.approx(sum(gaps)) and point.max == pytest.approx(max(gaps))
    spans = exporter.get_finished_spans()
    assert spans[0].attributes["llm.client.time_per_output_chunk"] == pytest.approx(sum(gaps) / len(gaps))
