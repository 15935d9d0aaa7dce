"""Deferred step reading (``step_reading="deferred"``): the background thread reads the engine's step records
in bulk instead of vLLM's output thread reading them at every output batch. A request may then finish
before its last steps are read; what it is told about its steps must not change."""

from __future__ import annotations

import threading
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.core.config import Config
from otel_llm.guard import Guard
from otel_llm.core.materializer import Materializer
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestShare, RequestTimeline, StepRecord


class StepSource:
    """A step receiver's ``drain`` as the pipeline calls it: hands over what the engine wrote so far."""

    def __init__(self) -> None:
        self.waiting: list[StepRecord] = []
        self.reads = 0
        self.fail = False

    def __call__(self, deliver) -> None:
        self.reads += 1
        if self.fail:
            raise RuntimeError("a ring that makes no sense")
        batch, self.waiting = self.waiting, []
        for step in batch:
            deliver(step)


def _pipeline(step_reading: str) -> tuple[Pipeline, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"sample_rate": 1.0, "tail_quantile": 0, "baseline_detail": "steps",
                             "step_reading": step_reading}, environ={})
    return Pipeline(config, tp.get_tracer("t"), MeterProvider().get_meter("t"), "test"), exporter


def _serve(pipeline: Pipeline, deliver, finish_before_last_step: bool) -> None:
    """Two requests: ``a`` prefills in two chunks and decodes 6 tokens beside ``b``. Steps are handed to
    ``deliver``; with ``finish_before_last_step`` the requests finish before their last steps are read."""
    base = time.monotonic() - 10.0
    timelines = {}
    for rid in ("a", "b"):
        t = RequestTimeline(rid, time.time() - 10.0, model="m", response_id=rid, input_tokens=40)
        t.events += [(QUEUED, base), (SCHEDULED, base + 0.01)]
        assert pipeline.start(t)
        timelines[rid] = t
    clock = base + 0.01
    steps = []
    for i, shares in enumerate([[("a", 32, True), ("b", 8, True)], [("a", 8, True), ("b", 1, False)]]
                               + [[("a", 1, False), ("b", 1, False)]] * 6):
        steps.append(StepRecord(100 + i, clock, clock + 0.02, [RequestShare(*s) for s in shares], running=2))
        clock += 0.025
        for rid, _, prefill in shares:
            if not prefill or rid == "a" and i == 1:
                timelines[rid].token_ts.append(clock)
    held_back = steps[-3:] if finish_before_last_step else []
    for step in steps[:len(steps) - len(held_back)]:
        deliver(step)
    # The engine writes a step's record before its outputs leave, so the last steps are in the ring (not yet
    # read: deferred reading reads them on the background thread) before the requests finish. Handing them
    # over after ``finish`` would model an order the engine never produces, and race the background thread.
    for step in held_back:
        deliver(step)
    for rid, t in timelines.items():
        first, last = t.token_ts[0], t.token_ts[-1]
        pipeline.finish(rid, RequestSummary(model="m", ttft=first - base, e2e=last - base, queue=0.01,
                                            prefill=first - base - 0.01, decode=last - first,
                                            output_tokens=len(t.token_ts), input_tokens=40))
        t.finish_reason = "length"


def _shape(spans) -> list[tuple]:
    """What the trace says, without ids and clocks: names, parents' names, and the step ids linked."""
    by_id = {s.context.span_id: s for s in spans}
    out = []
    for s in spans:
        parent = by_id.get(s.parent.span_id).name if s.parent is not None and s.parent.span_id in by_id else None
        attrs = tuple(sorted((k, v if not isinstance(v, (list, tuple)) else tuple(v)) for k, v in (s.attributes or {}).items()
                             if "id" not in k and "time" not in k))
        out.append((s.name, parent, len(s.links), attrs))
    return sorted(out, key=repr)


def test_deferred_reading_tells_requests_what_reading_on_the_output_thread_does():
    drained, drained_spans = _pipeline("drain")
    _serve(drained, drained.add_step, finish_before_last_step=False)
    assert drained.flush(10)

    deferred, deferred_spans = _pipeline("deferred")
    source = StepSource()
    deferred.read_steps_from(source)
    # the engine's records wait in the ring; the last ones are written after the requests finished
    _serve(deferred, source.waiting.append, finish_before_last_step=True)
    assert deferred.flush(10)

    assert source.reads >= 1 and not source.waiting
    assert deferred.counts.steps_recorded == drained.counts.steps_recorded == 8
    assert deferred.counts.requests_kept == drained.counts.requests_kept == 2
    assert _shape(deferred_spans.get_finished_spans()) == _shape(drained_spans.get_finished_spans())
    assert not deferred.requests and not deferred.steps  # everything settled and released
    drained.close()
    deferred.close()


def test_a_failing_step_source_costs_steps_only():
    pipeline, exporter = _pipeline("deferred")
    source = StepSource()
    source.fail = True
    pipeline.read_steps_from(source)
    _serve(pipeline, source.waiting.append, finish_before_last_step=True)
    assert pipeline.flush(10)
    assert pipeline.guard.errors["step receiver (deferred)"] > 0  # counted, never raised into the engine's thread
    assert pipeline.counts.requests_finished == 2 and pipeline.counts.requests_kept == 2  # spans and metrics
    assert pipeline.counts.steps_recorded == 0
    pipeline.close()


def test_the_background_thread_reads_while_no_request_finishes():
    """With nothing submitted the materializer still calls its idle work (the ring must not fill while long
    requests run): waited for, not timed."""
    called = threading.Event()
    m = Materializer(lambda job: None, Guard(), idle=called.set, idle_s=0.01)
    assert m.submit(object())  # starts the thread
    assert called.wait(30)
    m.close()


def test_an_idle_callback_that_raises_is_counted_and_the_thread_keeps_working():
    done = threading.Event()
    guard = Guard()

    def idle():
        raise RuntimeError("boom")

    m = Materializer(lambda job: done.set(), guard, idle=idle, idle_s=0.001)
    assert m.submit(object())
    assert done.wait(30)
    deadline = time.monotonic() + 30
    while not guard.errors["background idle work"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert guard.errors["background idle work"] > 0
    done.clear()
    assert m.submit(object()) and done.wait(30)
    m.close()


def test_step_reading_is_checked():
    import pytest

    with pytest.raises(ValueError, match="drain, deferred"):
        Config.resolve({"step_reading": "lazy"}, environ={})
    assert Config.resolve({}, environ={}).step_reading == "drain"
    assert Config.resolve({}, environ={"OTEL_LLM_STEP_READING": "deferred"}).step_reading == "deferred"



def test_only_deferred_reading_wakes_the_background_thread_while_nothing_is_submitted():
    """Each idle wake-up costs CPU the host pays per second, whatever its token rate: the default mode sleeps."""
    drained, _ = _pipeline("drain")
    deferred, _ = _pipeline("deferred")
    assert drained.materializer._idle is None
    assert deferred.materializer._idle is not None
    drained.close()
    deferred.close()
