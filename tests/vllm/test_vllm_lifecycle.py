"""instrument/uninstrument, and faults: telemetry never changes what vLLM computes or breaks the process."""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

import otel_llm
from otel_llm.core.pipeline import Pipeline
from otel_llm.instrumentation.vllm import VLLMInstrumentor
from otel_llm.instrumentation.wraps import _resolve, is_ours, is_wrapped
from support.traces import request_trees

pytestmark = pytest.mark.engine

PROMPTS = [{"prompt_token_ids": [7 + (i * 11 + j) % 300 for j in range(8 + 9 * i)]} for i in range(8)]


def _tokens(llm) -> list[list[int]]:
    from vllm import SamplingParams

    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _targets(table):
    import importlib

    from vllm.v1.core.sched.scheduler import Scheduler

    for t in table.targets:
        try:
            yield _resolve(importlib.import_module(t.module), t.name)
        except (ImportError, AttributeError):
            continue
    yield Scheduler, "schedule"
    yield Scheduler, "update_from_output"


@contextlib.contextmanager
def _with_provider(provider: TracerProvider, **options) -> Iterator[None]:
    otel_llm.uninstrument()
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider(), sample_rate=1.0, **options)
    try:
        yield
    finally:
        otel_llm.uninstrument()


@pytest.fixture(scope="module")
def reference(llm) -> list[list[int]]:
    otel_llm.uninstrument()
    return _tokens(llm)


def test_instrument_is_idempotent_and_uninstrument_removes_every_patch(llm, otel, reference):
    # the test's meter provider: one built from OTEL_* would export to localhost:4318 and retry at exit
    providers = {"tracer_provider": otel.tracer_provider, "meter_provider": otel.meter_provider}
    assert "vllm" in otel_llm.instrument(**providers, sample_rate=1.0)
    first = VLLMInstrumentor().telemetry
    otel_llm.instrument(**providers, sample_rate=0.0)  # a second call changes nothing
    assert VLLMInstrumentor().telemetry is first
    table = VLLMInstrumentor().instrumentation.table  # this instrumentation's (it goes with uninstrument)
    wrapped = [(o, a) for o, a in _targets(table) if is_wrapped(o, a)]
    assert len(wrapped) >= 6
    for owner, attr in wrapped:  # wrapped once, not twice
        assert not is_ours(owner.__dict__[attr].__wrapped__)
    otel_llm.uninstrument()
    otel_llm.uninstrument()  # harmless when nothing is instrumented
    assert [(o, a) for o, a in _targets(table) if is_wrapped(o, a)] == []
    assert "vllm" not in otel_llm.instrumented()
    otel.spans.clear()
    assert _tokens(llm) == reference
    assert otel.finished() == []


class Raising(SpanExporter):
    def export(self, spans):
        raise RuntimeError("collector is on fire")


class Hanging(SpanExporter):
    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans):
        self.release.wait(60)
        return SpanExportResult.SUCCESS


def test_an_exporter_that_raises_changes_nothing(llm, reference):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Raising()))
    with _with_provider(provider):
        assert _tokens(llm) == reference


@pytest.mark.parametrize("processor", ["batch", "simple"])
def test_an_exporter_that_hangs_changes_nothing(llm, reference, processor):
    """Behind the SDK's batch processor, or even a synchronous one: the engine never waits for it."""
    hanging = Hanging()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(hanging, max_queue_size=64, max_export_batch_size=8)
                                if processor == "batch" else SimpleSpanProcessor(hanging))
    try:
        with _with_provider(provider, baseline_detail="steps"):
            assert _tokens(llm) == reference  # spans wait on our thread or are dropped, the engine goes on
            assert _tokens(llm) == reference
            assert VLLMInstrumentor().telemetry.counts.requests_finished == 2 * len(PROMPTS)
    finally:
        hanging.release.set()
        provider.shutdown()


def test_an_exception_inside_the_adapter_changes_nothing(llm, otel, reference, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("bug in otel-llm")

    # where a finish is handed over: vLLM's finish hook (token times from steps), or process_outputs (stamps)
    sites = ("OutputProcessor._update_stats_from_finished", "OutputProcessor.process_outputs")
    guard = VLLMInstrumentor().guard  # the instrumentor's, kept for the process
    before = sum(guard.errors[s] for s in sites)
    with otel.instrumented(sample_rate=1.0):
        monkeypatch.setattr(Pipeline, "finish", broken)
        assert _tokens(llm) == reference
        monkeypatch.undo()
        assert sum(guard.errors[s] for s in sites) > before  # counted, not raised
        shown = otel_llm.stats()["errors"]
        assert all(shown.get(s, 0) == guard.errors[s] for s in sites)  # and shown by stats()
        # and the process is healthy: the next requests are traced normally
        otel.spans.clear()
        assert _tokens(llm) == reference
        assert len(request_trees(otel.finished())) == len(PROMPTS)
