"""The agent process on the real engine: the offline contract, unchanged, with the work done off the frontend.

The engine of this module is built while instrumented with providers as ``OTEL_*`` configures them (the
SDK's batch processor and periodic metric reader around OTLP/HTTP exporters whose endpoint comes from the
variables), so ``agent=auto`` starts an agent process: the frontend hands each request's start and finish
to it, the agent reads the EngineCore's step records, builds the spans and metrics and exports them to a
real OTLP receiver. The assertions of ``test_vllm_offline.py`` then run, unchanged, on what it exported.

It runs on the paths of a machine that is not x86-64 Linux (e.g. ARM GH200), which every other engine test
here does not take: no shared-memory rings (the EngineCore's step records as datagrams, the frontend's messages
to the agent as packets) and no C extension, in the frontend (``link.USE_RING``), the spawned EngineCore and the
agent (support/portable_site/sitecustomize.py on their PYTHONPATH).

Then a later engine in the same process, off the one path (n-gram speculative decoding), whose requests the
frontend hands the same agent as its own start and finish records (agent/control.py), on the same channels.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

import otel_llm
from otel_llm import semconv as sc
from support.otlp_sink import OTLPSink
from support.traces import row_tokens

pytestmark = pytest.mark.engine

PORTABLE_SITE = Path(__file__).resolve().parents[1] / "support" / "portable_site"

_spec = importlib.util.spec_from_file_location("offline_contract", Path(__file__).with_name("test_vllm_offline.py"))
offline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(offline)

# the offline contract's assertions on the full-detail run, collected here against this module's run
test_one_request_span_each_with_engine_timings = offline.test_one_request_span_each_with_engine_timings
test_phases_tile_the_request_span = offline.test_phases_tile_the_request_span
test_chunked_prefill_is_visible = offline.test_chunked_prefill_is_visible
test_engine_steps_match_the_scheduler_and_link_requests = offline.test_engine_steps_match_the_scheduler_and_link_requests
test_ttft_histogram_counts_every_request_with_engine_sum = offline.test_ttft_histogram_counts_every_request_with_engine_sum


class AgentRun:
    def __init__(self, outputs: list, spans: list, sink: OTLPSink, stats: dict, receiver: Any,
                 agent_pid: int, errors: dict) -> None:
        self.outputs, self.spans, self.sink, self.stats = outputs, spans, sink, stats
        self.receiver, self.agent_pid, self.errors = receiver, agent_pid, errors


@pytest.fixture(scope="module")
def agent_run():
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from otel_llm.instrumentation.vllm import VLLMInstrumentor
    from support.engine import make_llm

    from otel_llm.agent import link

    sink = OTLPSink().start()
    marks = tempfile.mkdtemp(prefix="otel-llm-portable-")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint)  # the agent inherits the variables
        # the portable paths: packets to the agent from here; datagrams and pure Python in what is spawned
        mp.setattr(link, "USE_RING", False)
        mp.setenv("PYTHONPATH", os.pathsep.join([str(PORTABLE_SITE), os.environ.get("PYTHONPATH", "")]))
        mp.setenv("OTEL_LLM_TEST_MARKS", marks)
        resource = Resource.create({"service.name": "agent-contract", "process.pid": os.getpid()})
        tp = TracerProvider(resource=resource)
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        # a day's interval: the points come with flush(), not with the machine's timing
        mp_ = MeterProvider(resource=resource, metric_readers=[
            PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=86_400_000)])
        otel_llm.uninstrument()
        otel_llm.instrument(tracer_provider=tp, meter_provider=mp_, sample_rate=1.0, baseline_detail="steps",
                            tail_quantile=0)
        inst = VLLMInstrumentor()
        try:
            llm = make_llm()
            outputs = llm.generate(offline.PROMPTS, offline._params(), use_tqdm=False)
            assert otel_llm.flush(60)  # the agent's spans and metrics sent (60 s: a bound for a hang)
            stats = otel_llm.stats()
            run = AgentRun(outputs, [s.readable() for s in sink.spans()], sink, stats["vllm"], inst.runtime.step_receiver,
                           inst.runtime.agent.pid if inst.runtime.agent is not None else 0, stats["errors"])
            run.sink_spans, run.points = sink.spans(), sink.metric_points()  # (before the stop-string request)
            run.stop = _stop_string_run(llm, sink)
            # the frontend's half (core/agent_pipeline.py) holds the in-flight timelines and no step buffer at all
            assert type(inst.telemetry).__name__ == "AgentPipeline" and not hasattr(inst.telemetry, "steps")
            run.held = (len(inst.telemetry.requests), 0)
            run.portable = sorted(os.listdir(marks))
            run.agent_ring = inst.runtime.agent.ring if inst.runtime.agent is not None else "no agent"
            processor = llm.llm_engine.output_processor
            run.passed = "process_outputs" in vars(processor)  # its output batches went straight to vLLM's
            otel_llm.uninstrument()
            run.restored = "process_outputs" not in vars(processor)
            del llm, processor
        finally:
            otel_llm.uninstrument()
            tp.shutdown()
            mp_.shutdown()
    yield run
    sink.stop()
    shutil.rmtree(marks, ignore_errors=True)


def _stop_string_run(llm: Any, sink: OTLPSink) -> dict[str, Any]:
    """One greedy request, then the same one with a stop string from the middle of its text, and a flush at
    once: the frontend lets the request go at the stop string and aborts it in the engine, whose finish
    reaches the agent after the frontend's enrichment, perhaps after the flush too."""
    from vllm import SamplingParams

    prompt = offline.PROMPTS[3]
    greedy = SamplingParams(max_tokens=offline.MAX_TOKENS, ignore_eos=True, temperature=0.0)
    (ref,) = llm.generate([prompt], greedy, use_tqdm=False)
    ids = ref.outputs[0].token_ids
    tokenizer = llm.get_tokenizer()
    head = len(tokenizer.decode(ids[:4]))
    stop = ref.outputs[0].text[head:head + 3]
    greedy = SamplingParams(max_tokens=offline.MAX_TOKENS, ignore_eos=True, temperature=0.0, stop=[stop])
    (out,) = llm.generate([prompt], greedy, use_tqdm=False)
    assert otel_llm.flush(60)
    spans = [s for s in sink.spans() if s.attributes.get("gen_ai.response.id") == out.request_id]
    return {"stop": stop, "out": out, "spans": spans, "stats": otel_llm.stats()["vllm"]}


@pytest.fixture(scope="module")
def full_run(agent_run):
    """The offline contract's fixture, as the agent exported it: outputs, spans, what the frontend held, and
    the time-to-first-token histogram's points (the engine-time sums are the offline module's own test)."""
    points = [p for p in agent_run.points if p.name == "gen_ai.server.time_to_first_token"]
    last = max(p.time_ns for p in points)  # cumulative: the last export holds every request
    return agent_run.outputs, agent_run.spans, agent_run.held, [p for p in points if p.time_ns == last], None


def test_an_agent_did_the_work_and_the_frontend_read_no_step(agent_run):
    s = agent_run.stats
    assert agent_run.agent_pid and s["agent_pid"] == agent_run.agent_pid != os.getpid()
    assert agent_run.receiver is None, "the agent binds the step socket, not the frontend"
    assert s["requests_finished"] == len(offline.PROMPTS) and s["requests_kept"] == len(offline.PROMPTS)
    assert s["steps_recorded"] > 0 and s["token_times_unplaced"] == 0, s
    assert s["agent_dropped"] == s["agent_lost"] == s["agent_unreachable"] == 0
    # the one path: the engine's records, each enriched once
    assert s["agent_engine_starts"] == s["agent_engine_finishes"] == s["agent_enriched"] == len(offline.PROMPTS)
    assert s["agent_enrichments_missing"] == s["agent_orphans"] == 0
    assert s["direct_spans_sent"] == len(agent_run.spans)
    assert agent_run.errors == {}
    assert agent_run.passed and agent_run.restored, "output batches straight to vLLM's, hooked again at uninstrument"


def test_the_engine_and_the_agent_ran_the_portable_channels(agent_run):
    """No ring anywhere, no C: the EngineCore's steps came as datagrams, the frontend's messages as packets,
    and the contract above held on them."""
    assert any(m.startswith("EngineCore") for m in agent_run.portable), agent_run.portable
    assert f"MainProcess-{agent_run.agent_pid}" in agent_run.portable, agent_run.portable
    assert agent_run.agent_ring is None  # the frontend's link sent packets


def test_the_agent_exports_under_the_frontends_resource(agent_run):
    spans = agent_run.sink_spans
    assert {s.resource.get("service.name") for s in spans} == {"agent-contract", "agent-contract-engine-steps"}
    assert {s.resource.get("process.pid") for s in spans} == {os.getpid()}, "the frontend's resource, not the agent's"


def test_every_request_metric_is_exported_once(agent_run):
    points = [p for p in agent_run.points if p.name == "gen_ai.server.request.duration"]
    last = max(p.time_ns for p in points)
    assert sum(p.count for p in points if p.time_ns == last) == len(offline.PROMPTS)
    gaps = [p for p in agent_run.points if p.name == "llm.server.inter_token.latency"]
    last = max(p.time_ns for p in gaps)
    assert sum(p.count for p in gaps if p.time_ns == last) == len(offline.PROMPTS) * (offline.MAX_TOKENS - 1)


def test_a_flush_right_after_a_stop_string_has_the_request_as_the_frontend_finished_it(agent_run):
    """The frontend found the stop string and aborted the request in the engine; the flush that followed at
    once exported its request span with the frontend's reason and token count, joined with the engine's
    records (nothing missing, nothing held)."""
    run = agent_run.stop
    out = run["out"].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) < offline.MAX_TOKENS, (run["stop"], out)
    (span,) = run["spans"]
    assert span.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert span.attributes["gen_ai.usage.output_tokens"] == len(out.token_ids)
    s = run["stats"]
    assert s["agent_enriched"] == s["agent_engine_finishes"] == len(offline.PROMPTS) + 2
    assert s["agent_enrichments_missing"] == s["agent_orphans"] == 0


# -- a later engine off the one path: the frontend's own start and finish records ---------------------------

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
LATER, LATER_TOKENS = 2, 16


@pytest.fixture(scope="module")
def later_run(agent_run):
    """A later engine in the same process, off the one path (n-gram speculative decoding: its token times are
    stamped in the frontend), whose requests the frontend hands the agent the first engine opened: each one's
    ``StartRecord`` and ``FinishRecord`` (agent/control.py), as packets (the portable channel)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm import SamplingParams

    from otel_llm.agent import link
    from support.engine import make_llm
    from support.traces import request_trees

    sink = agent_run.sink
    sink.clear()  # (the first engine's spans were read by the tests above)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint)
        mp.setattr(link, "USE_RING", False)
        mp.setenv("PYTHONPATH", os.pathsep.join([str(PORTABLE_SITE), os.environ.get("PYTHONPATH", "")]))
        resource = Resource.create({"service.name": "agent-contract", "process.pid": os.getpid()})
        tp = TracerProvider(resource=resource)
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        mp_ = MeterProvider(resource=resource, metric_readers=[
            PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=86_400_000)])
        otel_llm.instrument(tracer_provider=tp, meter_provider=mp_, sample_rate=1.0, baseline_detail="steps",
                            tail_quantile=0)
        try:
            llm = make_llm(speculative_config=SPEC)
            prompts = [{"prompt_token_ids": [20 + i] + [7, 8, 9, 10, 11, 12] * 8} for i in range(LATER)]
            outputs = llm.generate(prompts, SamplingParams(max_tokens=LATER_TOKENS, ignore_eos=True, temperature=0.0),
                                   use_tqdm=False)
            assert otel_llm.flush(60)
            stats = otel_llm.stats()
            trees = request_trees([s.readable() for s in sink.spans()])
            del llm
        finally:
            otel_llm.uninstrument()
            tp.shutdown()
            mp_.shutdown()
    return outputs, trees, stats["vllm"], stats["errors"]


def test_a_later_engines_requests_reach_the_agent_as_the_frontends_records(agent_run, later_run):
    outputs, trees, s, errors = later_run
    assert s["agent_pid"] == agent_run.agent_pid  # the agent the first engine opened
    assert s["requests_finished"] == LATER  # this instrumentation's: started and finished by the frontend
    # not the engine's records: its EngineCore is not on the one path; every record read, each start before
    # its finish
    assert s["agent_engine_starts"] == agent_run.stop["stats"]["agent_engine_starts"]
    assert s["agent_malformed"] == s["agent_orphans"] == 0
    assert s["agent_dropped"] == s["agent_lost"] == s["agent_oversized"] == 0
    assert errors == {}
    for o in outputs:
        t = trees[o.request_id]  # its start (the response id) and finish (the summary) joined
        assert t.attributes[sc.USAGE_OUTPUT_TOKENS] == LATER_TOKENS == len(o.outputs[0].token_ids)
        assert t.attributes[sc.SPEC_DRAFT_TOKENS] > 0  # the agent's steps joined to the request its start opened
        t.one(sc.SPAN_DECODE)
        # the stamped token times (several tokens a step where drafts were accepted) placed every token
        assert sum(row_tokens(r) for r in t.decode_rows()) == LATER_TOKENS - 1
