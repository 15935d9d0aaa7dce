"""The slow-cause verdict on constructed engine histories: each cause, the unknowns, and the pipeline's use."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.diagnosis.engine_time import interference_caused
from otel_llm.core.diagnosis.verdict import StepWindow, decide
from otel_llm.core.metrics import SERVER_METRICS, ServerMetrics
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.slo import SLOTable
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import (BLOCKED_KV_CACHE, BLOCKED_MAX_SEQS, BLOCKED_NONE, BLOCKED_OTHER,
                                    BLOCKED_TOKEN_BUDGET, PREEMPTED, QUEUED, SCHEDULED, PrefillChunk,
                                    RequestTimeline, StepGrammar, StepRecord)
from support.metrics import points_by_name

STEP, GAP = 0.010, 0.001
ENGINE = 7 << 32


class Sim:
    """An engine history built step by step: each step's shares are (request, tokens, kind), kind
    ``p`` a prompt chunk, ``P`` the last prompt chunk (emits the first token), ``d`` a decode token."""

    def __init__(self, telemetry: Pipeline | None = None) -> None:
        self.telemetry = telemetry
        self.window = telemetry.window if telemetry is not None else StepWindow()
        self.now = 100.0
        self.next_id = ENGINE | 1
        self.timelines: dict[str, RequestTimeline] = {}

    def arrive(self, *rids: str) -> None:
        for rid in rids:
            t = RequestTimeline(rid, time.time(), model="m", response_id=rid)
            t.events.append((QUEUED, self.now))
            self.timelines[rid] = t
            if self.telemetry is not None:
                assert self.telemetry.start(t)

    def step(self, shares: list[tuple[str, int, str]], dur: float = STEP, gap: float = GAP, running: int | None = None,
             waiting: int = 0, blocked: int = BLOCKED_NONE, preempted: int = 0, skip_ids: int = 0,
             grammar: StepGrammar | None = None) -> None:
        self.next_id += skip_ids  # records that never arrived
        start = self.now + gap
        end = start + dur
        rec = StepRecord(self.next_id, start, end, [(r, n, k in "pP") for r, n, k in shares],
                         len(shares) if running is None else running, waiting, preempted, None,
                         queue_blocked=blocked)
        rec.grammar = grammar
        for rid, n, kind in shares:
            t = self.timelines[rid]
            if not t.steps or t.events[-1][0] == PREEMPTED:
                t.events.append((SCHEDULED, start))
            if self.telemetry is None:
                t.steps.append(self.next_id)
                if kind in "pP":
                    t.chunks.append(PrefillChunk(self.next_id, start, end, n))
            if kind in "Pd":
                t.token_ts.append(end)
        if self.telemetry is not None:
            self.telemetry.add_step(rec)
        else:
            prefill = sum(n for _, n, k in shares if k in "pP")
            self.window.add(rec, prefill, sum(1 for _, _, k in shares if k == "d"))
        self.next_id += 1
        self.now = end

    def preempt(self, rid: str) -> None:
        self.timelines[rid].events.append((PREEMPTED, self.now + GAP))

    def decode(self, rids: list[str], n: int, **kw) -> None:
        for _ in range(n):
            self.step([(r, 1, "d") for r in rids], **kw)

    def verdict(self, rid: str, *breached: str):
        return decide(self.timelines[rid], self.window, breached)


def start_decoding(sim: Sim, rids: list[str]) -> None:
    sim.arrive(*rids)
    sim.step([(r, 16, "P") for r in rids])


@pytest.mark.parametrize("blocked,cause", [(BLOCKED_MAX_SEQS, sc.SLOW_QUEUE_MAX_SEQS),
                                           (BLOCKED_KV_CACHE, sc.SLOW_QUEUE_KV_CACHE),
                                           (BLOCKED_TOKEN_BUDGET, sc.SLOW_QUEUE_TOKEN_BUDGET)])
def test_queueing_is_split_by_why_the_queue_did_not_move(blocked, cause):
    sim = Sim()
    runners = ["r0", "r1", "r2", "r3"]
    start_decoding(sim, runners)
    sim.decode(runners, 5)
    sim.arrive("w")
    sim.decode(runners, 20, waiting=1, blocked=blocked)
    sim.step([("w", 16, "P")])
    sim.decode(["w"], 5)
    v = sim.verdict("w", "ttft")
    assert v.cause == cause
    # 20 steps and the usual gap after each: the time it waited, all of it charged to the reason
    assert v.seconds[cause] == pytest.approx(20 * (STEP + GAP), abs=1e-6)
    assert v.seconds[sc.SLOW_ENGINE_STARVATION] == pytest.approx(0, abs=1e-9)
    for r in runners:  # they ran undisturbed: not blamed
        assert sim.verdict(r, "ttft", "tpot").cause == sc.SLOW_UNKNOWN


def test_waiting_for_a_reason_the_engine_did_not_name_is_unknown():
    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 5)
    sim.arrive("w")
    sim.decode(["r0"], 20, waiting=1, blocked=BLOCKED_OTHER)
    sim.step([("w", 16, "P")])
    v = sim.verdict("w", "ttft")
    assert v.cause == sc.SLOW_UNKNOWN and v.seconds[sc.SLOW_UNKNOWN] == pytest.approx(20 * (STEP + GAP), abs=1e-6)


def test_decode_steps_that_carry_another_prompt_are_prefill_interference():
    sim = Sim()
    decoders = ["d0", "d1", "d2", "d3"]
    start_decoding(sim, decoders)
    sim.decode(decoders, 30)
    sim.arrive("long")
    for _ in range(9):  # the long prompt's chunks ride along with the decodes, each step 30 ms longer
        sim.step([(d, 1, "d") for d in decoders] + [("long", 500, "p")], dur=STEP + 0.030)
    sim.step([(d, 1, "d") for d in decoders] + [("long", 500, "P")], dur=STEP + 0.030)
    sim.decode(decoders, 30)
    for d in decoders:
        v = sim.verdict(d, "tpot")
        assert v.cause == sc.SLOW_PREFILL_INTERFERENCE
        assert v.seconds[sc.SLOW_PREFILL_INTERFERENCE] == pytest.approx(10 * 0.030, abs=1e-6)
    # the long prompt's own time to first token is its own work, not interference: its chunks, spread over
    # ten steps it shared with the decodes, each cost 30 ms beyond a decode step of that batch, and a short
    # prompt would have been done after the first of them
    v = sim.verdict("long", "ttft")
    assert v.cause == sc.SLOW_OWN_PREFILL
    assert v.seconds[sc.SLOW_OWN_PREFILL] == pytest.approx(10 * 0.030 + 9 * STEP, abs=1e-6)
    assert v.seconds[sc.SLOW_PREFILL_INTERFERENCE] == 0


def test_the_interference_prompts_caused_is_what_their_victims_were_charged():
    """One baseline for both sides (verdict.prefill_loss): a prefill step's loss is read against the decode-only
    steps before it, so the seconds the long prompts are charged as caused equal the victims' charged seconds,
    even when the decode steps after the prompts cost more than those before them."""
    sim = Sim()
    decoders = ["d0", "d1", "d2", "d3"]
    start_decoding(sim, decoders)
    decodes = [(d, 1, "d") for d in decoders]
    sim.decode(decoders, 10, dur=0.010)
    sim.arrive("long0", "long1")
    sim.step(decodes + [("long0", 300, "P")], dur=0.050)  # 40 ms beyond the 10 ms decode step, per decoder
    sim.decode(decoders, 5, dur=0.012)
    sim.step(decodes + [("long1", 100, "p")], dur=0.030)  # the median before it is still 10 ms: 20 ms lost
    sim.step(decodes + [("long1", 200, "P")], dur=0.040)  # 30 ms lost
    sim.decode(decoders, 30, dur=0.020)  # slower afterwards: no baseline of the steps before a prompt
    charged = [sim.verdict(d, "tpot").seconds[sc.SLOW_PREFILL_INTERFERENCE] for d in decoders]
    assert charged == pytest.approx([0.040 + 0.020 + 0.030] * len(decoders), abs=1e-9)
    caused = {rid: interference_caused(sim.timelines[rid].chunks, sim.window) for rid in ("long0", "long1")}
    assert caused == pytest.approx({"long0": 0.040 * 4, "long1": (0.020 + 0.030) * 4}, abs=1e-9)
    assert sum(caused.values()) == pytest.approx(sum(charged), abs=1e-9)


def test_steps_that_skip_a_running_request_for_others_prefill_count_whole():
    sim = Sim()
    start_decoding(sim, ["a"])
    sim.decode(["a"], 10)
    sim.arrive("long")
    sim.step([("long", 64, "p")], dur=0.05, running=2)  # the token budget went to the prompt, "a" sat out
    sim.step([("long", 64, "P")], dur=0.05, running=2)
    sim.decode(["a", "long"], 10)
    v = sim.verdict("a", "tpot")
    assert v.cause == sc.SLOW_PREFILL_INTERFERENCE and v.seconds[v.cause] == pytest.approx(0.1, abs=1e-6)


def test_preemption_costs_until_the_request_caught_up():
    sim = Sim()
    start_decoding(sim, ["a", "b"])
    sim.decode(["a", "b"], 10)
    sim.preempt("b")
    before = sim.now + GAP
    sim.decode(["a"], 8, preempted=1, waiting=1, blocked=BLOCKED_KV_CACHE)
    sim.step([("a", 1, "d"), ("b", 27, "P")])  # recompute: prompt and its tokens so far
    caught_up = sim.now
    sim.decode(["a", "b"], 10)
    v = sim.verdict("b", "tpot")
    assert v.cause == sc.SLOW_PREEMPTION
    assert v.seconds[sc.SLOW_PREEMPTION] == pytest.approx(caught_up - before, abs=1e-9)
    assert v.seconds[sc.SLOW_QUEUE_KV_CACHE] == 0  # its wait after the preemption is the preemption's
    assert sim.verdict("a", "tpot").cause == sc.SLOW_UNKNOWN


def test_a_batch_that_grew_slows_its_decode_steps():
    sim = Sim()
    start_decoding(sim, ["a"])
    sim.decode(["a"], 10)
    joiners = [f"j{i}" for i in range(7)]
    sim.arrive(*joiners)
    sim.step([("a", 1, "d")] + [(j, 16, "P") for j in joiners], dur=STEP + 0.002)
    sim.decode(["a", *joiners], 30, dur=0.025)
    v = sim.verdict("a", "tpot")
    assert v.cause == sc.SLOW_BATCH_GROWTH
    assert v.seconds[sc.SLOW_BATCH_GROWTH] == pytest.approx(30 * 0.015, abs=1e-6)


def test_idle_gaps_between_steps_are_engine_starvation():
    sim = Sim()
    start_decoding(sim, ["a"])
    sim.decode(["a"], 20)
    sim.decode(["a"], 10, gap=0.050)
    v = sim.verdict("a", "tpot")
    assert v.cause == sc.SLOW_ENGINE_STARVATION
    assert v.seconds[v.cause] == pytest.approx(10 * (0.050 - GAP), abs=1e-6)


def test_an_engine_that_sat_idle_while_a_request_waited_is_starvation():
    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 10)
    sim.arrive("w")  # the engine is between steps, and stays idle for 200 ms
    sim.step([("r0", 1, "d"), ("w", 16, "P")], gap=0.200)
    v = sim.verdict("w", "ttft")
    assert v.cause == sc.SLOW_ENGINE_STARVATION
    assert v.seconds[v.cause] == pytest.approx(0.200 - GAP, abs=1e-6)


def test_missing_step_records_are_unknown_not_starvation():
    sim = Sim()
    start_decoding(sim, ["a"])
    sim.decode(["a"], 20)
    for _ in range(10):
        sim.step([("a", 1, "d")], gap=0.050, skip_ids=1)  # a step's record was dropped in each gap
    v = sim.verdict("a", "tpot")
    assert v.cause == sc.SLOW_UNKNOWN
    assert v.seconds[sc.SLOW_ENGINE_STARVATION] == 0 and v.seconds[sc.SLOW_UNKNOWN] > 0.4


def test_no_recorded_steps_means_unknown():
    t = RequestTimeline("x", time.time())
    t.events.append((QUEUED, 1.0))
    t.token_ts += [2.0, 2.1]
    v = decide(t, StepWindow(), ("ttft",))
    assert v.cause == sc.SLOW_UNKNOWN and set(v.attributes()) == {sc.SLOW_CAUSE, *sc.SLOW_SECONDS.values()}


def test_the_breached_objective_chooses_the_phases_judged():
    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 5)
    sim.arrive("w")
    sim.decode(["r0"], 20, waiting=1, blocked=BLOCKED_MAX_SEQS)
    sim.step([("w", 16, "P")])
    sim.decode(["w"], 20, gap=0.050)
    assert sim.verdict("w", "ttft").cause == sc.SLOW_QUEUE_MAX_SEQS
    tpot = sim.verdict("w", "tpot")
    assert tpot.cause == sc.SLOW_ENGINE_STARVATION and tpot.seconds[sc.SLOW_QUEUE_MAX_SEQS] == 0


def test_queue_time_older_than_the_window_is_unknown():
    sim = Sim()
    sim.window = StepWindow(size=16)
    start_decoding(sim, ["r0"])
    sim.arrive("w")
    sim.decode(["r0"], 20, waiting=1, blocked=BLOCKED_MAX_SEQS)
    sim.step([("w", 16, "P")])
    v = sim.verdict("w", "ttft")
    assert v.cause == sc.SLOW_QUEUE_MAX_SEQS  # the 15 steps it still sees outweigh the 5 it does not
    assert v.seconds[sc.SLOW_QUEUE_MAX_SEQS] == pytest.approx(15 * (STEP + GAP), abs=1e-6)
    assert v.seconds[sc.SLOW_UNKNOWN] == pytest.approx(GAP + 5 * (STEP + GAP), abs=1e-6)  # from its arrival


def test_the_window_forgets_old_steps_and_then_cannot_decide():
    sim = Sim()
    sim.window = StepWindow(size=16)
    start_decoding(sim, ["a"])
    sim.decode(["a"], 40)
    assert sim.verdict("a", "tpot").cause == sc.SLOW_UNKNOWN


# -- in the pipeline ---------------------------------------------------------------------------


def test_kept_requests_carry_the_verdict_and_breaches_are_counted_by_cause():
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    tele = Pipeline(Config.resolve({"slo": "ttft=0.1", "sample_rate": 0.0, "tail_quantile": 0}, environ={}),
                     tp.get_tracer("t"), mp.get_meter("t"), "test")
    sim = Sim(tele)
    runners = ["r0", "r1"]
    start_decoding(sim, runners)
    sim.decode(runners, 5)
    sim.arrive("w")
    sim.decode(runners, 20, waiting=1, blocked=BLOCKED_MAX_SEQS)
    sim.step([("w", 16, "P")])
    sim.decode(["w"], 3)
    for rid, t in sim.timelines.items():
        queued, first = t.first(QUEUED), t.token_ts[0]
        tele.finish(rid, RequestSummary(model="m", ttft=first - queued, e2e=t.token_ts[-1] - queued,
                                        output_tokens=len(t.token_ts)))
    assert tele.flush(10)
    spans = {s.attributes[sc.RESPONSE_ID]: s for s in exporter.get_finished_spans()
             if s.attributes and sc.RESPONSE_ID in s.attributes}
    assert set(spans) == {"w"}  # only the breach was kept
    a = spans["w"].attributes
    assert a[sc.SLOW_CAUSE] == sc.SLOW_QUEUE_MAX_SEQS
    assert a[sc.SLOW_SECONDS[sc.SLOW_QUEUE_MAX_SEQS]] == pytest.approx(20 * (STEP + GAP), abs=1e-5)
    points = points_by_name(reader.get_metrics_data())[SERVER_METRICS.slo_breaches]
    assert [(p.attributes[sc.SLO_OBJECTIVE], p.attributes[sc.SLOW_CAUSE], p.value) for p in points] == [
        ("ttft", sc.SLOW_QUEUE_MAX_SEQS, 1)]
    tele.close()


def test_requests_kept_by_the_baseline_get_no_verdict():
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tele = Pipeline(Config.resolve({"sample_rate": 1.0, "tail_quantile": 0}, environ={}), tp.get_tracer("t"),
                     MeterProvider().get_meter("t"), "test")
    sim = Sim(tele)
    start_decoding(sim, ["a"])
    sim.decode(["a"], 3)
    t = sim.timelines["a"]
    tele.finish("a", RequestSummary(model="m", ttft=0.01, e2e=0.05, output_tokens=4))
    assert tele.flush(10)
    (span,) = [s for s in exporter.get_finished_spans() if s.attributes and sc.RESPONSE_ID in s.attributes]
    assert span.attributes[sc.SAMPLING_REASON] == "baseline" and t.request_id == "a"
    assert not [k for k in span.attributes if k.startswith("llm.slow.")]
    tele.close()


def test_the_breach_counter_reads_the_cause_from_the_span_attribute():
    """The collector's derivation: a summary rebuilt from a request span's attributes (the collector's batch
    recorder is held against this one in tests/collector/test_aggregation.py)."""
    reader = InMemoryMetricReader()
    metrics = ServerMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), SLOTable.parse("ttft=0.1,tpot=0.01"))
    base = {sc.REQUEST_MODEL: "m", sc.LATENCY_E2E: 2.0, sc.LATENCY_TTFT: 0.5, sc.LATENCY_TPOT: 0.02}
    summaries = [RequestSummary.from_attributes({**base, sc.SLOW_CAUSE: sc.SLOW_QUEUE_KV_CACHE}),
                 RequestSummary.from_attributes({**base, sc.SLOW_CAUSE: "made-up"}),
                 RequestSummary.from_attributes(base)]
    assert summaries[0].slow_cause == sc.SLOW_QUEUE_KV_CACHE
    for s in summaries:
        metrics.record(s)
    got = sorted((p.attributes[sc.SLO_OBJECTIVE], p.attributes[sc.SLOW_CAUSE], p.value)
                 for p in points_by_name(reader.get_metrics_data())[SERVER_METRICS.slo_breaches])
    assert got == [("tpot", sc.SLOW_QUEUE_KV_CACHE, 1), ("tpot", sc.SLOW_UNKNOWN, 2),
                   ("ttft", sc.SLOW_QUEUE_KV_CACHE, 1), ("ttft", sc.SLOW_UNKNOWN, 2)]


# -- why the queue stayed put, as the vLLM scheduler hook decides it ----------------------------


def _scheduler(running: int, scheduled_tokens: int, head_tokens: int, free_blocks: int):
    from types import SimpleNamespace as NS

    head = NS(num_tokens=head_tokens, num_computed_tokens=0)
    waiting = NS(peek_request=lambda: head)
    pool = NS(get_num_free_blocks=lambda: free_blocks)
    scheduler = NS(max_num_running_reqs=4, max_num_active_reqs=4, max_num_scheduled_tokens=256, block_size=32,
                   waiting=waiting, kv_cache_manager=NS(block_pool=pool))
    return scheduler, NS(total_num_scheduled_tokens=scheduled_tokens), running


@pytest.mark.parametrize("state,preempted,blocked", [
    ((4, 100, 70, 0), 1, BLOCKED_KV_CACHE),  # a step that preempted admits nobody: KV, whatever else holds
    ((4, 256, 70, 0), 0, BLOCKED_MAX_SEQS),  # the batch is full first
    ((2, 256, 70, 0), 0, BLOCKED_TOKEN_BUDGET),
    ((2, 100, 70, 2), 0, BLOCKED_KV_CACHE),  # 70 tokens need 3 blocks, 2 are free
    ((2, 100, 70, 3), 0, BLOCKED_OTHER),  # it would fit: something we do not model held it
])
def test_the_scheduler_hook_names_the_first_limit_admission_hit(state, preempted, blocked):
    from otel_llm.instrumentation.vllm.step_hooks import _queue_blocked

    running, tokens, head, free = state
    scheduler, out, running = _scheduler(running, tokens, head, free)
    assert _queue_blocked(scheduler, out, running, 1, preempted) == blocked


# -- what production hits outside the batch: grammars, the frontend, a request's own size ---------


def test_a_long_prompt_alone_is_its_own_prefill_beyond_a_short_prompts():
    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 5)  # decode-only steps of one request: what a step of a few tokens costs
    sim.arrive("long")
    sim.step([("long", 2000, "P")], dur=STEP + 0.200)
    sim.decode(["long"], 3)
    v = sim.verdict("long", "ttft")
    assert v.cause == sc.SLOW_OWN_PREFILL
    assert v.seconds[sc.SLOW_OWN_PREFILL] == pytest.approx(0.200, abs=1e-6)


def test_a_chunked_prompt_alone_is_charged_every_step_but_what_one_short_prompt_step_costs():
    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 5)  # decode-only steps of one request: what a short prompt's step costs (STEP)
    sim.arrive("long")
    for _ in range(2):
        sim.step([("long", 512, "p")], dur=STEP + 0.020)
    sim.step([("long", 476, "P")], dur=STEP + 0.018)
    sim.decode(["long"], 3)
    v = sim.verdict("long", "ttft")
    assert v.cause == sc.SLOW_OWN_PREFILL
    # without its length it would have taken one step of STEP: the rest of its three steps is its own
    assert v.seconds[sc.SLOW_OWN_PREFILL] == pytest.approx(3 * STEP + 0.058 - STEP, abs=1e-6)


def test_a_prompt_sharing_its_prefill_step_is_charged_its_own_share_only():
    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 5)
    sim.arrive("a", "b")
    sim.step([("a", 1500, "P"), ("b", 500, "P")], dur=STEP + 0.200)
    sim.decode(["a", "b"], 3)
    assert sim.verdict("a", "ttft").seconds[sc.SLOW_OWN_PREFILL] == pytest.approx(0.150, abs=1e-6)
    assert sim.verdict("b", "ttft").seconds[sc.SLOW_OWN_PREFILL] == pytest.approx(0.050, abs=1e-6)


def test_a_long_generation_at_a_normal_tpot_is_its_own_length():
    from otel_llm.core.slo import SLO

    sim = Sim()
    start_decoding(sim, ["g"])
    sim.decode(["g"], 100)  # 100 decode steps of 11 ms each: 1.1 s after the first token
    slo = SLO(tpot=0.05, e2e=0.5)
    t = sim.timelines["g"]
    v = decide(t, sim.window, ("e2e",), slo)
    ttft = t.token_ts[0] - t.first(QUEUED)
    decode = t.token_ts[-1] - t.token_ts[0]
    assert v.cause == sc.SLOW_OWN_LENGTH
    assert v.seconds[sc.SLOW_OWN_LENGTH] == pytest.approx(decode - (0.5 - ttft), abs=1e-6)
    # a TPOT breach is the steps' fault, not its length: own_length is not charged then
    assert decide(t, sim.window, ("e2e", "tpot"), slo).seconds[sc.SLOW_OWN_LENGTH] == 0


def test_own_length_leaves_out_what_other_causes_explain_after_the_first_token():
    from otel_llm.core.slo import SLO

    sim = Sim()
    decoders = ["d0", "d1"]
    start_decoding(sim, decoders)
    sim.decode(decoders, 30)
    sim.arrive("long")
    sim.step([(d, 1, "d") for d in decoders] + [("long", 500, "P")], dur=STEP + 0.300)
    sim.decode(decoders, 30)
    t = sim.timelines["d0"]
    v = decide(t, sim.window, ("e2e",), SLO(tpot=1.0, e2e=0.2))
    assert v.seconds[sc.SLOW_PREFILL_INTERFERENCE] == pytest.approx(0.300, abs=1e-6)
    decode = t.token_ts[-1] - t.token_ts[0]
    ttft = t.token_ts[0] - t.first(QUEUED)
    assert v.seconds[sc.SLOW_OWN_LENGTH] == pytest.approx(decode - (0.2 - ttft) - 0.300, abs=1e-6)


def test_waiting_for_a_grammar_is_charged_per_request_to_the_requests_with_one():
    from otel_llm.core.timeline import BLOCKED_STRUCTURED_OUTPUT

    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 5)
    sim.arrive("json", "plain")
    sim.timelines["json"].request_attributes[sc.STRUCTURED_OUTPUT_BACKEND] = "xgrammar"
    sim.step([("r0", 1, "d"), ("plain", 16, "P")], waiting=1, blocked=BLOCKED_STRUCTURED_OUTPUT)
    sim.decode(["r0", "plain"], 12, waiting=1, blocked=BLOCKED_STRUCTURED_OUTPUT)
    sim.step([("json", 16, "P")])
    sim.decode(["json"], 3)
    v = sim.verdict("json", "ttft")
    assert v.cause == sc.SLOW_QUEUE_STRUCTURED_OUTPUT
    assert v.seconds[sc.SLOW_QUEUE_STRUCTURED_OUTPUT] == pytest.approx(13 * (STEP + GAP), abs=1e-6)
    assert sim.verdict("plain", "ttft").seconds[sc.SLOW_QUEUE_STRUCTURED_OUTPUT] == 0


def test_a_request_with_no_grammar_waiting_in_a_grammar_step_is_unknown():
    from otel_llm.core.timeline import BLOCKED_STRUCTURED_OUTPUT

    sim = Sim()
    start_decoding(sim, ["r0"])
    sim.decode(["r0"], 5)
    sim.arrive("w")
    sim.decode(["r0"], 10, waiting=2, blocked=BLOCKED_STRUCTURED_OUTPUT)
    sim.step([("w", 16, "P")])
    v = sim.verdict("w", "ttft")
    assert v.cause == sc.SLOW_UNKNOWN and v.seconds[sc.SLOW_QUEUE_STRUCTURED_OUTPUT] == 0


def _handed_over(sim: Sim, rid: str, handover: float, tokens: int = 100) -> None:
    """Arrived ``handover`` seconds before the engine queued it (wall clock = engine clock + 1000 here)."""
    sim.arrive(rid)
    t = sim.timelines[rid]
    t.arrival = sim.now + 1000.0 - handover
    t.input_tokens = tokens


def test_a_frontend_slower_than_for_comparable_requests_is_the_frontend():
    from otel_llm.core.diagnosis.verdict import note_frontend

    sim = Sim()
    sim.window.wall_offset = lambda: 1000.0  # injected: the wall clock reads the engine clock + 1000 s
    start_decoding(sim, ["r0"])
    for i in range(8):  # comparable requests, handed over in 5 ms
        _handed_over(sim, f"c{i}", 0.005)
        sim.step([("r0", 1, "d"), (f"c{i}", 16, "P")])
        note_frontend(sim.timelines[f"c{i}"], sim.window)
    _handed_over(sim, "late", 0.405)
    sim.step([("r0", 1, "d"), ("late", 16, "P")])
    sim.decode(["r0", "late"], 3)
    v = sim.verdict("late", "ttft")
    assert v.cause == sc.SLOW_FRONTEND
    assert v.seconds[sc.SLOW_FRONTEND] == pytest.approx(0.400, abs=1e-6)
    # a long prompt is compared with long prompts: its own tokenization is its own work
    _handed_over(sim, "big", 0.405, tokens=30000)
    sim.step([("r0", 1, "d"), ("big", 16, "P")])
    sim.decode(["r0", "big"], 3)
    assert sim.verdict("big", "ttft").seconds[sc.SLOW_FRONTEND] == 0
    # the frontend is judged for TTFT only
    assert sim.verdict("late", "tpot").seconds[sc.SLOW_FRONTEND] == 0


def test_the_scheduler_hook_names_grammar_waits_where_no_limit_held_the_queue():
    from types import SimpleNamespace as NS

    from otel_llm.core.timeline import BLOCKED_STRUCTURED_OUTPUT
    from otel_llm.instrumentation.vllm.step_hooks import _queue_blocked

    scheduler, out, running = _scheduler(2, 100, 70, 3)
    grammar, remote = NS(name="WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR"), NS(name="WAITING_FOR_REMOTE_KVS")
    scheduler.deferred_waiting = [NS(status=remote)]
    assert _queue_blocked(scheduler, out, running, 1, 0) == BLOCKED_OTHER
    scheduler.deferred_waiting = [NS(status=remote), NS(status=grammar)]
    assert _queue_blocked(scheduler, out, running, 2, 0) == BLOCKED_STRUCTURED_OUTPUT
    # a limit that stopped admission comes first: the grammar request was never looked at
    scheduler, out, running = _scheduler(4, 100, 70, 3)
    scheduler.deferred_waiting = [NS(status=grammar)]
    assert _queue_blocked(scheduler, out, running, 1, 0) == BLOCKED_MAX_SEQS


def test_a_request_with_a_grammar_is_compared_with_requests_that_had_one():
    from otel_llm.core.diagnosis.verdict import note_frontend

    sim = Sim()
    sim.window.wall_offset = lambda: 1000.0
    start_decoding(sim, ["r0"])
    for i in range(8):  # plain requests handed over in 5 ms; requests with a schema to validate in 50 ms
        for rid, took, schema in ((f"c{i}", 0.005, False), (f"j{i}", 0.050, True)):
            _handed_over(sim, rid, took)
            if schema:
                sim.timelines[rid].request_attributes[sc.STRUCTURED_OUTPUT_BACKEND] = "xgrammar"
            sim.step([("r0", 1, "d"), (rid, 16, "P")])
            note_frontend(sim.timelines[rid], sim.window)
    for rid, took in (("json", 0.150), ("usual", 0.090)):  # 3x the usual schema hand-over; under 2x: jitter
        _handed_over(sim, rid, took)
        sim.timelines[rid].request_attributes[sc.STRUCTURED_OUTPUT_BACKEND] = "xgrammar"
        sim.step([("r0", 1, "d"), (rid, 16, "P")])
    assert sim.verdict("json", "ttft").seconds[sc.SLOW_FRONTEND] == pytest.approx(0.100, abs=1e-6)
    assert sim.verdict("usual", "ttft").seconds[sc.SLOW_FRONTEND] == 0


# -- the grammar bitmask: charged to the others of its steps, beyond a comparable step without one ------

def _structured(sim: Sim, rids: list[str], grammar: set[str]) -> None:
    sim.arrive(*rids)
    for rid in grammar:
        sim.timelines[rid].request_attributes[sc.STRUCTURED_OUTPUT_BACKEND] = "xgrammar"
    sim.step([(r, 16, "P") for r in rids])


def test_a_grammar_bitmask_is_charged_to_the_other_requests_of_its_decode_steps():
    """4 decoders, 2 with a grammar: 10 steps without a bitmask (the baseline), 10 whose 4 ms bitmask made the
    step 3 ms longer, 5 that took 8 ms longer (the bitmask's 4 ms at most is its)."""
    rids, shaped = ["p0", "p1", "j0", "j1"], {"j0", "j1"}
    sim = Sim()
    _structured(sim, rids, shaped)
    sim.decode(rids, 10)
    sim.decode(rids, 10, dur=STEP + 0.003, grammar=StepGrammar(0.004, 2))
    sim.decode(rids, 5, dur=STEP + 0.008, grammar=StepGrammar(0.004, 2))
    expected = 10 * 0.003 + 5 * 0.004
    plain = sim.verdict("p0", "tpot")
    assert plain.seconds[sc.SLOW_GRAMMAR_INTERFERENCE] == pytest.approx(expected, abs=1e-6)
    assert plain.cause == sc.SLOW_GRAMMAR_INTERFERENCE
    # a request with a grammar: only the other structured request's half of the mask
    assert sim.verdict("j0", "tpot").seconds[sc.SLOW_GRAMMAR_INTERFERENCE] == pytest.approx(expected / 2, abs=1e-6)
    assert sim.verdict("p0", "ttft").seconds[sc.SLOW_GRAMMAR_INTERFERENCE] == 0  # after its first token only


def test_a_lone_structured_request_is_not_charged_its_own_mask():
    sim = Sim()
    _structured(sim, ["p0", "j0"], {"j0"})
    sim.decode(["p0", "j0"], 10)
    sim.decode(["p0", "j0"], 10, dur=STEP + 0.003, grammar=StepGrammar(0.004, 1))
    assert sim.verdict("j0", "tpot").seconds[sc.SLOW_GRAMMAR_INTERFERENCE] == 0
    assert sim.verdict("p0", "tpot").seconds[sc.SLOW_GRAMMAR_INTERFERENCE] == pytest.approx(0.03, abs=1e-6)


def test_a_bitmask_with_no_comparable_step_or_beside_a_prefill_charges_no_grammar():
    """Every decode step had a bitmask: nothing to compare with. A step that also prefilled: the mask was computed
    while the longer forward ran, the excess is the prefill's."""
    sim = Sim()
    _structured(sim, ["p0", "j0"], {"j0"})
    sim.decode(["p0", "j0"], 10, dur=STEP + 0.003, grammar=StepGrammar(0.004, 1))
    assert sim.verdict("p0", "tpot").seconds[sc.SLOW_GRAMMAR_INTERFERENCE] == 0
    sim = Sim()
    _structured(sim, ["p0", "j0"], {"j0"})
    sim.decode(["p0", "j0"], 10)
    sim.arrive("late")
    sim.step([("p0", 1, "d"), ("j0", 1, "d"), ("late", 64, "P")], dur=STEP + 0.02, grammar=StepGrammar(0.004, 1))
    v = sim.verdict("p0", "tpot")
    assert v.seconds[sc.SLOW_GRAMMAR_INTERFERENCE] == 0
    assert v.seconds[sc.SLOW_PREFILL_INTERFERENCE] == pytest.approx(0.02, abs=1e-6)


def test_the_pipeline_puts_each_requests_cache_hit_on_it_from_its_first_step():
    tele = Pipeline(Config.resolve({"sample_rate": 0.0, "tail_quantile": 0}, environ={}),
                    TracerProvider().get_tracer("t"), MeterProvider().get_meter("t"), "test")
    sim = Sim(tele)
    sim.arrive("hit", "miss", "plain")
    sim.step([("hit", 8, "P"), ("miss", 8, "P"), ("plain", 8, "P")], grammar=StepGrammar(None, 0, (0,), (1,)))
    a = {rid: t.request_attributes for rid, t in sim.timelines.items()}
    assert a["hit"][sc.STRUCTURED_OUTPUT_CACHE_HIT] is True and a["miss"][sc.STRUCTURED_OUTPUT_CACHE_HIT] is False
    assert sc.STRUCTURED_OUTPUT_CACHE_HIT not in a["plain"]
    tele.close()


def test_a_hand_over_excess_below_the_declared_floor_is_not_charged():
    """Below the floor (causes.py) an excess cannot be told from the host's scheduling: a control whose TTFT is
    a few steps is never judged ``frontend`` for a hand-over a little longer than its neighbours'."""
    from otel_llm.core.diagnosis.causes import BY_NAME
    from otel_llm.core.diagnosis.verdict import note_frontend

    floor = BY_NAME[sc.SLOW_FRONTEND].floor
    assert floor > 0 and BY_NAME[sc.SLOW_FRONTEND].floor_reason
    sim = Sim()
    sim.window.wall_offset = lambda: 1000.0
    start_decoding(sim, ["r0"])
    for i in range(8):  # comparable requests, handed over in 2 ms
        _handed_over(sim, f"c{i}", 0.002)
        sim.step([("r0", 1, "d"), (f"c{i}", 16, "P")])
        note_frontend(sim.timelines[f"c{i}"], sim.window)
    for rid, took in (("jitter", 0.002 + floor * 0.9), ("busy", 0.002 + floor * 1.5)):
        _handed_over(sim, rid, took)
        sim.step([("r0", 1, "d"), (rid, 16, "P")])
    jitter = sim.verdict("jitter", "ttft")  # 25x the usual hand-over, yet under the floor
    assert jitter.seconds[sc.SLOW_FRONTEND] == 0 and jitter.cause != sc.SLOW_FRONTEND
    busy = sim.verdict("busy", "ttft")
    assert busy.cause == sc.SLOW_FRONTEND and busy.seconds[sc.SLOW_FRONTEND] == pytest.approx(floor * 1.5, abs=1e-6)


def _outputs(sim: Sim, rid: str, first_delay: float | None, last_delay: float | None) -> None:
    """Its frontend received its first and last output this long after the engine's stamps (wall = engine + 1000)."""
    t = sim.timelines[rid]
    t.first_output = t.token_ts[0] + 1000.0 + first_delay if first_delay is not None else None
    t.last_output = t.token_ts[-1] + 1000.0 + last_delay if last_delay is not None else None


def test_a_frontend_slow_to_take_the_output_is_the_frontend_for_ttft_and_e2e():
    from otel_llm.core.diagnosis.verdict import note_frontend, output_delays

    sim = Sim()
    sim.window.wall_offset = lambda: 1000.0
    start_decoding(sim, ["r0"])
    for i in range(8):  # comparable requests: their outputs reached the frontend 3 ms after the engine's stamps
        _handed_over(sim, f"c{i}", 0.002)
        sim.step([("r0", 1, "d"), (f"c{i}", 16, "P")])
        sim.decode(["r0", f"c{i}"], 2)
        _outputs(sim, f"c{i}", 0.003, 0.003)
        note_frontend(sim.timelines[f"c{i}"], sim.window)
    for rid, first, last in (("late_first", 0.503, 0.003), ("late_last", 0.003, 0.803), ("rust", None, None)):
        _handed_over(sim, rid, 0.002)
        sim.step([("r0", 1, "d"), (rid, 16, "P")])
        sim.decode(["r0", rid], 2)
        _outputs(sim, rid, first, last)
    assert output_delays(sim.timelines["late_first"], sim.window) == pytest.approx((0.503, 0.003))
    v = sim.verdict("late_first", "ttft")  # its TTFT ends at the frontend's receipt of the first output
    assert v.cause == sc.SLOW_FRONTEND and v.seconds[sc.SLOW_FRONTEND] == pytest.approx(0.500, abs=1e-6)
    assert sim.verdict("late_first", "e2e").seconds[sc.SLOW_FRONTEND] == 0  # its e2e ends at the last output
    assert sim.verdict("late_first", "tpot").seconds[sc.SLOW_FRONTEND] == 0  # TPOT: engine stamps only
    v = sim.verdict("late_last", "e2e")
    assert v.cause == sc.SLOW_FRONTEND and v.seconds[sc.SLOW_FRONTEND] == pytest.approx(0.800, abs=1e-6)
    assert sim.verdict("late_last", "ttft").seconds[sc.SLOW_FRONTEND] == 0
    assert sim.verdict("late_last").seconds[sc.SLOW_FRONTEND] == pytest.approx(0.800, abs=1e-6)  # kept as slow
    # no Python frontend received its outputs (the Rust frontend): the output side stays silent, nothing guessed
    assert output_delays(sim.timelines["rust"], sim.window) == (None, None)
    for objective in ("ttft", "e2e"):
        assert sim.verdict("rust", objective).seconds[sc.SLOW_FRONTEND] == 0


def test_an_output_delay_within_the_floor_or_without_a_baseline_is_not_charged():
    from otel_llm.core.diagnosis.causes import BY_NAME
    from otel_llm.core.diagnosis.verdict import note_frontend

    floor = BY_NAME[sc.SLOW_FRONTEND].floor
    sim = Sim()
    sim.window.wall_offset = lambda: 1000.0
    start_decoding(sim, ["r0"])
    _handed_over(sim, "first", 0.002)
    sim.step([("r0", 1, "d"), ("first", 16, "P")])
    _outputs(sim, "first", 0.5, 0.5)
    assert sim.verdict("first", "ttft", "e2e").seconds[sc.SLOW_FRONTEND] == 0  # nothing to compare with yet
    for i in range(8):
        _handed_over(sim, f"c{i}", 0.002)
        sim.step([("r0", 1, "d"), (f"c{i}", 16, "P")])
        _outputs(sim, f"c{i}", 0.001, 0.001)
        note_frontend(sim.timelines[f"c{i}"], sim.window)
    _handed_over(sim, "jitter", 0.002)
    sim.step([("r0", 1, "d"), ("jitter", 16, "P")])
    _outputs(sim, "jitter", floor * 0.9, floor * 0.9)
    v = sim.verdict("jitter", "ttft", "e2e")
    assert v.seconds[sc.SLOW_FRONTEND] == 0 and v.cause != sc.SLOW_FRONTEND
