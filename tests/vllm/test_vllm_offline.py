"""Acceptance on the real vLLM engine (EngineCore in its own process): offline LLM.generate."""

from __future__ import annotations

import pytest
from opentelemetry.trace import StatusCode

from otel_llm import semconv as sc
from support.traces import MS, engine_steps, request_trees, row_tokens

pytestmark = pytest.mark.engine

# 18 prompts from 1 to 290 tokens: short ones decode while long ones prefill in 64-token chunks
PROMPTS = [{"prompt_token_ids": [3 + (j * 7) % 500 for j in range(1 + 17 * i)]} for i in range(18)]
MAX_TOKENS = 12


def _params(**kw):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0, **kw)


@pytest.fixture(scope="module", params=["memory", "otlp"])
def full_run(request, llm, otel):
    """Every request kept at full detail; spans read from the SDK's in-memory exporter, and again
    as a deployment sends them (batch processor + OTLP/HTTP: our direct export) to a real receiver."""
    with otel.instrumented(request.param, sample_rate=1.0, baseline_detail="steps", tail_quantile=0) as inst:
        outputs = llm.generate(PROMPTS, _params(), use_tqdm=False)
        spans = otel.finished()
        if request.param == "otlp":
            stats = inst.telemetry.stats()
            assert stats["direct_spans_sent"] == len(spans) and stats["direct_spans_dropped"] == 0
        held = (len(inst.telemetry.requests), len(inst.telemetry.steps))
        ttft_points = otel.histogram("gen_ai.server.time_to_first_token")
        # every step's time (part total: end - start) and every request's engine time, same run
        steps_total = sum(p.sum for p in otel.histogram("llm.server.engine.step.duration")
                          if p.attributes.get(sc.STEP_PART) == "total")
        engine = otel.histogram("llm.server.request.engine_time")
    return outputs, spans, held, ttft_points, (steps_total, engine)


def test_one_request_span_each_with_engine_timings(full_run):
    outputs, spans, held, _, _ = full_run
    trees = request_trees(spans)
    assert len(trees) == len(PROMPTS) == len(outputs)
    for out in outputs:
        t = trees[out.request_id]
        m = out.metrics
        a = t.attributes
        assert t.span.name == f"text_completion {a[sc.REQUEST_MODEL]}"
        assert a[sc.PROVIDER_NAME] == "vllm" and a[sc.OPERATION_NAME] == "text_completion"
        assert a[sc.USAGE_INPUT_TOKENS] == len(out.prompt_token_ids)
        assert a[sc.USAGE_OUTPUT_TOKENS] == len(out.outputs[0].token_ids) == m.num_generation_tokens
        assert a[sc.RESPONSE_FINISH_REASONS] == ("length",)
        assert a[sc.LATENCY_TTFT] == pytest.approx(m.first_token_latency, abs=1e-3)
        assert a[sc.LATENCY_QUEUE] == pytest.approx(m.scheduled_ts - m.queued_ts, abs=1e-3)
        assert a[sc.LATENCY_PREFILL] == pytest.approx(m.first_token_ts - m.scheduled_ts, abs=1e-3)
        assert a[sc.LATENCY_DECODE] == pytest.approx(m.last_token_ts - m.first_token_ts, abs=1e-3)
        assert a[sc.LATENCY_TPOT] == pytest.approx((m.last_token_ts - m.first_token_ts) / (MAX_TOKENS - 1), abs=1e-6)
        # e2e ends where the frontend received the last token: after the engine stamped it
        assert a[sc.LATENCY_E2E] >= a[sc.LATENCY_TTFT]
        assert a[sc.LATENCY_E2E] == pytest.approx((t.span.end_time - t.span.start_time) / 1e9, abs=1e-3)
        assert a[sc.SAMPLING_REASON] == "baseline"
    assert held == (0, 0), "nothing is held for finished requests"


def test_phases_tile_the_request_span(full_run):
    outputs, spans, _, _, _ = full_run
    for out in outputs:
        t = request_trees(spans)[out.request_id]
        q, p, d = t.one(sc.SPAN_QUEUE), t.one(sc.SPAN_PREFILL), t.one(sc.SPAN_DECODE)
        assert abs(q.start_time - t.span.start_time) <= MS
        assert abs(p.start_time - q.end_time) <= MS
        assert abs(d.start_time - p.end_time) <= MS
        assert abs(t.span.end_time - d.end_time) <= MS
        m = out.metrics
        assert (d.start_time - p.start_time) / 1e9 == pytest.approx(m.first_token_ts - m.scheduled_ts, abs=1e-3)
        rows = t.decode_rows()  # eventful decode steps on their own, windows of the others
        assert sum(row_tokens(r) for r in rows) == MAX_TOKENS - 1
        for a, b in zip(rows, rows[1:]):
            assert a.end_time == b.start_time
        assert rows[0].start_time == d.start_time
        assert (rows[-1].end_time - rows[0].start_time) / 1e9 == pytest.approx(
            m.last_token_ts - m.first_token_ts, abs=1e-3)


def test_chunked_prefill_is_visible(full_run):
    outputs, spans, _, _, _ = full_run
    trees = request_trees(spans)
    long = [o for o in outputs if len(o.prompt_token_ids) > 64]
    assert long, "the workload has prompts longer than max_num_batched_tokens=64"
    for out in outputs:
        chunks = sorted(trees[out.request_id].grandchildren[sc.SPAN_PREFILL_CHUNK], key=lambda s: s.start_time)
        tokens = [c.attributes[sc.CHUNK_TOKENS] for c in chunks]
        assert sum(tokens) == len(out.prompt_token_ids)
        assert all(n <= 64 for n in tokens)
        assert [c.attributes[sc.CHUNK_INDEX] for c in chunks] == list(range(len(chunks)))
        if len(out.prompt_token_ids) > 64:
            assert len(chunks) >= -(-len(out.prompt_token_ids) // 64)
        prefill = trees[out.request_id].one(sc.SPAN_PREFILL)
        assert chunks[0].start_time >= prefill.start_time - MS
        assert abs(chunks[-1].end_time - prefill.end_time) <= MS  # the last chunk produced the first token


def test_engine_steps_match_the_scheduler_and_link_requests(full_run):
    outputs, spans, _, _, _ = full_run
    trees = request_trees(spans)
    steps = engine_steps(spans)
    assert steps
    by_id = {s.attributes[sc.ENGINE_STEP_ID]: s for s in steps}
    span_of = {t.span.context.span_id: rid for rid, t in trees.items()}
    for s in steps:
        a = s.attributes
        assert a[sc.STEP_NUM_PREFILL_TOKENS] + a[sc.STEP_NUM_DECODE_TOKENS] <= 64  # the token budget per step
        assert a[sc.STEP_BATCH_SIZE] == a[sc.STEP_NUM_PREFILL_REQS] + a[sc.STEP_NUM_DECODE_REQS]
        expected = ("mixed" if a[sc.STEP_NUM_PREFILL_REQS] and a[sc.STEP_NUM_DECODE_REQS]
                    else "prefill" if a[sc.STEP_NUM_PREFILL_REQS] else "decode")
        assert a[sc.STEP_PHASE] == expected
        assert 0.0 <= a[sc.STEP_KV_CACHE_USAGE] <= 1.0
        assert 0 < len(s.links) <= a[sc.STEP_BATCH_SIZE]
    # a step links exactly the requests whose own chunk or decode-step spans it produced, and those
    # spans carry its facts (a slow token is explained on its row, in any viewer)
    linked: dict[int, set[str]] = {}
    for s in steps:
        linked[s.attributes[sc.ENGINE_STEP_ID]] = {span_of[ln.context.span_id] for ln in s.links}
    named: dict[int, set[str]] = {}
    for rid, t in trees.items():
        own = {c.attributes[sc.ENGINE_STEP_ID]: c.attributes[sc.CHUNK_TOKENS]
               for c in t.grandchildren[sc.SPAN_PREFILL_CHUNK]}
        for row in t.grandchildren[sc.SPAN_DECODE_STEP] + t.grandchildren[sc.SPAN_PREFILL_CHUNK]:
            a = row.attributes
            named.setdefault(a[sc.ENGINE_STEP_ID], set()).add(rid)
            step = by_id[a[sc.ENGINE_STEP_ID]].attributes
            assert a[sc.STEP_BATCH_SIZE] == step[sc.STEP_BATCH_SIZE]
            mine = a[sc.CHUNK_TOKENS] if row.name == sc.SPAN_PREFILL_CHUNK else own.get(a[sc.ENGINE_STEP_ID], 0)
            assert a[sc.STEP_OTHER_PREFILL_TOKENS] == step[sc.STEP_NUM_PREFILL_TOKENS] - mine
        for w in t.grandchildren[sc.SPAN_DECODE_WINDOW]:
            assert w.attributes[sc.WINDOW_TOKENS] == w.attributes[sc.WINDOW_LAST_INDEX] - \
                w.attributes[sc.WINDOW_FIRST_INDEX] + 1
    assert named == linked
    # a step that prefilled a prompt is eventful for everyone decoding in it: each request it served
    # has its own span for it (a chunk, or a decode step), so it links its whole batch
    for s in steps:
        if s.attributes[sc.STEP_NUM_PREFILL_REQS]:
            assert len(s.links) == s.attributes[sc.STEP_BATCH_SIZE]


def test_ttft_histogram_counts_every_request_with_engine_sum(full_run):
    outputs, _, _, points, _ = full_run
    assert sum(p.count for p in points) == len(outputs)
    assert sum(p.sum for p in points) == pytest.approx(sum(o.metrics.first_token_latency for o in outputs), abs=1e-6)
    assert list(points[0].explicit_bounds)[:3] == [0.001, 0.005, 0.01]  # GenAI semantic-convention buckets


def test_engine_time_of_every_request_adds_up_to_the_steps_time(full_run):
    """Each step's time split across its requests by their tokens: over the run, every request's engine time
    adds up to the steps' durations (this engine does not overlap steps), on the spans and in the histogram."""
    outputs, spans, _, _, (steps_total, engine) = full_run
    trees = request_trees(spans)
    times = {rid: t.attributes[sc.REQUEST_ENGINE_TIME] for rid, t in trees.items()}
    assert len(times) == len(outputs) and all(v > 0 for v in times.values())
    assert sum(p.count for p in engine) == len(outputs)
    assert sum(p.sum for p in engine) == pytest.approx(steps_total, rel=1e-6, abs=1e-6)
    assert sum(times.values()) == pytest.approx(steps_total, rel=1e-6, abs=1e-5)


def test_two_requests_sharing_every_step_with_equal_work_get_equal_engine_time(llm, otel):
    """Two 20-token prompts with the same output length, sent behind a 64-token one (the first step's whole
    budget) so that both wait for the next step: they are prefilled in one step and then decode in the same
    steps with the same tokens, and get the same engine time."""
    blocker = {"prompt_token_ids": [7 + (j * 5) % 400 for j in range(64)]}
    twins = [{"prompt_token_ids": [5 + j for j in range(20)]}, {"prompt_token_ids": [9 + j for j in range(20)]}]
    with otel.instrumented(sample_rate=1.0, tail_quantile=0):
        outputs = llm.generate([blocker, *twins], _params(), use_tqdm=False)
        spans = otel.finished()
    trees = request_trees(spans)
    first, second = (trees[o.request_id] for o in outputs[1:])

    def prefill_steps(t) -> set[int]:
        return {s.attributes[sc.ENGINE_STEP_ID] for s in t.grandchildren[sc.SPAN_PREFILL_CHUNK]}

    if not prefill_steps(first) or prefill_steps(first) != prefill_steps(second):
        # the EngineCore takes requests as they arrive: a twin may still reach a step of its own (the machine
        # decides), and then the two did not share every step
        pytest.skip("the engine prefilled the two requests in different steps")
    a, b = (t.attributes[sc.REQUEST_ENGINE_TIME] for t in (first, second))
    assert a > 0 and a == pytest.approx(b, rel=1e-9)


def test_tail_decision_keeps_breaches_whole_and_baseline_for_the_rest(llm, otel, full_run):
    # Requests submitted together queue behind each other (~41 prefill steps of 64 tokens for all 18
    # prompts, the first ones served in the first step), so an SLO inside the spread of their TTFTs splits
    # them. The spread moves with machine load: aim at the geometric middle of the last run's (a run would
    # have to be ~6x faster or slower than the one before to miss it), and re-aim, if needed, at the last.
    ttfts = sorted(o.metrics.first_token_latency for o in full_run[0])
    for _ in range(5):
        slo = (ttfts[0] * ttfts[-1]) ** 0.5
        with otel.instrumented(slo=f"ttft={slo}", sample_rate=0.0, tail_quantile=0):
            outputs = llm.generate(PROMPTS, _params(), use_tqdm=False)
            spans = otel.finished()
            requests = otel.counter("llm.server.requests")
            good = otel.counter("llm.server.requests.good")
        breached = {o.request_id for o in outputs if o.metrics.first_token_latency > slo}
        if breached and len(breached) < len(outputs):
            break
        ttfts = sorted(o.metrics.first_token_latency for o in outputs)
    assert breached and len(breached) < len(outputs), "the SLO splits the workload"
    trees = request_trees(spans)
    assert set(trees) == breached, {r: t.attributes[sc.SAMPLING_REASON] for r, t in trees.items()}
    for rid in breached:
        t = trees[rid]
        assert t.attributes[sc.SAMPLING_REASON] == "slo_breach:ttft"
        assert t.attributes[sc.SLO_MET] is False
        assert sum(row_tokens(r) for r in t.decode_rows()) == MAX_TOKENS - 1  # full detail
    assert requests == len(outputs)  # metrics cover 100% whatever the sampling
    assert good == len(outputs) - len(breached)


def test_baseline_rate_keeps_about_its_share(llm, otel):
    with otel.instrumented(sample_rate=0.5, tail_quantile=0):
        outputs = llm.generate(PROMPTS * 3, _params(), use_tqdm=False)
        spans = otel.finished()
        points = otel.histogram("gen_ai.server.time_to_first_token")
    kept = request_trees(spans)
    assert 0 < len(kept) < len(outputs), {r: t.attributes[sc.SAMPLING_REASON] for r, t in kept.items()}
    for t in kept.values():
        assert t.attributes[sc.SAMPLING_REASON] == "baseline"
        assert t.children[sc.SPAN_PREFILL] and not t.decode_rows()  # baseline detail: phases
    assert sum(p.count for p in points) == len(outputs)


def test_unsampled_parent_gets_no_spans_but_metrics(llm, otel):
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    parent = NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(0)))
    with otel.instrumented(sample_rate=1.0, slo="ttft=0.000001"):
        token = context.attach(trace.set_span_in_context(parent))
        try:
            outputs = llm.generate(PROMPTS[:4], _params(), use_tqdm=False)
        finally:
            context.detach(token)
        assert request_trees(otel.finished()) == {}
        assert otel.counter("llm.server.requests") == len(outputs)


def test_request_span_joins_the_callers_trace(llm, otel):
    from opentelemetry import trace

    tracer = otel.tracer_provider.get_tracer("test")
    with otel.instrumented(sample_rate=1.0):
        with tracer.start_as_current_span("caller") as caller:
            outputs = llm.generate(PROMPTS[:2], _params(), use_tqdm=False)
        trees = request_trees(otel.finished())
    for o in outputs:
        span = trees[o.request_id].span
        assert span.context.trace_id == caller.get_span_context().trace_id
        assert span.parent.span_id == caller.get_span_context().span_id
        assert span.kind == trace.SpanKind.INTERNAL
        assert span.status.status_code != StatusCode.ERROR


def test_request_span_carries_the_sampling_parameters_the_engine_used(llm, otel):
    """GenAI request attributes from the real ``SamplingParams``: set ones recorded, defaults that mean
    "off" (top_k 0, no penalty, no stop sequence, one choice) left out; the response model is the served one."""
    with otel.instrumented(sample_rate=1.0, tail_quantile=0):
        from vllm import SamplingParams

        # not greedy: vLLM resets top_k to 0 (off) for temperature 0
        sampled = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, top_k=5,
                                 presence_penalty=0.5, frequency_penalty=0.25, stop=["zz", "yy"])
        (on,) = llm.generate([PROMPTS[1]], sampled, use_tqdm=False)
        (off,) = llm.generate([PROMPTS[2]], _params(), use_tqdm=False)
        trees = request_trees(otel.finished())
    a = trees[on.request_id].attributes
    assert (a[sc.REQUEST_TOP_K], a[sc.REQUEST_PRESENCE_PENALTY], a[sc.REQUEST_FREQUENCY_PENALTY]) == (5, 0.5, 0.25)
    assert a[sc.REQUEST_STOP_SEQUENCES] == ("zz", "yy") and a[sc.REQUEST_MAX_TOKENS] == MAX_TOKENS
    assert a[sc.RESPONSE_MODEL] == a[sc.REQUEST_MODEL]
    b = trees[off.request_id].attributes
    for key in (sc.REQUEST_TOP_K, sc.REQUEST_PRESENCE_PENALTY, sc.REQUEST_FREQUENCY_PENALTY,
                sc.REQUEST_STOP_SEQUENCES, sc.REQUEST_CHOICE_COUNT, sc.REQUEST_SEED, sc.REQUEST_STREAM):
        assert key not in b, key


def test_parallel_sampling_is_one_trace(llm, otel):
    """``n=2`` offline: vLLM runs two sequences under one ParentRequest; the user's request is one trace
    (one request span, two ``llm.choice`` spans with their own phases), linked from its engine steps."""
    from vllm import SamplingParams

    # not greedy (n > 1 needs sampling); no seed: seeded sampling fails on vLLM's CPU backend
    params = SamplingParams(n=2, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8)
    with otel.instrumented(sample_rate=1.0, baseline_detail="steps", tail_quantile=0):
        (out,) = llm.generate([PROMPTS[4]], params, use_tqdm=False)
        spans = otel.finished()
        ttft = otel.histogram("gen_ai.server.time_to_first_token")
    requests = [x for x in spans if x.attributes and sc.RESPONSE_ID in x.attributes]
    (root,) = requests
    a = root.attributes
    assert a[sc.RESPONSE_ID] == out.request_id and a[sc.REQUEST_CHOICE_COUNT] == 2
    assert a[sc.USAGE_INPUT_TOKENS] == len(out.prompt_token_ids)
    assert a[sc.USAGE_OUTPUT_TOKENS] == sum(len(c.token_ids) for c in out.outputs) == 2 * MAX_TOKENS
    choices = sorted((x for x in spans if x.name == sc.SPAN_CHOICE), key=lambda c: c.attributes[sc.CHOICE_INDEX])
    assert [c.parent.span_id for c in choices] == [root.context.span_id] * 2
    assert [c.attributes[sc.CHOICE_INDEX] for c in choices] == sorted(c.index for c in out.outputs) == [0, 1]
    request_spans = [x for x in spans if x.name != sc.SPAN_ENGINE_STEP]
    assert {x.context.trace_id for x in request_spans} == {root.context.trace_id}, "one trace"
    for c in choices:
        kids = [x for x in spans if x.parent and x.parent.span_id == c.context.span_id]
        assert {x.name for x in kids} == {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE}
        assert c.attributes[sc.USAGE_OUTPUT_TOKENS] == MAX_TOKENS
        assert c.end_time <= root.end_time
    linked = {ln.context.span_id for x in engine_steps(spans) for ln in x.links}
    assert {c.context.span_id for c in choices} <= linked  # each sequence's steps link its choice span
    assert sum(p.count for p in ttft) == 2  # TTFT per sequence, as vLLM's own histogram
