"""The slow-cause verdict on the real engine: three engineered scenarios, each request judged against
what the recorded engine steps show happened to it (EngineCore in this process, so the steps run
exactly when the test adds requests).

Which requests a scenario affected is read from the engine-step spans (running and waiting counts,
prefill tokens, preemptions as the scheduler reported them), not from the verdict; the assertions
are on what our code decided from those facts, never on speeds. Every SLO is 1 µs, so every request
breaches and is judged.
"""

from __future__ import annotations

import gc
import json
from statistics import median
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_llm import semconv as sc
from otel_llm.core.diagnosis.verdict import MIN_SHARE
from support.schemas import large_json_schema
from support.traces import engine_steps, request_trees

pytestmark = pytest.mark.engine

TINY_SLO = 1e-6


@dataclass
class Judged:
    cause: str
    seconds: dict[str, float]
    queued: int  # ns, the engine's QUEUED stamp
    scheduled: int  # ns, first scheduled (the prefill span's start)
    first_token: int  # ns (the decode span's start)
    preemptions: int


def judged(spans) -> tuple[dict[str, Judged], list]:
    out = {}
    for rid, t in request_trees(spans).items():
        a = t.attributes
        if sc.SLOW_CAUSE not in a:  # breached nothing (the long prompt has no TPOT): not judged
            continue
        queue = t.one(sc.SPAN_QUEUE)
        queued = next(e.timestamp for e in queue.events if e.name == sc.EVENT_ENGINE_QUEUED)
        out[rid] = Judged(a[sc.SLOW_CAUSE], {c: a[sc.SLOW_SECONDS[c]] for c in sc.SLOW_CAUSES}, queued,
                          t.one(sc.SPAN_PREFILL).start_time, t.one(sc.SPAN_DECODE).start_time,
                          a[sc.NUM_PREEMPTIONS])
    return out, sorted(engine_steps(spans), key=lambda s: s.start_time)


def waited_through(j: Judged, steps) -> list:
    """The engine steps that ran, start to end, while the request sat in the queue before it was first scheduled."""
    return [s for s in steps if s.start_time >= j.queued and s.end_time <= j.scheduled]


def assert_classified(judgements: dict[str, Judged], affected: set[str], expected: set[str],
                      touched: set[str] | None = None) -> None:
    """At least 90 % of the affected requests get an expected cause; requests the scenario did not
    touch at all (by default: all the others) get none of them."""
    right = [rid for rid in affected if judgements[rid].cause in expected]
    assert len(right) >= 0.9 * len(affected), f"affected {sorted(affected)}, judged {judgements}"
    for rid, j in judgements.items():
        if rid not in (affected if touched is None else touched):
            assert j.cause not in expected, f"{rid} was not affected, yet blamed: {j}"


def _params(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


def _prompt(i: int, n: int) -> dict:
    return {"prompt_token_ids": [5 + (i * 7 + j) % 400 for j in range(n)]}


def _drain(engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


# -- (a) one very long prompt arriving among steady decodes ------------------------------------

DECODERS, EARLY = [f"d{i}" for i in range(7)], ["e0", "e1"]


LONG = 3000  # tokens: its prefill step costs many decode steps, whatever the machine's load


@pytest.fixture(scope="module")
def long_prompt_run(otel, tmp_path_factory):
    from support.engine import in_process, make_llm
    from support.tiny_model import ensure_tiny_model

    model = Path(ensure_tiny_model(tmp_path_factory.mktemp("long-context")))  # the tiny model, longer positions
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    with in_process(), otel.instrumented(slo=f"tpot={TINY_SLO}", sample_rate=1.0, tail_quantile=0):
        # the long prompt is prefilled in one step, alongside the decodes
        llm = make_llm(model=str(model), max_num_seqs=16, max_num_batched_tokens=4096, max_model_len=4096)
        engine = llm.llm_engine
        for i, rid in enumerate(DECODERS + EARLY):
            engine.add_request(rid, _prompt(i, 16), _params(12 if rid in DECODERS else 3))
        for _ in range(6):  # all prefilled at the first step, then decoding; the early ones finish
            engine.step()
        engine.add_request("long", _prompt(99, LONG), _params(1))  # one token: it never joins the decodes
        _drain(engine)
        spans = otel.finished()
        del llm, engine
    gc.collect()
    return spans


def test_a_long_prompt_among_decodes_is_prefill_interference_for_the_decoders(long_prompt_run):
    judgements, steps = judged(long_prompt_run)
    affected = set()
    for rid, j in judgements.items():
        # decoding (after its first token) in a step that also prefilled someone's prompt
        if any(s.start_time >= j.first_token and s.attributes[sc.STEP_NUM_PREFILL_TOKENS] > 0 for s in steps
               if s.end_time <= _last_token(long_prompt_run, rid)):
            affected.add(rid)
    assert affected == set(DECODERS), "the scenario did not run as built"
    assert_classified(judgements, affected, {sc.SLOW_PREFILL_INTERFERENCE})
    for rid in affected:
        assert judgements[rid].seconds[sc.SLOW_PREFILL_INTERFERENCE] > 0


def test_the_long_prompt_is_charged_the_interference_it_caused(long_prompt_run):
    """Who caused it (core/diagnosis/engine_time.py): the decoders' loss in the long prompt's step, by the
    verdict's own rule (the step's time minus the median decode-only step of its decode batch size, per
    decoder), all goes to the one request whose prefill ran there; no other request caused any, and the
    decoders' verdicts charged that step to prefill_interference: together, what the long prompt caused (one
    baseline for both, the decode-only steps before the step: verdict.prefill_loss)."""
    judgements, steps = judged(long_prompt_run)
    trees = request_trees(long_prompt_run)
    caused = {rid: t.attributes[sc.REQUEST_INTERFERENCE_CAUSED] for rid, t in trees.items()}
    assert sum(v for rid, v in caused.items() if rid != "long") == 0
    steps = sorted(steps, key=lambda x: x.start_time)
    (at,) = [i for i, x in enumerate(steps) if x.attributes[sc.STEP_NUM_PREFILL_TOKENS] == LONG]
    long_step = steps[at].attributes
    victims = long_step[sc.STEP_NUM_DECODE_REQS]
    assert victims == len(DECODERS)
    seconds = [(x.end_time - x.start_time) / 1e9 for x in steps]
    usual = median(d for x, d in zip(steps[:at], seconds) if x.attributes[sc.STEP_NUM_PREFILL_TOKENS] == 0
                   and x.attributes[sc.STEP_NUM_DECODE_REQS] == victims)
    assert caused["long"] == pytest.approx(victims * (seconds[at] - usual), rel=1e-3, abs=1e-5)
    assert caused["long"] > 0 and all(judgements[rid].seconds[sc.SLOW_PREFILL_INTERFERENCE] > 0 for rid in DECODERS)
    lost = sum(judgements[rid].seconds[sc.SLOW_PREFILL_INTERFERENCE] for rid in DECODERS)
    assert lost == pytest.approx(caused["long"], rel=1e-3, abs=1e-5)
    # each request's engine time: the long prompt's share of its one step is most of the engine's time
    engine = {rid: t.attributes[sc.REQUEST_ENGINE_TIME] for rid, t in trees.items()}
    assert engine["long"] == pytest.approx(seconds[at] * LONG / (LONG + victims), rel=1e-3)
    assert engine["long"] > max(v for rid, v in engine.items() if rid != "long")


def _last_token(spans, rid: str) -> int:
    return request_trees(spans)[rid].one(sc.SPAN_DECODE).end_time


# -- (b) a KV cache too small for the load, (c) a burst above max_num_seqs ----------------------

MAX_SEQS = 4
KV_LOAD = [f"k{i}" for i in range(6)]
BURST = [f"c{i}" for i in range(12)]


@pytest.fixture(scope="module")
def small_engine_runs(otel):
    """One engine for both: 4 sequences at most, 8 KV blocks of 32 tokens (7 usable: vLLM keeps one null block)."""
    from support.engine import in_process, make_llm

    with in_process(), otel.instrumented(slo=f"ttft={TINY_SLO},tpot={TINY_SLO}", sample_rate=1.0,
                                         tail_quantile=0):
        llm = make_llm(max_num_seqs=MAX_SEQS, block_size=32, num_gpu_blocks_override=8,
                       max_num_batched_tokens=256, max_model_len=192)
        engine = llm.llm_engine
        # (b) prompts of 70 tokens hold 3 blocks: two fit (6 of 7), the others wait for KV with the batch half
        # empty; at 96 and 128 tokens the running ones need more blocks than there are: preemptions
        for i, rid in enumerate(KV_LOAD):
            engine.add_request(rid, _prompt(i, 70), _params(60))
        _drain(engine)
        kv_spans = otel.finished()
        otel.spans.clear()
        # (c) waves of 4: each later wave waits out 20 decode steps of the one before (8 + 20 tokens fit one
        # block each, so the KV cache is never the limit), a wait that dwarfs load noise in the other causes
        for i, rid in enumerate(BURST):
            engine.add_request(rid, _prompt(i, 8), _params(20))
        _drain(engine)
        burst_spans = otel.finished()
        otel.spans.clear()
        # (d) a 180-token prompt alone on the idle engine, prefilled in one step: its TTFT is its own prefill
        engine.add_request("lone", _prompt(98, 180), _params(4))
        _drain(engine)
        lone_spans = otel.finished()
        del llm, engine
    gc.collect()
    return kv_spans, burst_spans, lone_spans


def test_a_kv_cache_too_small_is_kv_queueing_or_preemption(small_engine_runs):
    judgements, steps = judged(small_engine_runs[0])
    assert set(judgements) == set(KV_LOAD)
    assert all(s.attributes[sc.STEP_NUM_RUNNING] < MAX_SEQS for s in steps)  # the batch was never the limit
    trees = request_trees(small_engine_runs[0])
    touched, affected = set(), set()
    for rid, j in judgements.items():
        # time lost to the small KV cache, from the request's own spans: waiting in the queue while the
        # batch had room, and requeue + recompute after each preemption
        waited = j.scheduled - j.queued if waited_through(j, steps) else 0
        preempted = sum(s.end_time - s.start_time for name in (sc.SPAN_REQUEUE, sc.SPAN_REPREFILL)
                        for s in trees[rid].grandchildren[name])
        if waited or preempted:
            touched.add(rid)
        if waited + preempted >= MIN_SHARE * (_last_token(small_engine_runs[0], rid) - j.queued):
            affected.add(rid)  # a material part of its life (a brief preemption late in a long life is not)
    assert len(affected) >= 4 and any(judgements[r].preemptions for r in affected), "the scenario did not run as built"
    # the scheduler hook named the reason (a vLLM whose internals moved would say "other")
    assert any(s.attributes.get(sc.STEP_QUEUE_BLOCKED) == "kv_cache" for s in steps)
    assert_classified(judgements, affected, {sc.SLOW_QUEUE_KV_CACHE, sc.SLOW_PREEMPTION}, touched)


def test_a_burst_above_max_num_seqs_is_queueing_with_a_full_batch(small_engine_runs):
    judgements, steps = judged(small_engine_runs[1])
    assert set(judgements) == set(BURST)
    affected = {rid for rid, j in judgements.items()
                if any(s.attributes[sc.STEP_NUM_RUNNING] == MAX_SEQS for s in waited_through(j, steps))}
    assert len(affected) >= 8, "the scenario did not run as built"
    assert any(s.attributes.get(sc.STEP_QUEUE_BLOCKED) == "max_seqs" for s in steps)
    assert_classified(judgements, affected, {sc.SLOW_QUEUE_MAX_SEQS})
    for rid in affected:
        assert judgements[rid].seconds[sc.SLOW_QUEUE_MAX_SEQS] > 0


def test_the_verdict_across_processes(llm, otel):
    """The session's engine (EngineCore in its own process: steps arrive over the socket, with why the
    queue stayed put): a burst above its max_num_seqs (16) is queueing with a full batch. Two-token
    prompts: 24 of them and 16 decodes stay under its 64-token step budget, so the full batch is the
    only limit the queue meets. (With 8-token prompts the first steps were also token-budget bound, and
    which of the two cost a request more seconds depended on how long this machine took for each step.)"""
    with otel.instrumented(slo=f"ttft={TINY_SLO}", sample_rate=1.0, tail_quantile=0):
        llm.generate([_prompt(i, 2) for i in range(24)], _params(8), use_tqdm=False)
        judgements, steps = judged(otel.finished())
    assert len(judgements) == 24
    affected = {rid for rid, j in judgements.items()
                if any(s.attributes[sc.STEP_NUM_RUNNING] == 16 for s in waited_through(j, steps))}
    assert len(affected) >= 4, "the scenario did not run as built"
    blocked = {s.attributes.get(sc.STEP_QUEUE_BLOCKED) for s in steps}
    assert "max_seqs" in blocked and "token_budget" not in blocked, blocked
    assert_classified(judgements, affected, {sc.SLOW_QUEUE_MAX_SEQS})


def test_a_long_generation_at_a_normal_tpot_breaching_e2e_is_its_own_length(llm, otel):
    """The session's engine: one request alone, 100 tokens at whatever TPOT this machine gives (the TPOT SLO
    of a minute is met), against an e2e SLO it cannot meet: the decode time beyond it is its own length."""
    with otel.instrumented(slo=f"ttft=60,tpot=60,e2e={TINY_SLO}", sample_rate=1.0, tail_quantile=0):
        llm.generate([_prompt(1, 8)], _params(100), use_tqdm=False)
        judgements, _ = judged(otel.finished())
    (j,) = judgements.values()
    assert j.cause == sc.SLOW_OWN_LENGTH, j
    assert j.seconds[sc.SLOW_OWN_LENGTH] > 0


GRAMMAR_WAIT_NS = 20_000_000


def test_requests_waiting_for_their_grammar_are_structured_output_queueing(llm, otel):
    """The session's engine: 4 plain requests decoding (short steps: the EngineCore takes new requests in
    between), then 12 requests with distinct large JSON schemas added one by one. The schema requests that
    waited >= 20 ms from QUEUED to their first scheduling (the batch and the token budget had room: the
    plain ones are scheduled at once) waited for their grammar. The engine steps carry the grammar bitmask's time
    while schema requests decode and none before; each first compile is a cache miss, the same schema sent
    again a hit."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    engine = llm.llm_engine
    plain, shaped = [f"so-plain{i}" for i in range(4)], [f"so-json{i}" for i in range(12)]
    with otel.instrumented(slo=f"ttft={TINY_SLO}", sample_rate=1.0, tail_quantile=0):
        for i, rid in enumerate(plain):
            engine.add_request(rid, _prompt(i, 4), _params(160))
        for _ in range(3):  # decoding
            engine.step()
        for i, rid in enumerate(shaped):
            # 240 properties: each compiles for long enough that even an idle machine's burst queues for grammars
            schema = StructuredOutputsParams(json=large_json_schema(f"s{i}", 240))
            # 8 tokens: its JSON never completes
            engine.add_request(rid, _prompt(10 + i, 4), SamplingParams(max_tokens=8, temperature=0.0,
                                                                       structured_outputs=schema))
        _drain(engine)
        spans = otel.finished()
    judgements, steps = judged(spans)
    trees = request_trees(spans)
    assert set(judgements) == set(plain + shaped), sorted(judgements)
    for rid in plain + shaped:  # the grammar's backend is on the request span of each schema request only
        assert (sc.STRUCTURED_OUTPUT_BACKEND in trees[rid].attributes) == (rid in shaped)
    affected = {rid for rid in shaped if judgements[rid].scheduled - judgements[rid].queued >= GRAMMAR_WAIT_NS}
    assert len(affected) >= 8, f"the scenario did not run as built: {judgements}"
    assert any(s.attributes.get(sc.STEP_QUEUE_BLOCKED) == "structured_output" for s in steps)
    right = [rid for rid in affected if judgements[rid].cause == sc.SLOW_QUEUE_STRUCTURED_OUTPUT]
    assert len(right) >= 0.9 * len(affected), {r: judgements[r] for r in affected}
    for rid in plain:
        assert judgements[rid].seconds[sc.SLOW_QUEUE_STRUCTURED_OUTPUT] == 0, judgements[rid]
        assert judgements[rid].cause != sc.SLOW_QUEUE_STRUCTURED_OUTPUT
    # the grammar bitmask on the engine steps: none before any schema request was scheduled; on every step while
    # one decoded (the EngineCore computes the mask for each step that samples for a structured request)
    first_shaped = min(judgements[rid].scheduled for rid in shaped)
    before = [x for x in steps if x.end_time < first_shaped]
    assert before and all(sc.STEP_GRAMMAR_TIME not in x.attributes for x in before)
    for rid in shaped:
        decode = trees[rid].one(sc.SPAN_DECODE)
        during = [x for x in steps if x.start_time > decode.start_time and x.end_time <= decode.end_time]
        assert during, rid
        for x in during:
            assert x.attributes[sc.STEP_GRAMMAR_TIME] > 0 and x.attributes[sc.STEP_GRAMMAR_REQUESTS] >= 1, x.attributes
    # each schema compiled for the first time: a miss; the plain requests have no grammar to hit or miss
    for rid in plain + shaped:
        assert trees[rid].attributes.get(sc.STRUCTURED_OUTPUT_CACHE_HIT) is (False if rid in shaped else None), rid
    # the same schema again (a hit) beside a new one (a miss), one after the other so the first has compiled
    with otel.instrumented(sample_rate=1.0, tail_quantile=0):
        for rid, tag in (("so-again", "s0"), ("so-new", "s-new")):
            schema = StructuredOutputsParams(json=large_json_schema(tag, 240))
            engine.add_request(rid, _prompt(40, 4), SamplingParams(max_tokens=2, temperature=0.0,
                                                                   structured_outputs=schema))
            _drain(engine)
        again = request_trees(otel.finished())
    assert again["so-again"].attributes[sc.STRUCTURED_OUTPUT_CACHE_HIT] is True
    assert again["so-new"].attributes[sc.STRUCTURED_OUTPUT_CACHE_HIT] is False


def test_a_lone_long_prompt_breaching_ttft_is_its_own_prefill(small_engine_runs):
    judgements, steps = judged(small_engine_runs[2])
    j = judgements["lone"]
    assert not waited_through(j, steps), "the scenario did not run as built: it queued behind something"
    assert [s.attributes[sc.STEP_NUM_RUNNING] for s in steps if s.start_time >= j.queued] == [1] * 4
    assert j.cause == sc.SLOW_OWN_PREFILL, j
    assert j.seconds[sc.SLOW_OWN_PREFILL] > 0
