"""Adaptive decode detail: which decode steps keep their own span, within the span budget;
step facts on decode-step spans; engine-step traces under their own service."""

from __future__ import annotations

import random
import time

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.traces import request_trees, row_tokens

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.decode_rows import OUTLIER_FACTOR, choose_rows, eventful_steps
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.spans import token_steps
from otel_llm.core.step_facts import step_facts
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import PREEMPTED, QUEUED, SCHEDULED, RequestShare, RequestTimeline, StepRecord
from otel_llm.otlp.routes import Router
from support.otlp_sink import OTLPSink

# -- the choice, on plain numbers ----------------------------------------------------------------


def test_steady_decode_is_one_window_and_stalls_keep_their_own_rows():
    gaps = [0.01] * 100
    assert eventful_steps(gaps, None, (), ()) == {}
    assert choose_rows(100, {}, 1000).rows == [(1, 100)]
    gaps[41] = 0.01 * OUTLIER_FACTOR * 1.01  # step 42: just above 1.5x the median
    gaps[59] = 0.01 * OUTLIER_FACTOR  # step 60: not above it
    found = eventful_steps(gaps, None, {7}, {80, 81})
    assert set(found) == {7, 42, 80, 81}
    assert choose_rows(100, found, 1000).rows == [(1, 6), (7, 7), (8, 41), (42, 42), (43, 79), (80, 80), (81, 81),
                                                  (82, 100)]


def test_the_tpot_slo_marks_every_gap_above_it():
    gaps = [0.02] * 10 + [0.04] * 10  # median 0.03: nothing is an outlier, half breach a 0.035 SLO
    assert set(eventful_steps(gaps, None, (), ())) == set()
    assert set(eventful_steps(gaps, 0.035, (), ())) == set(range(11, 21))


@pytest.mark.parametrize("seed", range(20))
def test_rows_never_exceed_the_budget_tile_every_step_and_keep_the_most_telling(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 3000)
    budget = rng.randint(1, 200)
    eventful = {i: (rng.random() < 0.05, rng.random() < 0.2, rng.random() < 0.3, rng.random())
                for i in rng.sample(range(1, n + 1), rng.randint(0, n))}
    rows = choose_rows(n, eventful, budget)
    assert 1 <= len(rows.rows) <= budget
    covered = [i for a, b in rows.rows for i in range(a, b + 1)]
    assert covered == list(range(1, n + 1))  # in order, no gap, no overlap
    kept = {a for a, b in rows.rows if a == b and a in eventful}
    assert rows.eventful == len(eventful) and rows.coalesced == len(eventful) - len(kept)
    # an omitted eventful step ranks below every kept one, unless keeping it would have cost more rows
    for i in set(eventful) - kept:
        assert all(eventful[i] < eventful[k] for k in kept) or len(rows.rows) >= budget - 1


def test_preemptions_outrank_slo_breaches_outrank_prefill_outrank_gap_size():
    eventful = {10: (False, False, False, 9.0), 20: (False, False, True, 0.1), 30: (False, True, False, 0.2),
                40: (True, False, False, 0.0)}
    # isolated steps: each costs 2 rows, on top of the one window
    assert [a for a, b in choose_rows(100, eventful, 3).rows if a == b] == [40]
    assert [a for a, b in choose_rows(100, eventful, 5).rows if a == b] == [30, 40]
    assert [a for a, b in choose_rows(100, eventful, 7).rows if a == b] == [20, 30, 40]
    assert [a for a, b in choose_rows(100, eventful, 9).rows if a == b] == [10, 20, 30, 40]


def test_tokens_map_to_the_steps_that_produced_them():
    steps = [StepRecord(i, 10.0 + i, 10.5 + i, []) for i in range(5)]
    token_ts = [10.5, 11.5, 12.5 + 3e-6, 13.5 - 2e-6]  # µs apart: a second client's output batch
    mapped = token_steps(token_ts, steps)
    assert {i: s.step_id for i, s in mapped.items()} == {0: 0, 1: 1, 2: 2, 3: 3}  # step 4 produced none


def test_step_facts_count_only_other_requests_prefill():
    step = StepRecord(9, 1.0, 1.25, [RequestShare("a", 40, True), RequestShare("b", 1, False),
                                     RequestShare("c", 20, True)])
    assert step_facts(step) == {sc.ENGINE_STEP_ID: 9, sc.STEP_DURATION: 0.25, sc.STEP_BATCH_SIZE: 3,
                                sc.STEP_OTHER_PREFILL_TOKENS: 60}
    assert step_facts(step, own_prefill_tokens=40)[sc.STEP_OTHER_PREFILL_TOKENS] == 20
    # with the step's anatomy measured, the row says where its time went
    step.model_s, step.execute_s, step.idle_s = 0.2, 0.22, 0.01
    facts = step_facts(step)
    assert (facts[sc.STEP_MODEL_TIME], facts[sc.STEP_EXECUTE_TIME], facts[sc.STEP_IDLE_BEFORE]) == (0.2, 0.22, 0.01)


# -- through the pipeline --------------------------------------------------------------------------

RESOURCE = Resource.create({"service.name": "llm-test"})


def long_request(tel: Pipeline, rid: str, tokens: int, stall_at: dict[int, int], preempt_at: int | None = None,
                 gap: float = 0.01, stall_gap: float = 0.012, base: float | None = None,
                 arrival: float | None = None) -> RequestTimeline:
    """A request decoding ``tokens`` tokens, one engine step each; at the decode steps in ``stall_at``
    another request's prefill of that many tokens rides in the same engine step (slightly slower);
    a few random hiccups in between."""
    rng = random.Random(rid)
    base = time.monotonic() - 600.0 if base is None else base
    arrival = time.time() - 600.0 if arrival is None else arrival
    t = RequestTimeline(rid, arrival, model="m", response_id=rid, input_tokens=8)
    assert tel.start(t)
    t.events += [(QUEUED, base), (SCHEDULED, base + 0.001)]
    tel.add_step(StepRecord(1, base + 0.001, base + 0.01, [RequestShare(rid, 8, True)]))
    t.token_ts.append(base + 0.01)
    for i in range(1, tokens):
        g = stall_gap if i in stall_at else gap * (3.0 if rng.random() < 0.01 else 1.0)
        start, end = t.token_ts[-1], t.token_ts[-1] + g
        shares = [RequestShare(rid, 1, False)] + ([RequestShare("other", stall_at[i], True)] if i in stall_at else [])
        if preempt_at == i:
            t.events += [(PREEMPTED, start + g / 3), (SCHEDULED, start + g / 2)]
        tel.add_step(StepRecord(1 + i, start, end, shares))
        t.token_ts.append(end)
    decode = t.token_ts[-1] - t.token_ts[0]
    tel.finish(rid, RequestSummary(model="m", ttft=0.01, e2e=0.011 + decode, queue=0.001, prefill=0.009,
                                   decode=decode, tpot=decode / (tokens - 1), input_tokens=8, output_tokens=tokens,
                                   num_preemptions=int(preempt_at is not None)))
    return t


def memory_telemetry(**options) -> tuple[Pipeline, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=RESOURCE)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"sample_rate": 1.0, "baseline_detail": "steps", **options}, environ={})
    return Pipeline(config, tp.get_tracer("otel_llm"), MeterProvider().get_meter("t"), "test", router=Router), exporter


def test_a_30k_token_request_stays_within_the_budget_and_keeps_every_stall():
    # every step held until the request ends (facts come from held steps: see max_steps in the README)
    tel, exporter = memory_telemetry(max_spans_per_request=300, max_steps=40000)
    stalls = {i: 64 for i in range(5000, 30000, 1000)}  # 25 steps that carried someone else's prefill
    long_request(tel, "long", 30000, stalls, preempt_at=12345)
    assert tel.flush(30)
    spans = exporter.get_finished_spans()
    trace = [s for s in spans if s.name != sc.SPAN_ENGINE_STEP]
    assert len(trace) <= 300
    t = request_trees(spans)["long"]
    rows = t.decode_rows()
    assert sum(row_tokens(r) for r in rows) == 29999
    assert all(a.end_time == b.start_time for a, b in zip(rows, rows[1:]))
    own = {r.attributes[sc.STEP_INDEX]: r for r in rows if r.name == sc.SPAN_DECODE_STEP}
    assert set(stalls) | {12345} <= set(own)
    for i, other in stalls.items():
        a = own[i].attributes
        assert a[sc.ENGINE_STEP_ID] == 1 + i and a[sc.STEP_OTHER_PREFILL_TOKENS] == other
        assert a[sc.STEP_BATCH_SIZE] == 2 and a[sc.STEP_DURATION] == pytest.approx(0.012)
    # budget-limited: the random hiccups (~300) do not all fit; those left out are counted
    assert t.one(sc.SPAN_DECODE).attributes[sc.EVENTFUL_COALESCED] > 0
    # engine-step spans: only the steps behind the request's own spans, so bounded by the budget too
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    assert {s.attributes[sc.ENGINE_STEP_ID] for s in steps} == \
        {r.attributes[sc.ENGINE_STEP_ID] for r in own.values()} | {1}  # and its prefill chunk's
    assert all(s.resource.attributes[sc.SERVICE_NAME] == "llm-test-engine-steps" for s in steps)
    assert all(s.resource.attributes[sc.SERVICE_NAME] == "llm-test" for s in trace)
    assert not tel.steps and not tel.requests
    tel.close()


def test_engine_steps_can_stay_with_the_requests():
    tel, exporter = memory_telemetry(engine_step_service="{service}")
    long_request(tel, "r", 50, {10: 32})
    assert tel.flush(10)
    assert {s.resource.attributes[sc.SERVICE_NAME] for s in exporter.get_finished_spans()} == {"llm-test"}
    tel.close()
    with pytest.raises(ValueError, match="OTEL_LLM_ENGINE_STEP_SERVICE"):
        Config.resolve(environ={"OTEL_LLM_ENGINE_STEP_SERVICE": "{host}-steps"})


def comparable(spans) -> list[tuple]:
    """Spans without their ids: name, parent's name, times, attributes, service, links' count."""
    by_id = {s.span_id: s for s in spans}
    return sorted((s.name, by_id[s.parent_span_id].name if s.parent_span_id else None, s.start_ns, s.end_ns,
                   tuple(sorted(s.attributes.items())), s.service, len(s.links)) for s in spans)


def test_sdk_path_and_direct_bytes_path_make_the_same_spans(monkeypatch):
    """The same request through the SDK's processors (in memory) and as our own OTLP bytes
    (batch processor + OTLP exporter: direct export) to a real receiver."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    import otel_llm.core.pipeline as pipeline_module
    from support.otlp_sink import decode

    class FixedClock(pipeline_module.WallClock):  # the offset is read per request: pin it for both runs
        def __init__(self) -> None:
            self.offset_ns = 1_000_000_000_000

    monkeypatch.setattr(pipeline_module, "WallClock", FixedClock)

    def run(tel: Pipeline) -> None:
        long_request(tel, "r", 400, {50: 64, 51: 64, 200: 16}, preempt_at=300, base=1000.0, arrival=1.7e9)

    tel, exporter = memory_telemetry()
    assert tel.spans.wire_export() is None
    run(tel)
    assert tel.flush(10)
    sdk = decode(encode_spans(exporter.get_finished_spans()).SerializeToString())
    tel.close()
    with OTLPSink() as sink:
        tp = TracerProvider(resource=RESOURCE)
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{sink.endpoint}/v1/traces")))
        config = Config.resolve({"sample_rate": 1.0, "baseline_detail": "steps"}, environ={})
        tel = Pipeline(config, tp.get_tracer("otel_llm"), MeterProvider().get_meter("t"), "test", router=Router)
        assert tel.spans.wire_export() is not None
        run(tel)
        assert tel.flush(10) and tp.force_flush()
        direct = sink.spans()
        assert tel.stats()["direct_spans_sent"] == len(direct)
        tel.close()
        tp.shutdown()
    names = {s.name for s in direct}
    assert {sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW, sc.SPAN_ENGINE_STEP, sc.SPAN_REQUEUE} <= names
    assert comparable(direct) == comparable(sdk)
