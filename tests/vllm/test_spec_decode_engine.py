"""n-gram speculative decoding on the real CPU engine (EngineCore in its own process: the step records
carry the drafts through the wire's extras block).

The user has vLLM's per-request option on here (``per_request_spec_decode_metrics="detailed"``), so each
request's drafted and accepted tokens can be held against vLLM's own; otel-llm never turns it on itself.
Greedy requests (acceptance ~100 % on random weights) and sampled ones (temperature 1: drafts rejected).
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc
from support.traces import request_trees

pytestmark = pytest.mark.engine

K = 3
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
N, MAX_TOKENS = 4, 32


@pytest.fixture(scope="module")
def run(otel):
    from vllm import SamplingParams

    from support.engine import keep_step_records, make_llm

    with otel.instrumented(sample_rate=1.0, baseline_detail="steps", tail_quantile=0) as inst:
        telemetry = inst.telemetry
        records = keep_step_records(telemetry)
        llm = make_llm(speculative_config=SPEC, per_request_spec_decode_metrics="detailed")
        pattern = [7, 8, 9, 10, 11, 12]
        prompts = [{"prompt_token_ids": [20 + i] + pattern * 8} for i in range(N)]
        greedy = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0),
                              use_tqdm=False)
        sampled = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=1.0),
                               use_tqdm=False)
        spans = otel.finished()
        rates = otel.histogram("llm.server.spec_decode.acceptance_rate")
        tokens = {p.attributes[sc.SPEC_TOKEN_KIND]: p.value for p in otel.histogram("llm.server.spec_decode.tokens")}
        positions = {(p.attributes[sc.SPEC_POSITION], p.attributes[sc.SPEC_TOKEN_KIND]): p.value
                     for p in otel.histogram("llm.server.spec_decode.position.tokens")}
        vllm_metrics = {m.name: m for m in llm.get_metrics()}
        del telemetry.add_step
        del llm
    return greedy + sampled, spans, records, rates, tokens, positions, vllm_metrics


def _vllm(o):
    m = o.outputs[0].spec_decode_metrics.to_dict()
    return m["num_spec_steps"], m["num_draft_tokens"], m["num_accepted_draft_tokens"]


def test_per_request_drafts_equal_vllms_own(run):
    outputs, spans, *_ = run
    trees = request_trees(spans)
    assert len(outputs) == 2 * N
    assert all(_vllm(o)[1] > 0 for o in outputs[:N]), "the n-gram proposer drafted for a repeating prompt"
    for o in outputs:
        a = trees[o.request_id].attributes
        steps, drafted, accepted = _vllm(o)
        if not drafted:  # a sampled request whose output never matched its context: nothing to verify
            assert sc.SPEC_DRAFT_TOKENS not in a
            continue
        assert (a[sc.SPEC_VERIFY_STEPS], a[sc.SPEC_DRAFT_TOKENS], a[sc.SPEC_ACCEPTED_TOKENS]) == (steps, drafted, accepted)
        m = o.outputs[0].spec_decode_metrics.to_dict()
        assert a[sc.SPEC_ACCEPTANCE_RATE] == pytest.approx(m["draft_acceptance_rate"])
        assert a[sc.SPEC_ACCEPTANCE_LENGTH] == pytest.approx(m["mean_acceptance_length"])
        assert a[sc.USAGE_OUTPUT_TOKENS] == MAX_TOKENS == len(o.outputs[0].token_ids)


def test_sampling_rejects_drafts(run):
    """Temperature 1 on random weights: the target model rarely agrees with the n-gram drafts."""
    outputs, spans, *_ = run
    sampled = outputs[N:]
    assert sum(_vllm(o)[2] for o in sampled) < sum(_vllm(o)[1] for o in sampled)
    trees = request_trees(spans)
    assert any(trees[o.request_id].attributes.get(sc.SPEC_ACCEPTANCE_RATE, 1.0) < 1.0 for o in sampled)


def test_step_totals_equal_request_totals_and_vllms_counters(run):
    outputs, _, records, rates, tokens, positions, vllm_metrics = run
    verify = [r for r in records if r.spec is not None]
    assert verify, "step records carried the drafts"
    drafted = sum(r.spec.draft_tokens for r in verify)
    accepted = sum(r.spec.accepted_tokens for r in verify)
    assert drafted == sum(_vllm(o)[1] for o in outputs)
    assert accepted == sum(_vllm(o)[2] for o in outputs)
    assert sum(r.spec.drafts for r in verify) == sum(_vllm(o)[0] for o in outputs)
    # vLLM's own Prometheus counters (SpecDecodingStats, summed over its steps)
    assert vllm_metrics["vllm:spec_decode_num_draft_tokens"].value == drafted
    assert vllm_metrics["vllm:spec_decode_num_accepted_tokens"].value == accepted
    per_pos = vllm_metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    assert [positions.get((i, "accepted"), 0) for i in range(K)] == list(per_pos)
    # each verify share's scheduled tokens are its drafts plus the token it would sample anyway
    for r in verify:
        for i, d in zip(r.spec.at, r.spec.drafted):
            assert r.tokens[i] == 1 + d and i not in r.prefill_at
    assert tokens == {"drafted": drafted, "accepted": accepted}
    assert sum(p.count for p in rates) == sum(1 for o in outputs if _vllm(o)[1])


def test_decode_rows_and_step_spans_state_drafts(run):
    _, spans, *_ = run
    rows = [s for s in spans if s.name == sc.SPAN_DECODE_STEP and sc.STEP_DRAFTED in s.attributes]
    assert rows and all(s.attributes[sc.STEP_DRAFTED] <= K for s in rows)
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP and sc.STEP_SPEC_DRAFTS in s.attributes]
    assert steps
    for s in steps:
        a = s.attributes
        assert a[sc.STEP_SPEC_DRAFT_TOKENS] <= K * a[sc.STEP_SPEC_DRAFTS]
        assert a[sc.STEP_SPEC_ACCEPTED_TOKENS] <= a[sc.STEP_SPEC_DRAFT_TOKENS]
        assert a[sc.STEP_KV_CACHE_DTYPE] == "float32"
