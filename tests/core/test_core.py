"""The engine-agnostic core on constructed timelines: fast, no engine."""

from __future__ import annotations

import math
import random
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from support.traces import MS, engine_steps, request_trees, row_tokens

from otel_llm import semconv as sc
from otel_llm.core.config import Config, Detail
from otel_llm.core.pipeline import Pipeline
from otel_llm.guard import Guard
from otel_llm.core.quantile import QuantileSketch
from otel_llm.core.slo import SLO, SLOTable
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import (
    PREEMPTED,
    QUEUED,
    SCHEDULED,
    RequestShare,
    RequestTimeline,
    StepRecord,
)
from support.metrics import points_by_name

# -- configuration ----------------------------------------------------------------------------


def test_slo_table_parses_default_and_per_model():
    t = SLOTable.parse("ttft=0.5,tpot=50ms; big-model: ttft=2, e2e=30")
    assert t.default == SLO(ttft=0.5, tpot=0.05)
    assert t.for_model("big-model") == SLO(ttft=2.0, e2e=30.0)
    assert t.for_model("other") == t.default


@pytest.mark.parametrize("bad", ["ttft", "latency=1", "ttft=fast", "ttft=-1", "ttft=0"])
def test_bad_slo_text_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="SLO"):
        SLOTable.parse(bad)


def test_explicit_arguments_win_over_environment_over_defaults():
    env = {"OTEL_LLM_SAMPLE_RATE": "0.25", "OTEL_LLM_DETAIL": "phases", "OTEL_LLM_SLO": "ttft=1"}
    c = Config.resolve({"sample_rate": 0.5}, environ=env)
    assert c.sample_rate == 0.5 and c.detail is Detail.PHASES and c.slo.default.ttft == 1.0
    assert Config.resolve({}, environ={}).capture_content is False


@pytest.mark.parametrize("var,value", [("OTEL_LLM_SAMPLE_RATE", "2"), ("OTEL_LLM_DETAIL", "everything"),
                                       ("OTEL_LLM_CAPTURE_CONTENT", "maybe"), ("OTEL_LLM_MAX_STEPS", "0")])
def test_bad_environment_names_the_variable(var, value):
    with pytest.raises(ValueError, match=var):
        Config.resolve({}, environ={var: value})


def test_unknown_option_is_refused():
    with pytest.raises(TypeError, match="unknown option"):
        Config.resolve({"sampel_rate": 0.1})


# -- the quantile sketch ----------------------------------------------------------------------


def test_sketch_quantiles_are_within_the_stated_relative_error():
    rng = random.Random(7)
    values = [rng.lognormvariate(-3, 1.2) for _ in range(20_000)]
    sketch = QuantileSketch(alpha=0.01)
    for v in values:
        sketch.add(v)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        true = ordered[int(q * (len(ordered) - 1))]
        assert abs(sketch.quantile(q) - true) <= 0.0101 * true


def test_sketch_memory_is_bounded():
    sketch = QuantileSketch(alpha=0.01, max_buckets=64)
    for i in range(1, 100_000, 7):
        sketch.add(i * 1e-6)
    assert len(sketch._buckets) <= 64
    assert sketch.quantile(0.99) == pytest.approx(0.099, rel=0.05)


# -- the pipeline on constructed timelines ----------------------------------------------------


class Harness:
    def __init__(self, **options) -> None:
        self.exporter = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        mp = MeterProvider(metric_readers=[self.reader])
        self.telemetry = Pipeline(Config.resolve(options, environ={}), tp.get_tracer("t"), mp.get_meter("t"), "test")

    def request(self, rid: str, *, queue=0.01, prefill=0.05, tokens=5, itl=0.01, preempt_at=None,
                chunks=(), error=None, gaps=None, group=None, index=None) -> RequestSummary:
        """A request as an engine would report it, on this process's monotonic clock; ``gaps``
        (tokens - 1 of them) instead of a steady ``itl``."""
        base = time.monotonic() - 5.0
        arrival = time.time() - 5.0 - 0.002
        t = RequestTimeline(rid, arrival, model="m", response_id=group.group_id if group else rid, input_tokens=100,
                            group=group, choice_index=index)
        if not self.telemetry.start(t):
            return None
        t.events += [(QUEUED, base), (SCHEDULED, base + queue)]
        first = base + queue + prefill
        for i, (start, end, n) in enumerate(chunks):
            self.telemetry.add_step(StepRecord(hash((rid, i)) & 0xFFFF, base + start, base + end,
                                               [RequestShare(rid, n, True)]))
        gaps = [itl] * (tokens - 1) if gaps is None else list(gaps)
        assert len(gaps) == tokens - 1
        t.token_ts.append(first)
        for g in gaps:
            t.token_ts.append(t.token_ts[-1] + g)
        if preempt_at is not None:
            t.events += [(PREEMPTED, first + preempt_at), (SCHEDULED, first + preempt_at + 0.02)]
        decode = t.token_ts[-1] - first
        s = RequestSummary(model="m", ttft=0.002 + queue + prefill, e2e=0.002 + queue + prefill + decode,
                           queue=queue, prefill=prefill, decode=decode, tpot=RequestSummary.mean_tpot(decode, tokens),
                           input_tokens=100, output_tokens=tokens, output_characters=4 * tokens,
                           num_preemptions=0 if preempt_at is None else 1, error_type=error)
        t.finish_reason = "abort" if error else "length"
        self.telemetry.finish(rid, s)
        return s

    def spans(self):
        assert self.telemetry.flush(10)  # spans are built on the materializer thread
        return list(self.exporter.get_finished_spans())

    def metric_data(self):
        assert self.telemetry.flush(10)
        return self.reader.get_metrics_data()

    def trees(self):
        return request_trees(self.spans())


def test_full_detail_tiles_and_counts_decode_steps():
    h = Harness(sample_rate=1.0, baseline_detail="steps")
    h.request("r1", tokens=6, chunks=[(0.01, 0.03, 64), (0.03, 0.06, 36)])
    t = h.trees()["r1"]
    q, p, d = t.one(sc.SPAN_QUEUE), t.one(sc.SPAN_PREFILL), t.one(sc.SPAN_DECODE)
    assert q.start_time == t.span.start_time and q.end_time == p.start_time
    assert p.end_time == d.start_time and d.end_time == t.span.end_time
    (window,) = t.decode_rows()  # a steady decode: one window
    assert window.name == sc.SPAN_DECODE_WINDOW and row_tokens(window) == 5
    assert window.start_time == d.start_time and abs(window.end_time - d.end_time) <= MS
    a = window.attributes
    assert (a[sc.WINDOW_FIRST_INDEX], a[sc.WINDOW_LAST_INDEX]) == (1, 5)
    assert a[sc.WINDOW_GAP_MEAN] == pytest.approx(0.01) and a[sc.WINDOW_GAP_MAX] == pytest.approx(0.01)
    assert [c.attributes[sc.CHUNK_TOKENS] for c in t.grandchildren[sc.SPAN_PREFILL_CHUNK]] == [64, 36]
    assert [e.name for e in q.events] == [sc.EVENT_ENGINE_QUEUED]
    assert (p.end_time - p.start_time) == pytest.approx(0.05e9, abs=MS)


def test_detail_levels():
    for detail, has_phases, has_steps in (("request", False, False), ("phases", True, False), ("steps", True, True)):
        h = Harness(sample_rate=1.0, baseline_detail=detail)
        h.request("r")
        t = h.trees()["r"]
        assert bool(t.children[sc.SPAN_DECODE]) is has_phases
        assert bool(t.decode_rows()) is has_steps


def test_preemption_in_decode_adds_event_requeue_and_reprefill():
    h = Harness(sample_rate=1.0)
    h.request("r", tokens=8, preempt_at=0.025)
    t = h.trees()["r"]
    decode = t.one(sc.SPAN_DECODE)
    assert [e.name for e in decode.events] == [sc.EVENT_PREEMPTION]
    (rq,), (rp,) = t.grandchildren[sc.SPAN_REQUEUE], t.grandchildren[sc.SPAN_REPREFILL]
    assert rq.end_time - rq.start_time == pytest.approx(0.02e9, abs=MS)
    assert rp.start_time == rq.end_time
    assert t.attributes[sc.NUM_PREEMPTIONS] == 1


def test_aborted_request_is_error_and_kept_for_cause():
    h = Harness(sample_rate=0.0)
    h.request("ok")
    h.request("bad", error="aborted")
    trees = h.trees()
    assert set(trees) == {"bad"}
    t = trees["bad"]
    assert t.span.status.status_code == StatusCode.ERROR
    assert t.attributes[sc.SAMPLING_REASON] == "error"
    assert t.attributes[sc.ERROR_TYPE] == "aborted"


def test_slow_requests_are_kept_by_the_running_quantile():
    h = Harness(sample_rate=0.0, tail_quantile=0.9)
    rng = random.Random(3)
    slow = set()
    for i in range(400):
        itl = 0.01 if rng.random() > 0.05 else 0.2
        h.request(f"r{i}", itl=itl)
        if itl == 0.2 and i >= 60:
            slow.add(f"r{i}")
    kept = set(h.trees())
    assert slow <= kept  # every slow one after warm-up
    assert len(kept) < 0.15 * 400  # and few of the others
    assert all(t.attributes[sc.SAMPLING_REASON] == "slow_p90" for t in h.trees().values())


def test_engine_steps_wait_for_their_requests_then_link_only_kept_ones():
    h = Harness(sample_rate=0.0, slo="ttft=0.1")
    tele = h.telemetry
    base = time.monotonic()
    for rid in ("fast", "slow"):
        tele.start(RequestTimeline(rid, time.time(), model="m", response_id=rid))
    tele.add_step(StepRecord(1, base, base + 0.01, [RequestShare("fast", 10, True), RequestShare("slow", 30, True)]))
    tele.add_step(StepRecord(2, base + 0.01, base + 0.02, [RequestShare("unknown", 1, False)]))
    assert list(tele.steps) == [1]  # a step serving no tracked request is not held
    tele.finish("fast", RequestSummary(model="m", ttft=0.01, e2e=0.02))
    assert engine_steps(h.spans()) == []  # still waiting for "slow"
    tele.finish("slow", RequestSummary(model="m", ttft=0.5, e2e=0.6))
    (step,) = engine_steps(h.spans())
    (link,) = step.links
    assert link.context.span_id == h.trees()["slow"].span.context.span_id
    assert step.attributes[sc.STEP_PHASE] == "prefill" and step.attributes[sc.STEP_NUM_PREFILL_TOKENS] == 40
    assert not tele.steps and not tele.requests


def test_steps_are_linked_to_requests_when_they_settle_and_released_when_none_left_can_be_in_them():
    """add_step does not touch each request: which steps served a request is found when it settles (for
    those whose verdict or spans read them), from the steps held since it started. Records of one batch
    share their id list (as the wire decoder's cache makes them); a step is released once the oldest
    request still to settle started after it."""
    h = Harness(sample_rate=0.0, slo="ttft=0.1")
    tele = h.telemetry
    base = time.monotonic() - 5.0
    for rid in ("a", "b"):
        tele.start(RequestTimeline(rid, time.time() - 5.0, model="m", response_id=rid))
    both = ["a", "b"]
    tele.add_step(StepRecord.of_lists(1, base, base + 0.01, ["a", "b"], [10, 20], [0, 1]))
    for i in range(2, 6):  # a steady batch: one list for all its records
        tele.add_step(StepRecord.of_lists(i, base + 0.01 * i, base + 0.01 * i + 0.005, both, None, ()))
    tele.start(RequestTimeline("c", time.time() - 5.0, model="m", response_id="c"))
    tele.add_step(StepRecord.of_lists(6, base + 0.06, base + 0.065, ["b", "c"], [1, 8], [1]))
    tele.add_step(StepRecord.of_lists(7, base + 0.07, base + 0.075, ["c"], None, ()))
    a, b, c = (tele.requests[r] for r in ("a", "b", "c"))
    assert a.steps == [] and b.steps == [] and [x.step_id for x in a.chunks] == [1]  # nothing linked per step
    tele.finish("a", RequestSummary(model="m", ttft=0.5, e2e=0.6))  # breached: its verdict reads its steps
    assert tele.flush(10)
    assert a.steps == [1, 2, 3, 4, 5]
    assert list(tele.steps) == [1, 2, 3, 4, 5, 6, 7]  # b, which started as early, may be in any of them
    sb = RequestSummary(model="m", ttft=0.01, e2e=0.02)
    tele.finish("b", sb)  # met: its steps are read for its engine time only (core/diagnosis/engine_time.py)
    assert tele.flush(10)
    assert b.steps == [1, 2, 3, 4, 5, 6] and list(tele.steps) == [6, 7]  # c started after step 5
    # step 1: 20 of 30 tokens of 10 ms; steps 2-5: half of 5 ms each; step 6: 1 of 9 tokens of 5 ms
    assert sb.engine_time == pytest.approx(0.01 * 20 / 30 + 4 * 0.0025 + 0.005 / 9)
    tele.finish("c", RequestSummary(model="m", ttft=0.5, e2e=0.6))
    assert tele.flush(10)
    assert c.steps == [6, 7] and not tele.steps and tele.counts.steps_settled_early == 0


def test_memory_stays_bounded():
    h = Harness(sample_rate=0.0, max_requests=10, max_steps=5)
    tele = h.telemetry
    for i in range(20):
        tele.start(RequestTimeline(f"r{i}", time.time()))
    assert len(tele.requests) == 10 and tele.counts.requests_untracked == 10
    for i in range(50):
        tele.add_step(StepRecord(i, 0.0, 0.001, [RequestShare("r0", 1, False)]))
    assert len(tele.steps) == 5 and tele.counts.steps_settled_early == 45
    tele.finish("r15", RequestSummary(ttft=0.1))  # untracked: metrics only, no error
    assert tele.counts.requests_finished == 1


def test_metrics_cover_every_request_and_goodput():
    h = Harness(sample_rate=0.0, slo="ttft=0.06")
    h.request("a", queue=0.01, prefill=0.02)
    h.request("b", queue=0.01, prefill=0.2)
    h.request("c", error="aborted")
    got = points_by_name(h.metric_data())
    # the conventions define TTFT/TPOT for successful responses: the aborted one is counted, not timed
    assert sum(p.count for p in got["gen_ai.server.time_to_first_token"]) == 2
    assert not [p for p in got["gen_ai.server.time_to_first_token"] if p.attributes.get(sc.ERROR_TYPE)]
    assert sum(p.count for p in got["gen_ai.server.request.duration"]) == 3
    assert sum(p.value for p in got["llm.server.requests"]) == 3
    assert sum(p.value for p in got["llm.server.requests.good"]) == 1
    assert sum(p.value for p in got["llm.server.output.characters"]) == 60
    errors = [p for p in got["llm.server.requests"] if p.attributes.get(sc.ERROR_TYPE) == "aborted"]
    assert errors and errors[0].value == 1


def test_exemplars_point_at_kept_traces():
    h = Harness(sample_rate=1.0)
    h.request("r")
    points = points_by_name(h.metric_data())["gen_ai.server.time_to_first_token"]
    exemplars = [e for p in points for e in p.exemplars]
    assert exemplars and exemplars[0].trace_id == h.trees()["r"].span.context.trace_id


def test_summary_from_native_vllm_span_attributes():
    s = RequestSummary.from_attributes({sc.VLLM_TTFT: 0.1, sc.VLLM_E2E: 1.1, sc.VLLM_DECODE: 0.9,
                                        sc.VLLM_COMPLETION_TOKENS: 10, sc.VLLM_PROMPT_TOKENS: 5})
    assert s.ttft == 0.1 and s.output_tokens == 10 and math.isclose(s.tpot, 0.1)
    assert RequestSummary.from_attributes({"http.method": "GET"}) is None


def test_any_tracer_works_not_only_the_sdks():
    """Decode steps take a fast path with the SDK's own Tracer; any other tracer gets the public API."""
    from opentelemetry import trace

    h = Harness(sample_rate=1.0, baseline_detail="steps")
    inner = h.telemetry.spans.route.tracer

    class Delegating(trace.Tracer):
        def start_span(self, *args, **kwargs):
            return inner.start_span(*args, **kwargs)

        def start_as_current_span(self, *args, **kwargs):
            return inner.start_as_current_span(*args, **kwargs)

    from otel_llm.core.spans import SpanBuilder

    h.telemetry.spans = SpanBuilder(Delegating())
    assert h.telemetry.spans.route.kind == "api"
    h.request("r", tokens=7, gaps=[0.01, 0.01, 0.05, 0.01, 0.01, 0.01])
    t = h.trees()["r"]
    rows = t.decode_rows()
    assert [r.name for r in rows] == [sc.SPAN_DECODE_WINDOW, sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW]
    assert all(r.parent.span_id == t.one(sc.SPAN_DECODE).context.span_id for r in rows)


def test_sketch_walks_agree_from_either_end_through_decay_and_collapse():
    rng = random.Random(11)
    sketch = QuantileSketch(alpha=0.02, max_buckets=40, window=500)
    values = []
    for i in range(3000):
        v = rng.expovariate(1.0) if i % 10 else 0.0
        sketch.add(v)
        values.append(v)
    # reference: the bottom-up definition, computed here from the buckets directly
    keys = sorted(sketch._buckets)
    for q in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99):
        rank, seen, ref = q * (sketch.count - 1), sketch._zeros, None
        if rank >= seen:
            for k in keys:
                seen += sketch._buckets[k]
                if seen > rank:
                    ref = k
                    break
        assert sketch._key_at(q) == ref
    assert sketch._keys == keys


def test_tracked_high_quantile_equals_a_full_walk_through_decay_and_collapse():
    # the sketch steps its remembered p99 bucket as values arrive; it must answer what walking every bucket does
    def walk(sk: QuantileSketch, q: float):
        rank = q * (sk.count - 1)
        if sk.count <= 0 or rank < sk._zeros or not sk._keys:
            return None
        above = sk.count
        for key in reversed(sk._keys):
            above -= sk._buckets[key]
            if above <= rank:
                return key
        return sk._keys[0]

    rng = random.Random(5)
    for alpha, max_buckets, window in ((0.01, 2048, 0), (0.02, 40, 300), (0.05, 30, 1000)):
        sketch, q = QuantileSketch(alpha=alpha, max_buckets=max_buckets, window=window), 0.99
        for i in range(6000):
            if i % 1500 == 0:
                q = rng.choice((0.9, 0.99, 0.999))  # asking another quantile starts tracking that one
            assert sketch._key_at(q) == walk(sketch, q)
            sketch.add(0.0 if i % 37 == 0 else rng.lognormvariate(0, 0.5) * (50 if i > 3000 else 1))


def test_add_above_answers_as_comparing_with_the_upper_bound_before_adding():
    # the tail policy's one-call test must keep exactly what "value > upper_bound(q), then add" keeps
    rng = random.Random(8)
    for alpha, max_buckets, window, min_count in ((0.01, 2048, 0, 50), (0.02, 40, 300, 1), (0.05, 30, 1000, 0)):
        one, two = (QuantileSketch(alpha=alpha, max_buckets=max_buckets, window=window) for _ in range(2))
        kept = 0
        for i in range(5000):
            v = 0.0 if i % 41 == 0 else rng.lognormvariate(0, 0.6) * (30 if 2000 < i < 2100 else 1)
            bound = two.upper_bound(0.99) if two.count >= min_count and two.count > 0 else None
            want = bound is not None and v > bound
            two.add(v)
            assert one.add_above(v, 0.99, min_count) == want, (i, v, bound)
            kept += want
        assert one._buckets == two._buckets and one.count == two.count and 0 < kept < 500
        # add_above's inline path (an existing bucket, no decay due) leaves the state add() leaves
        assert (one._keys, one._zeros, one._since_decay, one._hq, one._hidx, one._hbelow) == \
            (two._keys, two._zeros, two._since_decay, two._hq, two._hidx, two._hbelow)


def test_summary_from_attributes_converts_and_defaults_like_reading_each_key():
    s = RequestSummary.from_attributes({sc.LATENCY_E2E: 2, sc.LATENCY_TTFT: True, sc.USAGE_OUTPUT_TOKENS: 7.9,
                                        sc.USAGE_INPUT_TOKENS: "3", sc.REQUEST_MODEL: "", sc.NUM_PREEMPTIONS: None,
                                        sc.RESPONSE_FINISH_REASONS: ("stop", "length"), "other": 1})
    assert (s.e2e, type(s.e2e), s.ttft, s.output_tokens, s.input_tokens, s.model) == (2.0, float, None, 7, None, None)
    assert (s.operation, s.num_preemptions, s.finish_reason, s.error_type) == ("text_completion", 0, "stop", None)


def test_boolean_options_take_python_bools_and_strings():
    assert Config.resolve({"capture_content": True}, environ={}).capture_content is True
    assert Config.resolve({"engine_steps": False}, environ={}).engine_steps is False
    assert Config.resolve({}, environ={"OTEL_LLM_CAPTURE_CONTENT": "true"}).capture_content is True


LATEST = "gen_ai_latest_experimental"


@pytest.mark.parametrize("shared, ours, explicit, expected, opt_in", [
    ("true", None, None, True, None), ("false", None, None, False, None),
    # the modes are the latest conventions' reading (OTEL_SEMCONV_STABILITY_OPT_IN), as the contrib
    # instrumentations read them: without the opt-in they capture nothing; with it a boolean captures nothing
    ("SPAN_ONLY", None, None, False, None), ("span_and_event", None, None, False, None),
    ("SPAN_ONLY", None, None, True, LATEST), ("span_and_event", None, None, True, f"http/dup, {LATEST}"),
    ("EVENT_ONLY", None, None, False, LATEST), ("NO_CONTENT", None, None, False, LATEST),
    ("true", None, None, False, LATEST), ("true", None, None, True, "gen_ai_latest"),  # not the value
    ("true", "false", None, False, None),  # ours, the more specific, wins over the ecosystem's variable
    (None, "true", None, True, LATEST),  # (and is a boolean in either reading)
    ("true", None, False, False, None),  # and an explicit argument over both
    (None, None, None, False, None),
])
def test_content_capture_follows_the_genai_instrumentations_variable(shared, ours, explicit, expected, opt_in):
    env = {k: v for k, v in (("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", shared),
                             ("OTEL_LLM_CAPTURE_CONTENT", ours), ("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in))
           if v is not None}
    config = Config.resolve({"capture_content": explicit}, environ=env)
    assert config.capture_content is expected


def test_a_bad_genai_capture_value_names_the_variable():
    with pytest.raises(ValueError, match="OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"):
        Config.resolve({}, environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "sometimes"})


def test_instrument_imports_no_engine_the_process_does_not_use():
    import subprocess
    import sys

    code = ("import sys, otel_llm; done = otel_llm.instrument(); "
            "print('vllm' in done, 'vllm' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False", "False"], out.stderr[-2000:]


def test_content_is_captured_only_when_asked_in_the_conventions_shape():
    import json

    for capture in (False, True):
        h = Harness(sample_rate=1.0, capture_content=capture)
        tele = h.telemetry
        t = RequestTimeline("r", time.time(), model="m", response_id="r", prompt_text="Hi there")
        tele.start(t)
        t.output_text, t.finish_reason = "Hello!", "stop"
        tele.finish("r", RequestSummary(model="m", ttft=0.01, e2e=0.02))
        a = h.trees()["r"].attributes
        if not capture:
            assert sc.INPUT_MESSAGES not in a and sc.OUTPUT_MESSAGES not in a
            continue
        assert json.loads(a[sc.INPUT_MESSAGES]) == [{"role": "user", "parts": [{"type": "text", "content": "Hi there"}]}]
        assert json.loads(a[sc.OUTPUT_MESSAGES]) == [
            {"role": "assistant", "parts": [{"type": "text", "content": "Hello!"}], "finish_reason": "stop"}]


def test_wrap_table_coexists_with_other_wrappers():
    """Another library's wrapper, under or over ours, never makes us skip or double-wrap."""
    import types

    import wrapt

    from otel_llm.instrumentation.wraps import Target, WrapTable

    mod = types.ModuleType("otel_llm_fake_engine")

    class Engine:
        def step(self) -> list:
            return ["engine"]

    mod.Engine = Engine
    import sys

    sys.modules[mod.__name__] = mod
    try:
        def theirs(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs) + ["theirs"]

        def ours(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs) + ["ours"]

        wrapt.wrap_function_wrapper(Engine, "step", theirs)  # someone was first
        table = WrapTable([Target(mod.__name__, "Engine.step", ours)], Guard())
        table.wrap()
        table.wrap()
        assert Engine().step() == ["engine", "theirs", "ours"]
        wrapt.wrap_function_wrapper(Engine, "step", theirs)  # someone wraps on top of us
        table.unwrap()
        assert Engine().step() == ["engine", "theirs", "theirs"]  # ours is switched off in their chain
        table.wrap()
        assert Engine().step() == ["engine", "theirs", "ours", "theirs"]  # on again, not twice
    finally:
        del sys.modules[mod.__name__]


def test_a_plain_target_wraps_with_a_plain_function_and_unwraps_exactly():
    """Target(plain=True) (the EngineCore's per-step hooks): a plain function in the class, the same
    wrapper signature as wrapt's (bound original, instance, args, kwargs), off when the table is
    unwrapped, the original put back; on top of someone's wrapt wrapper it falls back to wrapt."""
    import sys
    import types

    import wrapt

    from otel_llm.instrumentation.wraps import Target, WrapTable

    mod = types.ModuleType("otel_llm_fake_scheduler")

    class Base:
        def step(self, n: int, *, extra: int = 0) -> list:
            return [n + extra]

    class Scheduler(Base):  # the method inherited: wrapped on the named class, as wrapt does
        pass

    mod.Scheduler = Scheduler
    original = Base.__dict__["step"]
    sys.modules[mod.__name__] = mod
    seen: list = []
    try:
        def ours(wrapped, instance, args, kwargs):
            seen.append((wrapped.__self__ is instance, instance, args, kwargs))
            return wrapped(*args, **kwargs) + ["ours"]

        table = WrapTable([Target(mod.__name__, "Scheduler.step", ours, plain=True)], Guard())
        table.wrap()
        table.wrap()  # not twice
        installed = Scheduler.__dict__["step"]
        assert installed.__class__ is types.FunctionType and installed.__wrapped__ is original
        s = Scheduler()
        assert s.step(1, extra=2) == [3, "ours"]
        assert seen == [(True, s, (1,), {"extra": 2})]
        assert Base().step(1) == [1]  # the base class is left alone
        table.unwrap()
        assert "step" not in Scheduler.__dict__ or Scheduler.__dict__["step"] is original
        assert s.step(1) == [1] and len(seen) == 1

        def theirs(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs) + ["theirs"]

        wrapt.wrap_function_wrapper(Scheduler, "step", theirs)  # someone's wrapt wrapper first: we use wrapt
        table.wrap()
        assert isinstance(Scheduler.__dict__["step"], wrapt.FunctionWrapper)
        assert s.step(1) == [1, "theirs", "ours"]
        table.unwrap()
        assert s.step(1) == [1, "theirs"]
    finally:
        del sys.modules[mod.__name__]


def test_decode_steps_take_the_sdk_fast_path_with_the_sdk_tracer():
    h = Harness(sample_rate=1.0, baseline_detail="steps")
    assert h.telemetry.spans.route.kind == "sdk"
    h.request("r", tokens=4, gaps=[0.01, 0.05, 0.01])
    t = h.trees()["r"]
    steps = t.grandchildren[sc.SPAN_DECODE_STEP]
    assert len(steps) == 3  # the stall, and the single steps either side of it
    s = steps[0]
    assert s.resource == h.telemetry.spans.route.tracer.resource and s.instrumentation_scope.name == "t"
    assert s.context.trace_id == t.span.context.trace_id and s.context.trace_flags.sampled


def test_materializer_is_bounded_never_blocks_and_survives_errors():
    import threading

    from otel_llm.core.materializer import Materializer

    gate, done = threading.Event(), []

    def work(job):
        if job == "boom":
            raise RuntimeError("bug")
        gate.wait(120)  # held until the test opens it (a bound only so a failed test cannot hang the worker)
        done.append(job)

    guard = Guard()
    m = Materializer(work, guard, max_jobs=2)
    accepted = [m.submit(i) for i in range(1, 8)]  # one may be running, two queued: the rest refused
    assert accepted[:2] == [True, True] and not all(accepted) and m.refused == accepted.count(False)
    assert m.flush(0.1) is False  # stuck behind the gate: flush times out, nothing blocks
    gate.set()
    assert m.flush(60)
    assert m.submit("boom") and m.flush(60)
    assert guard.errors == {"span materializer": 1}  # in its owner's guard
    assert m.submit(9) and m.flush(60) and done[-1] == 9  # still working after the error


def test_a_full_materializer_drops_spans_but_not_metrics():
    h = Harness(sample_rate=1.0)
    h.telemetry.materializer._max = 0  # refuses everything, as when span building falls far behind
    h.request("a")
    h.request("b")
    assert h.telemetry.counts.requests_spans_dropped == 2 and h.trees() == {}
    got = points_by_name(h.metric_data())
    assert sum(p.count for p in got["gen_ai.server.time_to_first_token"]) == 2


def test_percentile_policy_caps_its_share_under_correlated_slowness():
    from otel_llm.core.sampling import LatencyPercentilePolicy, TraceView

    policy = LatencyPercentilePolicy(quantile=0.99, min_samples=50)
    kept = 0
    for i in range(2000):
        slow_batch = (i // 64) % 4 == 3  # every fourth batch of 64 is uniformly slower
        value = (0.2 if slow_batch else 0.1) * (1 + (i % 7) / 100)
        kept += policy.evaluate(TraceView(i, (RequestSummary(model="m", e2e=value),))).sampled
    assert 0 < kept <= 0.03 * 2000  # about its 2% cap, not the quarter of requests in slow batches


def test_fast_path_spans_encode_under_the_providers_one_resource():
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    h = Harness(sample_rate=1.0, baseline_detail="steps")
    h.request("r", tokens=5)
    spans = h.spans()
    request = encode_spans(spans)
    assert len(request.resource_spans) == 1  # decode steps and the SDK-built spans share one group
    assert sum(len(ss.spans) for ss in request.resource_spans[0].scope_spans) == len(spans)


# -- parallel sampling (n > 1): one user request, one trace ----------------------------------------

def _choices(spans, root):
    return sorted((x for x in spans if x.name == sc.SPAN_CHOICE and x.parent.span_id == root.context.span_id),
                  key=lambda x: x.attributes[sc.CHOICE_INDEX])


def test_n_sequences_of_one_request_are_one_trace_with_a_choice_span_each():
    from otel_llm.core.timeline import RequestGroup

    h = Harness(sample_rate=1.0, baseline_detail="steps")
    group = RequestGroup("parent", choice_count=3, expected=3)
    made = [h.request(f"{i}_parent", tokens=4 + i, group=group, index=i) for i in (2, 0, 1)]  # any finish order
    spans = h.spans()
    assert len({x.context.trace_id for x in spans}) == 1
    (root,) = [x for x in spans if x.parent is None]
    a = root.attributes
    assert a[sc.REQUEST_CHOICE_COUNT] == 3 and a[sc.RESPONSE_ID] == "parent"
    assert a[sc.USAGE_INPUT_TOKENS] == 100  # one prompt
    assert a[sc.USAGE_OUTPUT_TOKENS] == sum(s.output_tokens for s in made) == 4 + 5 + 6
    assert a[sc.LATENCY_E2E] == max(s.e2e for s in made) and a[sc.LATENCY_TTFT] == min(s.ttft for s in made)
    assert a[sc.RESPONSE_FINISH_REASONS] == ("length",) * 3
    choices = _choices(spans, root)
    assert [c.attributes[sc.CHOICE_INDEX] for c in choices] == [0, 1, 2]
    assert [c.attributes[sc.USAGE_OUTPUT_TOKENS] for c in choices] == [4, 5, 6]
    for c in choices:  # each sequence has its own phases, tiling its choice span
        kids = {x.name for x in spans if x.parent and x.parent.span_id == c.context.span_id}
        assert kids == {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE}
        assert root.start_time <= c.start_time and c.end_time <= root.end_time
        assert sc.RESPONSE_ID not in c.attributes  # the request's id is its request span's
    assert root.end_time == max(c.end_time for c in choices)
    assert h.telemetry.counts.requests_kept == 1 and h.telemetry.requests == {}
    # metrics per sequence, as vLLM's own statistics count them
    got = points_by_name(h.metric_data())
    assert sum(p.count for p in got["gen_ai.server.time_to_first_token"]) == 3


def test_one_decision_for_all_sequences_a_breach_of_one_keeps_the_whole_request():
    from otel_llm.core.timeline import RequestGroup

    h = Harness(sample_rate=0.0, slo="ttft=0.5", tail_quantile=0)
    group = RequestGroup("p", choice_count=2, expected=2)
    h.request("0_p", group=group, index=0)  # within the SLO
    assert h.spans() == []  # nothing until the last sequence finished
    h.request("1_p", queue=1.0, group=group, index=1)  # breaches TTFT
    spans = h.spans()
    (root,) = [x for x in spans if x.parent is None]
    assert root.attributes[sc.SAMPLING_REASON] == "slo_breach:ttft" and root.attributes[sc.SLO_MET] is False
    met = {c.attributes[sc.CHOICE_INDEX]: c.attributes[sc.SLO_MET] for c in _choices(spans, root)}
    assert met == {0: True, 1: False}
    h2 = Harness(sample_rate=0.0, slo="ttft=0.5", tail_quantile=0)
    quiet = RequestGroup("q", choice_count=2, expected=2)
    h2.request("0_q", group=quiet, index=0)
    h2.request("1_q", group=quiet, index=1)
    assert h2.spans() == []  # neither breached: one "no" for the request, no partial trace
    assert sum(p.count for p in points_by_name(h2.metric_data())["gen_ai.server.time_to_first_token"]) == 2


def test_a_sequence_refused_over_max_requests_does_not_hold_its_siblings_back():
    from otel_llm.core.timeline import RequestGroup

    h = Harness(sample_rate=1.0, max_requests=1)
    group = RequestGroup("p", choice_count=2, expected=2)
    base = time.time()
    first = RequestTimeline("0_p", base, model="m", response_id="p", group=group, choice_index=0)
    assert h.telemetry.start(first)
    second = RequestTimeline("1_p", base, model="m", response_id="p", group=group, choice_index=1)
    assert not h.telemetry.start(second) and group.expected == 1
    h.telemetry.finish("1_p", RequestSummary(model="m", e2e=0.1))  # untracked: metrics only
    h.telemetry.finish("0_p", RequestSummary(model="m", e2e=0.2))
    (root,) = [x for x in h.spans() if x.parent is None]
    assert root.attributes[sc.REQUEST_CHOICE_COUNT] == 2 and len(_choices(h.spans(), root)) == 1


def test_materializer_refuses_what_is_not_a_job():
    h = Harness(sample_rate=1.0)
    assert h.telemetry.materializer.submit(("a", "tuple", None, None))
    assert h.telemetry.flush(10)
    assert h.telemetry.guard.errors == {"span materializer": 1}  # the pipeline's guard: its owner's
