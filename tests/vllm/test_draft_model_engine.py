"""A draft model on the real CPU engine: the tiny model as its own draft (``method="draft_model"``).

The drafter's time is measured where it runs, in the worker's ``propose_draft_token_ids`` (worker_facts.py),
and travels with the step's output to the EngineCore and the step record: every step that verified drafts
also proposed the next ones, so it states the drafter's time; the drafts it verified are vLLM's own count.
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc

pytestmark = pytest.mark.engine

K, N, MAX_TOKENS = 2, 3, 12


@pytest.fixture(scope="module")
def run(otel):
    from vllm import SamplingParams

    from support.engine import keep_step_records, make_llm
    from support.tiny_model import ensure_tiny_model

    with otel.instrumented(sample_rate=1.0, baseline_detail="steps", tail_quantile=0) as inst:
        telemetry = inst.telemetry
        records = keep_step_records(telemetry)
        llm = make_llm(speculative_config={"method": "draft_model", "model": ensure_tiny_model(),
                                           "num_speculative_tokens": K})
        prompts = [{"prompt_token_ids": [30 + i, 5, 6, 7, 8, 9, 10, 11]} for i in range(N)]
        outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0),
                               use_tqdm=False)
        spans = otel.finished()
        vllm_metrics = {m.name: m for m in llm.get_metrics()}
        del telemetry.add_step
        del llm
    return outputs, spans, records, vllm_metrics


def test_steps_that_verified_drafts_state_the_drafters_time(run):
    outputs, _, records, vllm_metrics = run
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outputs)
    verify = [r for r in records if r.spec is not None]
    assert verify, "the draft model proposed drafts the target verified"
    assert sum(r.spec.draft_tokens for r in verify) == vllm_metrics["vllm:spec_decode_num_draft_tokens"].value
    for r in verify:
        assert r.worker is not None and r.worker.draft_s is not None and r.worker.draft_s > 0
    # the drafter runs in the model runner: its time is part of the step's model time there
    timed = [r for r in records if r.worker is not None and r.worker.draft_s is not None and r.model_s is not None]
    assert timed and all(r.worker.draft_s <= r.model_s for r in timed)


def test_engine_step_spans_carry_the_drafters_time(run):
    _, spans, records, _ = run
    by_id = {r.step_id: r for r in records}
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    assert steps
    for s in steps:
        r = by_id[s.attributes[sc.ENGINE_STEP_ID]]
        draft = r.worker.draft_s if r.worker is not None else None
        assert s.attributes.get(sc.STEP_SPEC_DRAFT_TIME) == draft
    assert any(sc.STEP_SPEC_DRAFT_TIME in s.attributes for s in steps)
