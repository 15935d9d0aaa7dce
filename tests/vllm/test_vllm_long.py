"""A 4,096-token generation at full detail on the real engine, with long prompts prefilled in the
middle of it: the trace stays within the span budget and every stall keeps its own decode-step spans.

Its own engine (EngineCore in this process, so one ``step()`` is one engine step): the session's
engine has ``max_model_len=512``.
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc
from support.traces import engine_steps, request_trees, row_tokens

# ~4,100 engine steps one after another: minutes on a quiet 2-core machine, far more on a loaded one
pytestmark = [pytest.mark.engine, pytest.mark.timeout(2400)]

LONG_TOKENS = 4096
STALL_AT = (1000, 2000, 3000)  # tokens generated when a long prompt arrives
STALL_PROMPT = 600  # prefilled in ~63-token chunks beside the long request's decode token
BUDGET = 1000  # the default max_spans_per_request


@pytest.fixture(scope="module")
def run(otel):
    from vllm import SamplingParams

    from support.engine import in_process, make_llm

    with in_process():
        with otel.instrumented(sample_rate=1.0, baseline_detail="steps", tail_quantile=0) as inst:
            assert inst.telemetry.config.max_spans_per_request == BUDGET
            llm = make_llm(max_model_len=LONG_TOKENS + 512)
            engine = llm.llm_engine
            params = dict(ignore_eos=True, temperature=0.0)
            engine.add_request("long", {"prompt_token_ids": [7 + j % 300 for j in range(16)]},
                               SamplingParams(max_tokens=LONG_TOKENS, **params))
            stall_ids, generated, pending = [], 0, list(STALL_AT)
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.request_id == "long":  # the caller's id (vLLM's internal one has a suffix)
                        generated = len(out.outputs[0].token_ids)
                if pending and generated >= pending[0]:
                    pending.pop(0)
                    prompt = {"prompt_token_ids": [11 + (j * 5) % 400 for j in range(STALL_PROMPT)]}
                    stall_ids.append(engine.add_request(f"stall-{len(stall_ids)}", prompt,
                                                        SamplingParams(max_tokens=2, **params)))
            spans = otel.finished()
            held = (len(inst.telemetry.requests), len(inst.telemetry.steps))
        del llm, engine
    return generated, spans, held, len(stall_ids)


def test_the_long_request_stays_within_the_span_budget(run):
    generated, spans, held, stalls = run
    assert generated == LONG_TOKENS and stalls == len(STALL_AT)
    trees = request_trees(spans)
    long = trees["long"]
    in_trace = [s for s in spans if s.context.trace_id == long.span.context.trace_id]
    assert len(in_trace) <= BUDGET
    rows = long.decode_rows()
    assert sum(row_tokens(r) for r in rows) == LONG_TOKENS - 1  # every decode step, on a row or in a window
    assert all(a.end_time == b.start_time for a, b in zip(rows, rows[1:]))  # they tile the decode span
    # engine-step spans linked from it: only the steps behind its own spans, so within the budget too
    linked = [s for s in engine_steps(spans) if any(ln.context.span_id == long.span.context.span_id
                                                    for ln in s.links)]
    assert 0 < len(linked) <= BUDGET
    assert held == (0, 0)


def test_every_injected_stall_keeps_its_own_decode_step_spans(run):
    _, spans, _, _ = run
    trees = request_trees(spans)
    long = trees["long"]
    own = {r.attributes[sc.ENGINE_STEP_ID]: r for r in long.grandchildren[sc.SPAN_DECODE_STEP]}
    for k in range(len(STALL_AT)):
        chunks = trees[f"stall-{k}"].grandchildren[sc.SPAN_PREFILL_CHUNK]
        assert sum(c.attributes[sc.CHUNK_TOKENS] for c in chunks) == STALL_PROMPT
        for chunk in chunks:
            # the long request decoded in the very step that computed this chunk: that token has its own
            # span, which names the step and says how much of someone else's prompt it carried
            row = own[chunk.attributes[sc.ENGINE_STEP_ID]]
            assert row.attributes[sc.STEP_OTHER_PREFILL_TOKENS] >= chunk.attributes[sc.CHUNK_TOKENS]
            assert row.attributes[sc.STEP_BATCH_SIZE] >= 2


def test_every_decode_step_span_names_its_engine_step_and_carries_its_facts(run):
    _, spans, _, _ = run
    steps = {s.attributes[sc.ENGINE_STEP_ID]: s for s in engine_steps(spans)}
    trees = request_trees(spans)
    checked = 0
    for t in trees.values():
        own_chunks = {c.attributes[sc.ENGINE_STEP_ID]: c.attributes[sc.CHUNK_TOKENS]
                      for c in t.grandchildren[sc.SPAN_PREFILL_CHUNK]}
        for row in t.grandchildren[sc.SPAN_DECODE_STEP] + t.grandchildren[sc.SPAN_PREFILL_CHUNK]:
            a = row.attributes
            step = steps[a[sc.ENGINE_STEP_ID]]  # named, and emitted (it links to this request)
            assert any(ln.context.span_id == t.span.context.span_id for ln in step.links)
            s = step.attributes
            assert a[sc.STEP_BATCH_SIZE] == s[sc.STEP_BATCH_SIZE]
            assert a[sc.STEP_DURATION] == pytest.approx((step.end_time - step.start_time) / 1e9, abs=2e-6)
            own = own_chunks.get(a[sc.ENGINE_STEP_ID], 0) if row.name == sc.SPAN_DECODE_STEP else a[sc.CHUNK_TOKENS]
            assert a[sc.STEP_OTHER_PREFILL_TOKENS] == s[sc.STEP_NUM_PREFILL_TOKENS] - own
            checked += 1
    assert checked > 3 * 10


def test_engine_step_traces_are_kept_apart_from_request_traces(run):
    _, spans, _, _ = run
    services = {}
    for s in spans:
        services.setdefault(s.resource.attributes.get(sc.SERVICE_NAME), set()).add(s.name)
    (request_service,) = {t.span.resource.attributes[sc.SERVICE_NAME] for t in request_trees(spans).values()}
    assert services[f"{request_service}-engine-steps"] == {sc.SPAN_ENGINE_STEP}
    assert sc.SPAN_ENGINE_STEP not in services[request_service]
