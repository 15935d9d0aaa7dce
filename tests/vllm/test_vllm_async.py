"""AsyncLLM streaming, an abort mid-stream and parallel sampling, on the real engine, with the agent.

The engine is built while instrumented with providers as ``OTEL_*`` configures them (OTLP/HTTP exporters whose
endpoint comes from the variables), as ``vllm serve`` under ``opentelemetry-instrument`` is: an agent process
does the work, and the assertions read what it exported to a real OTLP receiver."""

from __future__ import annotations

import asyncio
import os

import pytest
from opentelemetry.trace import StatusCode

import otel_llm
from otel_llm import semconv as sc
from support.otlp_sink import OTLPSink
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
def run():
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from otel_llm.instrumentation.vllm import VLLMInstrumentor
    from support.engine import engine_args

    with OTLPSink() as sink, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint)  # the agent inherits the variables
        tp = TracerProvider()
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        # a day's interval: the points come with flush(), not with the machine's timing
        mp_ = MeterProvider(metric_readers=[
            PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=86_400_000)])
        otel_llm.uninstrument()
        inst = VLLMInstrumentor()
        # an agent lives as long as its process, and exports where the variables pointed when it started: one
        # an earlier module started (another receiver) goes, and this engine's starts its own
        inst.runtime.close_agent()
        otel_llm.instrument(tracer_provider=tp, meter_provider=mp_, sample_rate=1.0, tail_quantile=0)
        try:
            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args()))
            try:
                streamed, parallel = asyncio.run(_drive(engine))
            finally:
                engine.shutdown()
            assert otel_llm.flush(60)  # the agent's spans and metrics sent (60 s: a bound for a hang)
            stats = otel_llm.stats()
            agent = inst.runtime.agent
            held = set(inst.telemetry.requests) | set(inst.instrumentation.wrappers.enriching)
        finally:
            otel_llm.uninstrument()
            inst.runtime.close_agent()  # (its receiver goes with this module)
            tp.shutdown()
            mp_.shutdown()
        spans = [x.readable() for x in sink.spans()]
        points = sink.metric_points("llm.server.requests")
        last = max((p.time_ns for p in points), default=0)  # cumulative: the last export holds every request
        requests = sum(p.value for p in points if p.time_ns == last)
    return (streamed, parallel), spans, held, requests, stats, agent


def test_an_agent_did_the_work(run):
    *_, stats, agent = run
    s = stats["vllm"]
    assert agent is not None and s["agent_pid"] == agent.pid != os.getpid()
    assert s["agent_dropped"] == s["agent_lost"] == s["agent_unreachable"] == 0
    # the one path: the engine's records, each enriched once: complete-1, abort-1 (its enrichment sent at the
    # abort) and the two sequences of parallel-1
    assert s["agent_engine_starts"] == s["agent_engine_finishes"] == s["agent_enriched"] == 4
    assert s["agent_enrichments_missing"] == s["agent_orphans"] == 0
    assert stats["errors"] == {}


def test_streamed_request_is_traced(run):
    (streamed, _), spans, *_ = run
    t = request_trees(spans)["complete-1"]
    assert streamed == 16 == t.attributes[sc.USAGE_OUTPUT_TOKENS]
    assert t.span.status.status_code != StatusCode.ERROR
    assert t.attributes[sc.RESPONSE_FINISH_REASONS] == ("length",)
    assert t.children[sc.SPAN_DECODE]


def test_abort_mid_stream_ends_in_error_and_releases_state(run):
    _, spans, held, requests, *_ = run
    t = request_trees(spans)["abort-1"]
    assert t.span.status.status_code == StatusCode.ERROR
    assert t.attributes[sc.RESPONSE_FINISH_REASONS] == ("abort",)
    assert t.attributes[sc.ERROR_TYPE] == "aborted"
    assert t.attributes[sc.SAMPLING_REASON] == "error"
    assert 0 < t.attributes[sc.USAGE_OUTPUT_TOKENS] < 400
    assert held == set(), "the adapter holds no state for finished or aborted requests"
    assert requests == 4  # per sequence, as vLLM counts finished requests: 1 + 1 + the 2 of n=2


def test_parallel_sampling_is_one_trace_with_a_choice_per_sequence(run):
    (_, parallel), spans, *_ = run
    t = request_trees(spans)["parallel-1"]
    assert t.attributes[sc.REQUEST_CHOICE_COUNT] == 2
    choices = sorted(t.children[sc.SPAN_CHOICE], key=lambda c: c.attributes[sc.CHOICE_INDEX])
    assert [c.attributes[sc.CHOICE_INDEX] for c in choices] == [0, 1]
    assert [c.attributes[sc.USAGE_OUTPUT_TOKENS] for c in choices] == [parallel[0], parallel[1]] == [6, 6]
    assert t.attributes[sc.USAGE_OUTPUT_TOKENS] == 12
    in_trace = [x for x in spans if x.context.trace_id == t.span.context.trace_id]
    assert {x.name for x in in_trace if x.parent and x.parent.span_id in {c.context.span_id for c in choices}} \
        >= {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE}
