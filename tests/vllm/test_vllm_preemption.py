"""Forced preemption on a tiny KV cache, with the EngineCore in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc
from support.traces import MS, engine_steps, request_trees, row_tokens

pytestmark = pytest.mark.engine

PROMPT_LEN, MAX_TOKENS, N = 100, 60, 6


def old_rule_shares(scheduler, out) -> dict:
    """The shares as the EngineCore hook derived them before wire version 2: a Python loop over the
    scheduled requests, right after schedule() advanced their num_computed_tokens."""
    shares = {}
    for rid, n in out.num_scheduled_tokens.items():
        req = scheduler.requests[rid]
        before = req.num_computed_tokens - n
        shares[rid] = (n, before < (req.num_tokens - 1 if req.num_output_tokens else req.num_tokens), before)
    return shares


@pytest.fixture(scope="module")
def run(otel):
    from vllm import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    from otel_llm.instrumentation.vllm import VLLMInstrumentor, step_hooks
    from support.engine import in_process, make_llm

    seen = []  # per schedule() with requests: (old rule's shares, output counts), right after vLLM's own
    sent = []  # the hooks' records, in step order (the C methods keep a steady step's shares, Python the rest)
    real = Scheduler.schedule

    def schedule(self, *args, **kwargs):  # wrapped by our hooks in turn: they see what it returns
        out = real(self, *args, **kwargs)
        cached = out.scheduled_cached_reqs
        if cached.req_ids or out.scheduled_new_reqs:
            seen.append((old_rule_shares(self, out), dict(zip(cached.req_ids, cached.num_output_tokens))))
        return out

    handed = []  # the steps schedule()'s Python method kept (the C methods hand it those they do not take)
    python_kept = step_hooks.StepHooks.scheduled

    def scheduled(hooks, *args):
        handed.append(args[1])
        python_kept(hooks, *args)

    with in_process(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "schedule", schedule)
        mp.setattr(step_hooks.StepHooks, "scheduled", scheduled)
        with otel.instrumented(sample_rate=1.0, baseline_detail="steps", tail_quantile=0) as inst:
            hooks = VLLMInstrumentor().runtime.step_hooks
            to_pipeline = hooks.sink

            def sink(payload):
                sent.append(payload)
                to_pipeline(payload)
            hooks.sink = sink
            installed = type(Scheduler.__dict__["schedule"]).__name__
            # 128-token blocks: 6 requests of 100 + 60 tokens each need 2 blocks past token 128; 6 blocks can't hold them
            llm = make_llm(num_gpu_blocks_override=6, max_num_batched_tokens=256)
            prompts = [{"prompt_token_ids": [5 + (i * 13 + j) % 400 for j in range(PROMPT_LEN)]} for i in range(N)]
            outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0),
                                   use_tqdm=False)
            spans = otel.finished()
            held = (len(inst.telemetry.requests), len(inst.telemetry.steps))
        del llm
    assert len(sent) == len(seen)  # in-process and synchronous: every step with requests, one record, in order
    compared = [(old, payload[7], counts) for (old, counts), payload in zip(seen, sent)]
    return outputs, spans, held, compared, (installed, len(handed))


def test_preemptions_show_as_events_and_requeue_spans(run):
    outputs, spans, held, _, _ = run
    trees = request_trees(spans)
    total = sum(o.metrics.num_preemptions for o in outputs)
    assert total > 0, "the tiny KV cache forced preemptions"
    for o in outputs:
        t = trees[o.request_id]
        n = o.metrics.num_preemptions
        assert t.attributes[sc.NUM_PREEMPTIONS] == n
        events = [e for phase in (sc.SPAN_PREFILL, sc.SPAN_DECODE) for s in t.children[phase] for e in s.events
                  if e.name == sc.EVENT_PREEMPTION]
        assert len(events) == n
        requeues = t.grandchildren[sc.SPAN_REQUEUE]
        reprefills = t.grandchildren[sc.SPAN_REPREFILL]
        assert len(requeues) == len(reprefills) == n
        for rq, rp in zip(sorted(requeues, key=lambda s: s.start_time), sorted(reprefills, key=lambda s: s.start_time)):
            assert rq.end_time == rp.start_time  # re-prefill starts when it is scheduled again
            assert rq.start_time in {e.timestamp for e in events}
    assert held == (0, 0)


def test_phases_still_tile_and_match_the_engine(run):
    outputs, spans, _, _, _ = run
    trees = request_trees(spans)
    for o in outputs:
        t = trees[o.request_id]
        m = o.metrics
        q, p, d = t.one(sc.SPAN_QUEUE), t.one(sc.SPAN_PREFILL), t.one(sc.SPAN_DECODE)
        assert abs(p.start_time - q.end_time) <= MS and abs(d.start_time - p.end_time) <= MS
        assert abs(t.span.end_time - d.end_time) <= MS
        assert t.attributes[sc.LATENCY_DECODE] == pytest.approx(m.last_token_ts - m.first_token_ts, abs=1e-3)
        assert t.attributes[sc.LATENCY_TTFT] == pytest.approx(m.first_token_latency, abs=1e-3)
        rows = t.decode_rows()
        assert sum(row_tokens(r) for r in rows) == MAX_TOKENS - 1
        # a preemption during decode: the decode step it fell into keeps its own span
        steps = {(r.start_time, r.end_time) for r in rows if r.name == sc.SPAN_DECODE_STEP}
        for e in t.one(sc.SPAN_DECODE).events:
            assert any(start <= e.timestamp < end for start, end in steps), "preempted step coalesced"


def test_engine_steps_count_preemptions_and_recompute_as_prefill(run):
    outputs, spans, _, _, _ = run
    steps = engine_steps(spans)
    assert sum(s.attributes[sc.STEP_NUM_PREEMPTED] for s in steps) == sum(o.metrics.num_preemptions for o in outputs)
    # recomputation after a preemption is prefill work: more prefill tokens than the prompts alone
    assert sum(s.attributes[sc.STEP_NUM_PREFILL_TOKENS] for s in steps) > N * PROMPT_LEN


def test_in_process_engine_steps_carry_the_anatomy_without_model_time(run):
    """EngineCore in this process: the records are handed over in-process, the anatomy still sums to
    the step, and a CPU model runner in the EngineCore's own thread is not timed (by design)."""
    _, spans, _, _, _ = run
    steps = engine_steps(spans)
    assert steps
    for s in steps:
        a = s.attributes
        parts = a[sc.STEP_SCHEDULE_TIME] + a[sc.STEP_EXECUTE_TIME] + a[sc.STEP_OUTPUT_TIME]
        assert parts == pytest.approx((s.end_time - s.start_time) / 1e9, abs=1e-3)
        assert sc.STEP_MODEL_TIME not in a
        assert a[sc.STEP_FLOPS] > 0  # the roofline's composition arrived (contexts with the shares)


def test_shares_derived_from_vllms_lists_equal_the_per_request_rule(run):
    """The frontend derives each share's prefill flag and context from vLLM's own lists (wire version 2);
    on chunked prefills, preemptions and their recomputes it gets what the per-request rule got."""
    from otel_llm.instrumentation.vllm import step_hooks, step_wire

    *_, compared, _ = run
    assert compared
    recomputes = chunks = 0
    for old, new, outputs in compared:
        payload = step_wire.StepPayload(1, 0.0, 0.0, 0, 0, 0, 0.0, new, 0, 0.0, 0.0, 0.0, None, None)
        for step in (step_wire.decode(step_wire.encode(payload)), step_hooks.decode(payload)):  # wire, in-process
            requests = step.requests
            got = {rid: (n, prefill, c) for (rid, n, prefill), c in zip(requests, step.contexts)}
            assert len(got) == len(requests) and got == old
        recomputes += sum(1 for rid, (_, prefill, _) in old.items() if prefill and outputs.get(rid))
        chunks += sum(1 for rid, (_, prefill, before) in old.items() if prefill and before and not outputs.get(rid))
    assert recomputes and chunks  # the scenario has both: recomputes after preemptions, chunked prefills


def test_the_c_methods_took_the_steady_steps(run):
    """Where built, the steps without a prompt entry (decodes, a running request's next chunk) were kept and
    sent by the C methods (_hooks_fast.c), and their shares are among those compared above."""
    from otel_llm.instrumentation.vllm import step_hooks

    if step_hooks.fast_methods() is None:
        pytest.skip(f"no C hook methods: {step_hooks.FAST_REASON}")
    *_, compared, (installed, handed) = run
    assert installed == "HookMethod"
    with_prompt_entries = sum(1 for _, new, _ in compared if new[4])  # prompt_at: a new or recomputing share
    # the Python method kept those, and the first step (it picks vLLM's readers): the C methods all the rest
    assert handed <= with_prompt_entries + 1 and len(compared) - handed > len(compared) // 2
