"""Token times from steps (wherever the steps can give them): a request finished with no token stamps, only
vLLM's own first and last token stamps and count, is told what a stamped one is: the same inter-token
latencies, the same spans. And one whose steps do not add up is counted, not guessed."""

from __future__ import annotations

import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.core.config import Config
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.step_tokens import TokenWindow
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestShare, RequestTimeline, StepRecord

PROMPTS = {"a": 40, "b": 8}


def _pipeline() -> tuple[Pipeline, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"sample_rate": 1.0, "tail_quantile": 0, "baseline_detail": "steps"}, environ={})
    return Pipeline(config, tp.get_tracer("t"), MeterProvider().get_meter("t"), "test"), exporter


def _serve(pipeline: Pipeline, stamped: bool, lose: int | None = None, base: float = 0.0,
           arrival: float = 0.0) -> dict[str, RequestSummary]:
    """``a`` prefills in two chunks, ``b`` in one, then both decode; the steps end at the outputs' stamp (as
    vLLM's do). Stamped: the hot path's stamps; else only what vLLM's RequestStateStats says at finish."""
    base = base or time.monotonic() - 10.0
    timelines = {}
    for rid, prompt in PROMPTS.items():
        t = RequestTimeline(rid, arrival or time.time() - 10.0, model="m", response_id=rid, input_tokens=prompt)
        t.events += [(QUEUED, base), (SCHEDULED, base + 0.01)]
        assert pipeline.start(t)
        timelines[rid] = t
    stamps: dict[str, list[float]] = {rid: [] for rid in PROMPTS}
    clock = base + 0.01
    plan = [[("a", 32, True, 0), ("b", 8, True, 0)], [("a", 8, True, 32), ("b", 1, False, 8)]]
    plan += [[("a", 1, False, 40 + k), ("b", 1, False, 9 + k)] for k in range(6)]
    for i, shares in enumerate(plan):
        step = StepRecord(100 + i, clock, clock + 0.02 + 0.003 * i, [RequestShare(*s[:3]) for s in shares], running=2)
        step.contexts = [s[3] for s in shares]
        clock = step.end
        for rid, n, prefill, context in shares:
            if not prefill or context + n >= PROMPTS[rid]:
                stamps[rid].append(step.end)
        if i != lose:
            pipeline.add_step(step)
    summaries = {}
    for rid, t in timelines.items():
        ts = stamps[rid]
        if stamped:
            t.token_ts = list(ts)
        else:
            t.steps_give_tokens = True
            t.token_window = TokenWindow(ts[0], ts[-1], len(ts), PROMPTS[rid])
        s = summaries[rid] = RequestSummary(model="m", ttft=ts[0] - base, e2e=ts[-1] - base, queue=0.01,
                                            prefill=ts[0] - base - 0.01, decode=ts[-1] - ts[0],
                                            output_tokens=len(ts), input_tokens=PROMPTS[rid])
        t.finish_reason = "length"
        pipeline.finish(rid, s)
    assert pipeline.flush(10)
    return summaries


def _shape(spans) -> list[tuple]:
    by_id = {s.context.span_id: s for s in spans}
    out = []
    for s in spans:
        parent = by_id.get(s.parent.span_id).name if s.parent is not None and s.parent.span_id in by_id else None
        # (durations: the wall-clock offset a pipeline converts with is read when it converts, per trace)
        out.append((s.name, parent, (s.end_time - s.start_time) / 1e3, len(s.links),
                    tuple(sorted((k, repr(v)) for k, v in (s.attributes or {}).items() if "id" not in k))))
    return sorted(out, key=lambda r: (r[0], round(r[2], -2)))


def test_steps_tell_a_request_what_its_stamps_would():
    base, arrival = time.monotonic() - 10.0, time.time() - 10.0
    stamped, stamped_spans = _pipeline()
    from_stamps = _serve(stamped, stamped=True, base=base, arrival=arrival)
    derived, derived_spans = _pipeline()
    from_steps = _serve(derived, stamped=False, base=base, arrival=arrival)
    for rid in PROMPTS:
        assert from_steps[rid].gaps == from_stamps[rid].gaps and from_steps[rid].gaps is not None
        assert from_steps[rid].max_gap == from_stamps[rid].max_gap
    # the same monotonic stamps: the same spans, their durations to a few microseconds (each trace converts
    # with the offset between the clocks read when it is built)
    derived_shape, stamped_shape = _shape(derived_spans.get_finished_spans()), _shape(stamped_spans.get_finished_spans())
    assert len(derived_shape) == len(stamped_shape) > 2
    for d, s in zip(derived_shape, stamped_shape):
        assert d[:2] + d[3:] == s[:2] + s[3:] and abs(d[2] - s[2]) < 5, (d, s)
    assert derived.counts.token_times_unplaced == 0
    stamped.close()
    derived.close()


def test_a_lost_step_costs_the_inter_token_latencies_and_is_counted():
    pipeline, _ = _pipeline()
    summaries = _serve(pipeline, stamped=False, lose=4)  # a decode step both requests were in
    assert summaries["a"].gaps is None and summaries["b"].gaps is None
    assert pipeline.counts.token_times_unplaced == 2
    assert pipeline.counts.requests_kept == 2  # their spans and metrics still go out
    pipeline.close()
