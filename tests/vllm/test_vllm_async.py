"""AsyncLLM streaming, and an abort mid-stream, on the real engine."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.trace import StatusCode

from otel_llm import semconv as sc
from support.traces import request_trees

pytestmark = pytest.mark.engine


async def _drive(engine):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    prompt = {"prompt_token_ids": list(range(5, 45))}
    delta = dict(ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    streamed = 0
    async for out in engine.generate(prompt, SamplingParams(max_tokens=16, **delta), "complete-1"):
        streamed += len(out.outputs[0].token_ids)
    seen = 0
    gen = engine.generate(prompt, SamplingParams(max_tokens=400, **delta), "abort-1")
    async for out in gen:
        seen += 1
        if seen == 3:
            break  # the caller walks away mid-stream
    await gen.aclose()  # what the event loop does to an abandoned generator: vLLM aborts the request
    # the abort reaches the output processor asynchronously: wait for it (generously: a loaded machine
    # can take seconds), not for a fixed number of polls
    deadline = asyncio.get_running_loop().time() + 120
    while engine.output_processor.has_unfinished_requests() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert not engine.output_processor.has_unfinished_requests(), "the abort never reached the output processor"
    # parallel sampling: AsyncLLM fans n=2 out to two engine requests under one ParentRequest
    parallel = {}
    async for out in engine.generate(prompt, SamplingParams(max_tokens=6, n=2, ignore_eos=True, temperature=0.8,
                                                       output_kind=RequestOutputKind.DELTA), "parallel-1"):
        for c in out.outputs:
            parallel[c.index] = parallel.get(c.index, 0) + len(c.token_ids)
    return streamed, parallel


@pytest.fixture(scope="module")
def run(otel):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from support.engine import engine_args

    with otel.instrumented(sample_rate=1.0, tail_quantile=0) as inst:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args()))
        try:
            streamed, parallel = asyncio.run(_drive(engine))
        finally:
            engine.shutdown()
        spans = otel.finished()
        held = set(inst.telemetry.requests)
        requests = otel.counter("llm.server.requests")
    return (streamed, parallel), spans, held, requests


def test_streamed_request_is_traced(run):
    (streamed, _), spans, _, _ = run
    t = request_trees(spans)["complete-1"]
    assert streamed == 16 == t.attributes[sc.USAGE_OUTPUT_TOKENS]
    assert t.span.status.status_code != StatusCode.ERROR
    assert t.attributes[sc.RESPONSE_FINISH_REASONS] == ("length",)
    assert t.children[sc.SPAN_DECODE]


def test_abort_mid_stream_ends_in_error_and_releases_state(run):
    _, spans, held, requests = run
    t = request_trees(spans)["abort-1"]
    assert t.span.status.status_code == StatusCode.ERROR
    assert t.attributes[sc.RESPONSE_FINISH_REASONS] == ("abort",)
    assert t.attributes[sc.ERROR_TYPE] == "aborted"
    assert t.attributes[sc.SAMPLING_REASON] == "error"
    assert 0 < t.attributes[sc.USAGE_OUTPUT_TOKENS] < 400
    assert held == set(), "the adapter holds no state for finished or aborted requests"
    assert requests == 4  # per sequence, as vLLM counts finished requests: 1 + 1 + the 2 of n=2


def test_parallel_sampling_is_one_trace_with_a_choice_per_sequence(run):
    (_, parallel), spans, _, _ = run
    t = request_trees(spans)["parallel-1"]
    assert t.attributes[sc.REQUEST_CHOICE_COUNT] == 2
    choices = sorted(t.children[sc.SPAN_CHOICE], key=lambda c: c.attributes[sc.CHOICE_INDEX])
    assert [c.attributes[sc.CHOICE_INDEX] for c in choices] == [0, 1]
    assert [c.attributes[sc.USAGE_OUTPUT_TOKENS] for c in choices] == [parallel[0], parallel[1]] == [6, 6]
    assert t.attributes[sc.USAGE_OUTPUT_TOKENS] == 12
    in_trace = [x for x in spans if x.context.trace_id == t.span.context.trace_id]
    assert {x.name for x in in_trace if x.parent and x.parent.span_id in {c.context.span_id for c in choices}} \
        >= {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE}
