"""The TensorRT-LLM adapter through the real wrapping and the real core, on the stand-in engine.

Scenarios as the vLLM adapter's tests: not streaming and streaming, abort, error, several
requests sharing iterations (engine-step spans linked to the kept requests), speculative
decoding with several tokens per iteration, trtllm-serve with an incoming ``traceparent``.
Expected values are computed from the stand-in engine's own perf metrics with TensorRT-LLM's
formulas (result.py ``_process_req_perf_metrics`` @ 1.2.1).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.trace import SpanKind, StatusCode

import fake_trtllm as fake
from otel_llm import semconv as sc
from support.traces import MS, engine_steps, request_trees, row_tokens
from trtllm_env import instrumented


def _times(out):
    tm = out.outputs[0].request_perf_metrics.timing_metrics
    return (tm.arrival_time.total_seconds(), tm.first_scheduled_time.total_seconds(),
            tm.first_token_time.total_seconds(), tm.last_token_time.total_seconds())


def _llm(engine: fake.FakeEngine | None = None):
    from tensorrt_llm.llmapi.llm import LLM

    return LLM(model="tiny-llama", engine=engine or fake.FakeEngine())


def _params(max_tokens: int = 6):
    from tensorrt_llm.sampling_params import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=0.9)


def test_generate_turns_on_perf_metrics_and_reports_engine_timings(trt, caplog) -> None:
    llm = _llm()
    params = _params()
    assert params.return_perf_metrics is False
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        outs = llm.generate(["a b c", "d e f g h"], params)
    assert params.return_perf_metrics is True  # turned on, and said so once
    assert sum("return_perf_metrics=True" in r.getMessage() for r in caplog.records) == 1
    trees = request_trees(trt.spans())
    assert len(trees) == 2
    for out in outs:
        t = trees[str(out.request_id)]
        a = t.attributes
        arrival, sched, first, last = _times(out)
        assert t.span.name == "text_completion tiny-llama" and t.span.kind == SpanKind.INTERNAL
        assert a[sc.PROVIDER_NAME] == "tensorrt_llm" and a[sc.OPERATION_NAME] == "text_completion"
        assert a[sc.USAGE_INPUT_TOKENS] == len(out.prompt_token_ids)
        assert a[sc.USAGE_OUTPUT_TOKENS] == 6 and a[sc.RESPONSE_FINISH_REASONS] == ("length",)
        assert a[sc.REQUEST_MAX_TOKENS] == 6 and a[sc.REQUEST_TOP_P] == 0.9
        assert sc.REQUEST_STREAM not in a
        assert a[sc.LATENCY_TTFT] == pytest.approx(first - arrival, abs=1e-9)
        assert a[sc.LATENCY_E2E] == pytest.approx(last - arrival, abs=1e-9)
        assert a[sc.LATENCY_QUEUE] == pytest.approx(sched - arrival, abs=1e-9)
        assert a[sc.LATENCY_PREFILL] == pytest.approx(first - sched, abs=1e-9)
        assert a[sc.LATENCY_DECODE] == pytest.approx(last - first, abs=1e-9)
        assert a[sc.LATENCY_TPOT] == pytest.approx((last - first) / 5, abs=1e-9)
        assert a[sc.OUTPUT_CHARACTERS] == len(out.outputs[0].text)
        assert a[sc.KV_CACHE_ALLOCATED_BLOCKS] == 2 and a[sc.KV_CACHE_REUSED_BLOCKS] == 0
        assert sc.SPEC_DRAFT_TOKENS not in a  # no drafting ran
        # phases tile the request span; not streamed: one decode span, no per-token steps
        q, p, d = t.one(sc.SPAN_QUEUE), t.one(sc.SPAN_PREFILL), t.one(sc.SPAN_DECODE)
        assert q.start_time == t.span.start_time and q.end_time == p.start_time
        assert p.end_time == d.start_time and d.end_time == t.span.end_time
        assert (d.start_time - p.start_time) / 1e9 == pytest.approx(first - sched, abs=1e-6)
        assert not t.grandchildren[sc.SPAN_DECODE_STEP]
    assert trt.inst.telemetry.requests == {}
    ttft = trt.points("gen_ai.server.time_to_first_token")
    assert sum(p.count for p in ttft) == 2
    assert sum(p.sum for p in ttft) == pytest.approx(sum(_times(o)[2] - _times(o)[0] for o in outs), abs=1e-9)


def test_streaming_gives_one_decode_step_per_update(trt) -> None:
    llm = _llm()

    async def run():
        res = llm.generate_async("a b c", _params(5), streaming=True)
        seen = 0
        async for out in res:
            seen += 1
        return res, seen

    res, updates = asyncio.run(run())
    t = request_trees(trt.spans())[str(res.request_id)]
    arrival, sched, first, last = _times(res)
    assert t.attributes[sc.REQUEST_STREAM] is True
    assert updates == 5
    steps = sorted(t.grandchildren[sc.SPAN_DECODE_STEP], key=lambda s: s.start_time)
    assert len(steps) == 4 and all(s.attributes[sc.STEP_TOKENS] == 1 for s in steps)
    d = t.one(sc.SPAN_DECODE)
    assert steps[0].start_time == d.start_time
    for a, b in zip(steps, steps[1:]):
        assert a.end_time == b.start_time
    # the first and last stamps are the engine's first_token_time and last_token_time
    assert (steps[-1].end_time - steps[0].start_time) / 1e9 == pytest.approx(last - first, abs=1e-6)


def test_speculative_decoding_several_tokens_per_iteration(trt) -> None:
    llm = _llm(fake.FakeEngine(tokens_per_step=3))
    res = llm.generate_async("a b c", _params(7), streaming=True)
    for _ in res:
        pass
    t = request_trees(trt.spans())[str(res.request_id)]
    a = t.attributes
    spec = res.outputs[0].request_perf_metrics.speculative_decoding
    assert a[sc.USAGE_OUTPUT_TOKENS] == 7
    assert a[sc.SPEC_DRAFT_TOKENS] == spec.total_draft_tokens > 0
    assert a[sc.SPEC_ACCEPTED_TOKENS] == spec.total_accepted_draft_tokens
    assert a[sc.SPEC_ACCEPTANCE_RATE] == pytest.approx(spec.acceptance_rate)
    steps = sorted(t.grandchildren[sc.SPAN_DECODE_STEP], key=lambda s: s.start_time)
    assert [s.attributes[sc.STEP_TOKENS] for s in steps] == [3, 3]  # 1 (prefill) + 3 + 3
    first, last = _times(res)[2:]
    assert a[sc.LATENCY_TPOT] == pytest.approx((last - first) / 6, abs=1e-9)


def test_abort_ends_the_request_as_aborted(trt) -> None:
    llm = _llm()
    res = llm.generate_async("a b c", _params(20), streaming=True)
    next(res), next(res)
    res.abort()  # e.g. trtllm-serve's client disconnected: nobody reads this result again
    t = request_trees(trt.spans())[str(res.request_id)]
    assert t.attributes[sc.ERROR_TYPE] == "aborted"
    assert t.attributes[sc.RESPONSE_FINISH_REASONS] == ("cancelled",)
    assert t.span.status.status_code == StatusCode.ERROR
    assert t.attributes[sc.SAMPLING_REASON] == "error"
    assert trt.inst.telemetry.requests == {}


@pytest.mark.parametrize("aborts", [False, True], ids=["1.2.1", "5f158410-calls-abort"])
def test_a_stop_string_is_not_an_abort(trt, monkeypatch, aborts) -> None:
    from tensorrt_llm.sampling_params import SamplingParams

    # 1.2.1 ends the result on a stop string; 5f158410 also called abort() from inside _handle_response
    monkeypatch.setattr(fake, "STOP_STRING_ABORTS", aborts)
    llm = _llm()
    res = llm.generate_async("a b c", SamplingParams(max_tokens=20, stop="t t t"), streaming=True)
    updates = sum(1 for _ in res)
    assert res.aborted() is aborts and updates == 3  # ended by the stop string, in either flow
    t = request_trees(trt.spans())[str(res.request_id)]
    a = t.attributes
    assert a[sc.RESPONSE_FINISH_REASONS] == ("stop",) and sc.ERROR_TYPE not in a
    assert t.span.status.status_code != StatusCode.ERROR
    assert trt.inst.telemetry.requests == {}


def test_engine_error_passes_through_and_is_recorded(trt) -> None:
    engine = fake.FakeEngine()
    llm = _llm(engine)
    res = llm.generate_async("a b c", _params())
    engine.failing.add(res.request_id)
    with pytest.raises(fake.RequestError, match="illegal memory access"):
        res.result()
    t = request_trees(trt.spans())[str(res.request_id)]
    assert t.attributes[sc.ERROR_TYPE] == "engine_error"
    assert t.span.status.status_code == StatusCode.ERROR
    assert trt.inst.telemetry.requests == {}


def test_iterations_shared_by_requests_become_linked_engine_steps(trt) -> None:
    engine = fake.FakeEngine(max_batch=8)
    llm = _llm(engine)
    llm.generate("warm up", _params(2))
    llm.get_stats()  # as trtllm-serve's /metrics does: from now on finished requests wait for their iterations
    trt.clear()
    outs = llm.generate(["a b c", "d e f g", "h i"], _params(4))
    assert trt.waiting() == 3
    pulled = llm.get_stats()  # the user's list is untouched; we read it as it passes
    assert [s["iter"] for s in pulled] == [s["iter"] for s in engine.stats_log[2:]]
    spans = trt.spans()
    trees = request_trees(spans)
    assert set(trees) == {str(o.request_id) for o in outs}
    steps = engine_steps(spans)
    span_of = {t.span.context.span_id: rid for rid, t in trees.items()}
    iters = {s["iter"]: s for s in engine.stats_log}
    served: dict[str, list[int]] = {rid: [] for rid in trees}
    for s in steps:
        a = s.attributes
        stats = iters[a[sc.ENGINE_STEP_ID]]
        ifb = stats["inflightBatchingStats"]
        assert a[sc.ENGINE] == "tensorrt_llm"
        assert a[sc.STEP_BATCH_SIZE] == ifb["numScheduledRequests"] == len(s.links)
        assert a[sc.STEP_NUM_PREFILL_REQS] == ifb["numContextRequests"]
        assert a[sc.STEP_NUM_PREFILL_TOKENS] == ifb["numCtxTokens"]
        assert a[sc.STEP_NUM_DECODE_REQS] == ifb["numGenRequests"]
        assert a[sc.STEP_NUM_RUNNING] == stats["numActiveRequests"]
        assert a[sc.STEP_KV_CACHE_USAGE] == pytest.approx(stats["kvCacheStats"]["usedNumBlocks"] / 100)
        assert a[sc.STEP_LATENCY] == pytest.approx(stats["iterLatencyMS"] / 1000)
        assert a[sc.STEP_GPU_MEMORY] == stats["gpuMemUsage"]
        assert s.end_time - s.start_time == pytest.approx(stats["iterLatencyMS"] * 1e6, abs=1000)
        for link in s.links:
            served[span_of[link.context.span_id]].append(a[sc.ENGINE_STEP_ID])
    for out in outs:
        perf = out.outputs[0].request_perf_metrics
        # an iteration links to a request when it is behind one of the request's own spans (its prefill
        # chunk, its decode steps: one per decode iteration, not streamed as it is): here every one of them
        linked = sorted(served[str(out.request_id)])
        assert linked == list(range(perf.first_iter, perf.last_iter + 1))
        chunks = trees[str(out.request_id)].grandchildren[sc.SPAN_PREFILL_CHUNK]
        assert len(chunks) == 1 and chunks[0].attributes[sc.CHUNK_TOKENS] == len(out.prompt_token_ids)
        assert chunks[0].attributes[sc.ENGINE_STEP_ID] == perf.first_iter
    assert len(steps) == len({i for v in served.values() for i in v})
    assert trt.waiting() == 0
    assert trt.inst.telemetry.steps == {}  # nothing held
    held = trt.inst.telemetry.ledger.held()
    # only the warm-up's iterations (no request waited for them) stay, until max_steps pushes them out
    assert held == {"iterations": 2, "waiting": 0, "open": 0, "by_first": 0, "by_last": 0}


def _linked_iterations(spans) -> dict[str, set[int]]:
    """Iterations (engine-step spans) each request's span is linked from, by response id."""
    trees = request_trees(spans)
    span_of = {t.span.context.span_id: rid for rid, t in trees.items()}
    served: dict[str, set[int]] = {rid: set() for rid in trees}
    for s in engine_steps(spans):
        for link in s.links:
            served[span_of[link.context.span_id]].add(s.attributes[sc.ENGINE_STEP_ID])
    return served


def test_a_request_not_streamed_links_every_iteration_that_served_it(trt) -> None:
    engine = fake.FakeEngine(max_batch=8)
    llm = _llm(engine)
    llm.generate("warm up", _params(2))
    llm.get_stats()
    trt.clear()
    outs = llm.generate(["a b c", "d e f g"], _params(5))  # not streamed: one update each, at the end
    llm.get_stats()
    spans = trt.spans()
    trees = request_trees(spans)
    served = _linked_iterations(spans)
    for out in outs:
        perf = out.outputs[0].request_perf_metrics
        t = trees[str(out.request_id)]
        # its prefill iteration (the chunk span) and each decode iteration (a decode-step span)
        assert served[str(out.request_id)] == set(range(perf.first_iter, perf.last_iter + 1))
        rows = t.decode_rows()
        assert [r.name for r in rows] == [sc.SPAN_DECODE_STEP] * 4  # 5 tokens: the first, then 4 iterations
        assert [r.attributes[sc.ENGINE_STEP_ID] for r in rows] == list(range(perf.first_iter + 1,
                                                                             perf.last_iter + 1))
        assert [r.attributes[sc.STEP_TOKENS] for r in rows] == [1, 1, 1, 1]
        d = t.one(sc.SPAN_DECODE)  # the rows tile the decode span
        assert rows[0].start_time == d.start_time and rows[-1].end_time <= d.end_time
        for a, b in zip(rows, rows[1:]):
            assert a.end_time == b.start_time
        # the timings stay TensorRT-LLM's own
        arrival, sched, first, last = _times(out)
        assert t.attributes[sc.LATENCY_DECODE] == pytest.approx(last - first, abs=1e-9)
        assert t.attributes[sc.LATENCY_TPOT] == pytest.approx((last - first) / 4, abs=1e-9)
    assert trt.inst.telemetry.steps == {} and trt.waiting() == 0


def test_a_request_not_streamed_with_speculative_decoding(trt) -> None:
    llm = _llm(fake.FakeEngine(tokens_per_step=3))
    llm.generate("warm up", _params(2))
    llm.get_stats()
    trt.clear()
    out = llm.generate("a b c", _params(7))  # 1 token (prefill) + 3 + 3
    llm.get_stats()
    spans = trt.spans()
    t = request_trees(spans)[str(out.request_id)]
    perf = out.outputs[0].request_perf_metrics
    rows = t.decode_rows()
    assert [r.attributes[sc.STEP_TOKENS] for r in rows] == [3, 3]
    assert [r.attributes[sc.ENGINE_STEP_ID] for r in rows] == [perf.first_iter + 1, perf.first_iter + 2]
    assert _linked_iterations(spans)[str(out.request_id)] == set(range(perf.first_iter, perf.last_iter + 1))


def _streamed(llm, prompt: str, max_tokens: int):
    res = llm.generate_async(prompt, _params(max_tokens), streaming=True)
    updates = sum(1 for _ in res)
    return res, updates


def test_a_streamed_request_links_every_decode_iteration(trt) -> None:
    llm = _llm()
    llm.generate("warm up", _params(2))
    llm.get_stats()
    trt.clear()
    res, updates = _streamed(llm, "a b c", 6)
    llm.get_stats()
    spans = trt.spans()
    t = request_trees(spans)[str(res.request_id)]
    perf = res.outputs[0].request_perf_metrics
    assert updates == 6 and _linked_iterations(spans)[str(res.request_id)] == set(
        range(perf.first_iter, perf.last_iter + 1))
    rows = t.decode_rows()
    # each update after the first, at the end of the iteration that produced it
    assert [r.attributes[sc.ENGINE_STEP_ID] for r in rows] == list(range(perf.first_iter + 1, perf.last_iter + 1))
    assert [r.attributes[sc.STEP_TOKENS] for r in rows] == [1] * 5
    for a, b in zip(rows, rows[1:]):
        assert a.end_time == b.start_time


def test_a_streamed_request_with_speculative_decoding_pairs_updates_and_iterations(trt) -> None:
    llm = _llm(fake.FakeEngine(tokens_per_step=3))
    llm.generate("warm up", _params(2))
    llm.get_stats()
    trt.clear()
    res, updates = _streamed(llm, "a b c", 7)  # updates of 1, 3, 3 tokens
    llm.get_stats()
    rows = request_trees(trt.spans())[str(res.request_id)].decode_rows()
    perf = res.outputs[0].request_perf_metrics
    assert [(r.attributes[sc.ENGINE_STEP_ID], r.attributes[sc.STEP_TOKENS]) for r in rows] == [
        (perf.first_iter + 1, 3), (perf.first_iter + 2, 3)]


def test_a_chunked_prompt_does_not_shift_the_decode_iterations(trt) -> None:
    llm = _llm(fake.FakeEngine(chunk=2))
    llm.generate("warm up", _params(2))
    llm.get_stats()
    trt.clear()
    res, _ = _streamed(llm, "a b c d e", 3)  # prompt in 3 iterations (2 + 2 + 1 tokens), then 2 decode ones
    out = llm.generate("f g h i j", _params(3))  # the same, not streamed
    llm.get_stats()
    trees = request_trees(trt.spans())
    for r in (res, out):
        perf = r.outputs[0].request_perf_metrics
        assert perf.last_iter - perf.first_iter == 4
        rows = trees[str(r.request_id)].decode_rows()
        assert [row.attributes[sc.ENGINE_STEP_ID] for row in rows] == [perf.last_iter - 1, perf.last_iter]


def test_a_long_request_not_streamed_stays_within_the_span_budget() -> None:
    modules = fake.build()
    fake.install(modules)
    env = instrumented(modules, max_spans_per_request=12)
    try:
        from tensorrt_llm.llmapi.llm import LLM

        llm = LLM(model="tiny-llama", engine=fake.FakeEngine())
        llm.generate("warm up", _params(2))
        llm.get_stats()
        env.clear()
        out = llm.generate("a b c", _params(40))
        llm.get_stats()
        spans = env.spans()
        t = request_trees(spans)[str(out.request_id)]
        rows = t.decode_rows()
        # request, queue, prefill, decode, its chunk: the rest of 12 for decode rows; every token accounted for
        assert 1 <= len(rows) <= 12 - 5
        assert sum(row_tokens(r) for r in rows) == 39
        linked = _linked_iterations(spans)[str(out.request_id)]
        kept_steps = {r.attributes[sc.ENGINE_STEP_ID] for r in rows if r.name == sc.SPAN_DECODE_STEP}
        perf = out.outputs[0].request_perf_metrics
        assert linked == {perf.first_iter} | kept_steps  # only iterations behind its own spans link to it
    finally:
        env.inst.uninstrument()
        fake.uninstall()


def test_decode_stamps_for_requests_not_streamed() -> None:
    from otel_llm.core.timeline import RequestTimeline
    from otel_llm.instrumentation.tensorrt_llm.iterations import decode_stamps

    def timeline(streamed: bool = False) -> RequestTimeline:
        t = RequestTimeline(request_id="r", arrival=0.0, request_attributes={sc.REQUEST_STREAM: True} if streamed
                            else {})
        t.token_ts = [10.0]
        return t

    ends = {k: 10.0 + (k - 4) for k in range(4, 9)}  # iterations 4..8 end at 10, 11, .. 14
    t = timeline()
    decode_stamps(t, 5, 4, 8, ends)  # 4 decode iterations, one token each
    assert t.token_ts == [10.0, 11.0, 12.0, 13.0, 14.0] and t.multi_token_steps is None
    t = timeline()
    decode_stamps(t, 3, 4, 8, ends)  # more iterations than tokens: 4..6 computed a chunked prompt
    assert t.token_ts == [10.0, 13.0, 14.0] and t.multi_token_steps is None
    t = timeline()
    decode_stamps(t, 9, 4, 6, ends)  # speculative decoding: 8 tokens over 2 iterations
    assert t.token_ts == [10.0, 11.0, 12.0] and t.multi_token_steps == {1: 4, 2: 4}
    t = timeline()
    decode_stamps(t, 8, 4, 6, ends)  # 7 tokens over 2 iterations: split as evenly as integers go
    assert t.multi_token_steps == {1: 4, 2: 3}
    t = timeline()
    decode_stamps(t, 5, 4, 8, {k: v for k, v in ends.items() if k not in (6, 8)})  # stats missing
    assert t.token_ts == [10.0, 11.0, 13.0] and t.multi_token_steps == {2: 3}  # 6 to 7, 8 to the last known
    t = timeline()
    decode_stamps(t, 5, 4, 8, {4: 10.0, 5: 9.5, 6: 12.0, 7: 13.0, 8: 14.0})  # clocks disagree: never backwards
    assert t.token_ts == [10.0, 10.0, 12.0, 13.0, 14.0]
    for t, args in ((timeline(), (1, 4, 8, ends)), (timeline(), (5, 4, 8, {}))):
        decode_stamps(t, *args)  # no decode tokens, no stats: untouched
        assert t.token_ts == [10.0] and t.multi_token_steps is None


def test_decode_stamps_for_streamed_requests() -> None:
    from otel_llm.core.timeline import RequestTimeline
    from otel_llm.instrumentation.tensorrt_llm.iterations import decode_stamps

    def streamed(*counts: int) -> RequestTimeline:
        t = RequestTimeline(request_id="r", arrival=0.0, request_attributes={sc.REQUEST_STREAM: True})
        t.token_ts = [10.0]
        for i, n in enumerate(counts):
            t.add_tokens(20.0 + i, n)  # when the updates reached the caller: after the iterations
        return t

    ends = {k: 10.0 + (k - 4) for k in range(4, 9)}  # iterations 4..8 end at 10, 11, .. 14
    t = streamed(1, 1, 1, 1)
    decode_stamps(t, 5, 4, 8, ends)  # one update per iteration: each at its iteration's end
    assert t.token_ts == [10.0, 11.0, 12.0, 13.0, 14.0] and t.multi_token_steps is None
    t = streamed(2, 2)
    decode_stamps(t, 5, 4, 8, ends)  # an update every 2 iterations: at the end of the one of its last token
    assert t.token_ts == [10.0, 12.0, 14.0] and t.multi_token_steps == {1: 2, 2: 2}
    t = streamed(1, 1)
    decode_stamps(t, 3, 4, 8, ends)  # a chunked prompt: the first token came from iteration 6
    assert t.token_ts == [10.0, 13.0, 14.0]
    t = streamed(3, 3)
    decode_stamps(t, 7, 4, 6, ends)  # speculative decoding, one update per iteration
    assert t.token_ts == [10.0, 11.0, 12.0] and t.multi_token_steps == {1: 3, 2: 3}
    t = streamed(3, 3)
    decode_stamps(t, 7, 4, 5, ends)  # more tokens than iterations, updates and iterations not one to one
    assert t.token_ts == [10.0, 20.0, 21.0]  # left as they reached the caller
    t = streamed(1, 1, 1, 1)
    decode_stamps(t, 5, 4, 8, {k: v for k, v in ends.items() if k != 6})  # iteration 6's stats missing
    assert t.token_ts == [10.0, 20.0, 21.0, 22.0, 23.0]  # all or nothing: left as they reached the caller
    t = streamed(1, 1, 1, 1)
    decode_stamps(t, 5, 4, 8, {4: 10.0, 5: 9.0, 6: 12.0, 7: 11.5, 8: 14.0})  # clocks disagree: never backwards
    assert t.token_ts == [10.0, 10.0, 12.0, 12.0, 14.0]


def test_iterations_pulled_by_get_stats_async(trt) -> None:
    llm = _llm()
    llm.generate("warm up", _params(2))

    async def pull():
        return [s async for s in llm.get_stats_async(2)]

    asyncio.run(pull())
    trt.clear()
    out = llm.generate("a b c", _params(3))
    asyncio.run(pull())
    steps = engine_steps(trt.spans())
    perf = out.outputs[0].request_perf_metrics
    ids = {s.attributes[sc.ENGINE_STEP_ID] for s in steps}  # those behind the request's own spans
    assert ids == set(range(perf.first_iter, perf.last_iter + 1))


def test_a_request_waits_no_longer_than_its_bound(trt) -> None:
    llm = _llm()
    llm.generate("warm up", _params(2))
    llm.get_stats()
    clock = [0.0]
    trt.inst.telemetry.ledger._clock = lambda: clock[0]
    out = llm.generate("a b c", _params(3))
    assert trt.waiting() == 1
    clock[0] += trt.inst.telemetry.ledger.wait_s + 1
    llm.generate("d e", _params(2))  # any later event settles what waited too long
    assert trt.inst.telemetry.ledger.sync(10)
    assert trt.inst.telemetry.ledger.released_early >= 1
    assert str(out.request_id) in request_trees(trt.spans())


def test_trtllm_serve_honours_incoming_traceparent(trt) -> None:
    from tensorrt_llm.serve.openai_server import OpenAIServer

    server = OpenAIServer(_llm(), model="served-model")
    trace_id, parent = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331

    class Raw:
        headers = {"Traceparent": f"00-{trace_id:032x}-{parent:016x}-01"}

    for handler, operation, stream in ((server.openai_chat, "chat", True),
                                       (server.openai_completion, "text_completion", False)):
        trt.clear()
        res = asyncio.run(handler({"prompt": "a b c", "max_tokens": 3, "stream": stream}, Raw()))
        t = request_trees(trt.spans())[str(res.request_id)]
        assert t.span.name == f"{operation} served-model" and t.span.kind == SpanKind.SERVER
        assert t.span.context.trace_id == trace_id and t.span.parent.span_id == parent


def test_request_span_joins_the_callers_trace(trt) -> None:
    tracer = trt.tracer_provider.get_tracer("test")
    llm = _llm()
    with tracer.start_as_current_span("caller") as caller:
        out = llm.generate("a b c", _params(3))
    span = request_trees(trt.spans())[str(out.request_id)].span
    assert span.context.trace_id == caller.get_span_context().trace_id
    assert span.parent.span_id == caller.get_span_context().span_id
    # TensorRT-LLM got the caller's context too: its own llm_request span (tracing on) joins this trace
    ctx = caller.get_span_context()
    assert out.trace_headers == {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"}


def test_headers_the_caller_passed_are_left_alone(trt) -> None:
    tracer = trt.tracer_provider.get_tracer("test")
    theirs = {"traceparent": f"00-{0xABC:032x}-{0xDEF:016x}-01"}
    llm = _llm()
    with tracer.start_as_current_span("caller"):
        out = llm.generate_async("a b c", _params(2), trace_headers=theirs)
        out.result()
    assert out.trace_headers is theirs
    # the current span wins over headers for our span's parent, as for vLLM
    assert request_trees(trt.spans())[str(out.request_id)].span.parent.span_id != 0xDEF


def test_errors_of_ours_never_reach_the_caller(trt, monkeypatch) -> None:
    from otel_llm.instrumentation.tensorrt_llm import wrappers

    def broken(*a, **k):
        raise ValueError("bug of ours")

    monkeypatch.setattr(wrappers, "finalize", broken)
    guard = trt.inst.guard  # the instrumentor's, kept for the process (earlier tests' counts are in it)
    before = guard.errors["GenerationResult._handle_response"]
    out = _llm().generate("a b c", _params(3))
    assert out.outputs[0].length == 3
    assert guard.errors["GenerationResult._handle_response"] == before + 1


def test_uninstrument_removes_every_wrapper(trt) -> None:
    from otel_llm.instrumentation.wraps import is_wrapped

    llm_mod, result_mod = trt.modules["tensorrt_llm.llmapi.llm"], trt.modules["tensorrt_llm.executor.result"]
    assert is_wrapped(llm_mod.BaseLLM, "generate_async")
    assert is_wrapped(result_mod.DetokenizedGenerationResultBase, "_handle_response")
    trt.inst.uninstrument()
    assert not is_wrapped(llm_mod.BaseLLM, "generate_async")
    assert not is_wrapped(result_mod.DetokenizedGenerationResultBase, "_handle_response")
    assert not is_wrapped(trt.modules["tensorrt_llm.serve.openai_server"].OpenAIServer, "openai_chat")
    trt.inst.instrument(tracer_provider=trt.tracer_provider, meter_provider=MeterProvider())  # the fixture's teardown uninstruments again


def test_engine_steps_off_nothing_waits_and_no_step_spans() -> None:
    from trtllm_env import instrumented

    modules = fake.build()
    fake.install(modules)
    env = instrumented(modules, engine_steps=False, iteration_wait=60)
    try:
        assert env.inst.telemetry.ledger.wait_s == 60
        llm = _llm()
        llm.generate("warm up", _params(2))
        llm.get_stats()
        out = llm.generate("a b c", _params(3))
        assert env.waiting() == 0
        llm.get_stats()
        spans = env.spans()
        assert str(out.request_id) in request_trees(spans) and engine_steps(spans) == []
    finally:
        env.inst.uninstrument()
        fake.uninstall()


def test_iteration_stats_translation() -> None:
    import datetime as dt

    from otel_llm.instrumentation.tensorrt_llm.iterations import iteration_from_stats

    now_mono, now_wall = 5000.0, 1_800_000_000.0
    started = dt.datetime.fromtimestamp(now_wall - 2.0)
    stats = {"iter": 7, "timestamp": started.strftime("%m-%d-%Y %H:%M:%S.%f"), "iterLatencyMS": 12.5,
             "numActiveRequests": 3, "numQueuedRequests": 4, "gpuMemUsage": 123,
             "kvCacheStats": {"usedNumBlocks": 25, "maxNumBlocks": 100},
             "inflightBatchingStats": {"numScheduledRequests": 3, "numContextRequests": 1, "numGenRequests": 2,
                                       "numPausedRequests": 1, "numCtxTokens": 40,
                                       "avgNumDecodedTokensPerIter": 2.5}}
    it = iteration_from_stats(stats, now_mono, now_wall)
    step = it.step
    assert step.step_id == 7 and it.scheduled == 3 and it.context_tokens == 40
    assert step.start == pytest.approx(now_mono - 2.0, abs=1e-5)  # local wall time -> engine monotonic
    assert step.end - step.start == pytest.approx(0.0125)
    assert (step.running, step.waiting, step.preempted, step.kv_cache_usage) == (3, 4, 1, 0.25)
    a = step.attributes
    assert a[sc.STEP_PHASE] == "mixed" and a[sc.STEP_NUM_DECODE_TOKENS] == 5 and a[sc.STEP_GPU_MEMORY] == 123
    # a timestamp we cannot read: the iteration ended no later than when we saw it
    it = iteration_from_stats({**stats, "timestamp": "12:00:01"}, now_mono, now_wall)
    assert it.step.end == pytest.approx(now_mono)
    assert iteration_from_stats({"iterLatencyMS": 1.0}, now_mono, now_wall) is None  # no iteration number


def test_get_stats_as_json_strings_is_read_too(trt, monkeypatch) -> None:
    import json

    llm = _llm()
    llm.generate("warm up", _params(2))
    llm.get_stats()
    trt.clear()
    out = llm.generate("a b c", _params(3))
    engine = llm._executor
    raw = [json.dumps(s) for s in engine.stats_log[2:]]
    monkeypatch.setattr(engine, "get_stats", lambda timeout: list(raw))
    assert llm.get_stats() == raw  # the caller gets exactly what TensorRT-LLM returned
    perf = out.outputs[0].request_perf_metrics
    ids = sorted(s.attributes[sc.ENGINE_STEP_ID] for s in engine_steps(trt.spans()))
    assert perf.first_iter in ids and set(ids) <= set(range(perf.first_iter, perf.last_iter + 1))


def test_two_llms_in_one_process_reuse_request_ids_without_mixing_them(trt) -> None:
    a, b = _llm(), _llm()
    ra = a.generate_async("a b c", _params(3), streaming=True)
    rb = b.generate_async("d e", _params(5), streaming=True)
    assert ra.request_id == rb.request_id  # each executor counts from 1
    next(ra), next(rb)
    ra.result(), rb.result()
    spans = [s for s in trt.spans() if s.attributes.get(sc.LATENCY_E2E) is not None]
    assert sorted(s.attributes[sc.USAGE_OUTPUT_TOKENS] for s in spans) == [3, 5]
    assert {s.attributes[sc.RESPONSE_ID] for s in spans} == {str(ra.request_id)}


def test_the_hosts_exception_survives_a_bug_of_ours_in_the_error_path(trt, monkeypatch) -> None:
    from otel_llm.instrumentation.tensorrt_llm import wrappers

    def broken(*a, **k):
        raise ValueError("bug of ours")

    monkeypatch.setattr(wrappers, "finalize", broken)
    engine = fake.FakeEngine()
    llm = _llm(engine)
    res = llm.generate_async("a b c", _params())
    engine.failing.add(res.request_id)
    with pytest.raises(fake.RequestError, match="illegal memory access"):
        res.result()


def test_request_attributes_from_sampling_params(trt) -> None:
    from tensorrt_llm.sampling_params import SamplingParams

    out = _llm().generate("a b c", SamplingParams(max_tokens=3, top_k=40, seed=7, frequency_penalty=0.5,
                                                  presence_penalty=0.0, stop=["zzz"], temperature=0.7))
    a = request_trees(trt.spans())[str(out.request_id)].attributes
    assert (a[sc.REQUEST_TOP_K], a[sc.REQUEST_SEED], a[sc.REQUEST_FREQUENCY_PENALTY]) == (40, 7, 0.5)
    assert a[sc.REQUEST_STOP_SEQUENCES] == ("zzz",) and a[sc.REQUEST_TEMPERATURE] == 0.7
    assert sc.REQUEST_PRESENCE_PENALTY not in a and sc.REQUEST_CHOICE_COUNT not in a  # off: left out
    assert a[sc.RESPONSE_MODEL] == a[sc.REQUEST_MODEL] == "tiny-llama"


def test_iteration_stats_switched_on_links_even_the_first_requests(trt) -> None:
    from tensorrt_llm.llmapi.llm import LLM

    # the offline pattern: generate, then read the stats once at the end
    llm = LLM(model="tiny-llama", engine=fake.FakeEngine(), enable_iter_perf_stats=True)
    outs = llm.generate(["a b c", "d e"], _params(3))
    assert trt.waiting() == 2
    llm.get_stats()
    spans = trt.spans()
    trees = request_trees(spans)
    linked = {link.context.span_id for s in engine_steps(spans) for link in s.links}
    assert {trees[str(o.request_id)].span.context.span_id for o in outs} <= linked


def test_the_ledger_holds_nothing_for_requests_it_let_go() -> None:
    from otel_llm.core.summary import RequestSummary
    from otel_llm.core.timeline import RequestTimeline
    from otel_llm.instrumentation.tensorrt_llm.iterations import IterationLedger

    finished, steps = [], []
    clock = [0.0]
    ledger = IterationLedger(steps.append, lambda rid, s: finished.append(rid), max_steps=16, max_waiting=4,
                             wait_s=1.0, clock=lambda: clock[0], background=False)
    ledger.expect()
    stats = lambda k, n: {"iter": k, "iterLatencyMS": 1.0,  # noqa: E731
                          "inflightBatchingStats": {"numScheduledRequests": n, "numContextRequests": 0,
                                                    "numGenRequests": n, "numCtxTokens": 0}}
    # two requests over iterations 0..3, their stats arrive after they finished: released together
    for i, (first, last) in enumerate(((0, 3), (1, 3))):
        ledger.finished(RequestTimeline(f"r{i}", 0.0, input_tokens=4), RequestSummary(), (first, last))
    for k, n in ((0, 1), (1, 2), (2, 2), (3, 2)):
        ledger.observe(stats(k, n))
    assert sorted(finished) == ["r0", "r1"] and sorted(s.step_id for s in steps) == [0, 1, 2, 3]
    assert [len(s.requests) for s in sorted(steps, key=lambda s: s.step_id)] == [1, 2, 2, 2]
    assert ledger.released_early == 0
    # stats that never come: released at the deadline, and nothing of them stays behind
    for i in range(6):
        ledger.finished(RequestTimeline(f"q{i}", 0.0), RequestSummary(), (10 + i, 20 + i))
    assert len(ledger.waiting) == 4  # max_waiting: the oldest went early
    clock[0] += 2.0
    ledger.release()
    assert ledger.held() == {"iterations": 0, "waiting": 0, "open": 0, "by_first": 0, "by_last": 0}
    assert len(finished) == 8 and ledger.released_early == 6
