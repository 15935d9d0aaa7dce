"""The agent's join of an engine's own request records with its steps (agent/engine_requests.py, the
EngineCore as its requests' source: vLLM's Rust frontend, headless engines).

The records come as the EngineCore sends them and the agent reads them: a start before any step that serves
its request, a finish read one read *before* its request's last step (it is sent inside
``update_from_output``, the step's record after). The request spans, their phases and linked steps, and the
metrics must come out as for a Python frontend; a start lost must still leave the request counted."""

from __future__ import annotations

import socket
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from otel_llm import semconv as sc
from otel_llm.agent.engine_requests import stamps_from_steps
from otel_llm.agent.process import Agent
from otel_llm.agent.records import RequestFinish, RequestStart, SinkCounts, decode, encode
from otel_llm.core.config import Config
from otel_llm.core.metrics import SERVER_HISTOGRAMS, TOKEN_USAGE
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.timeline import RequestShare, StepRecord

PROMPTS = {"cmpl-a-0-11111111": 40, "cmpl-b-0-22222222": 8}
OUTPUTS = 7  # each: one at its prefill's last chunk, six decoding
TRACE = "0af7651916cd43dd8448eb211c80319c"


class ScriptedSteps:
    """A step receiver whose drains hand over a script, one list per drain (records go through the wire
    form, as the real receiver decodes them)."""

    def __init__(self, script: list[list]) -> None:
        self.script = script
        self.take_requests = True

    def drain(self, deliver) -> None:
        if self.script:
            for x in self.script.pop(0):
                deliver(decode(encode(x)) if isinstance(x, (RequestStart, RequestFinish, SinkCounts)) else x)

    def close(self) -> None:
        pass


def _script(base: float, wall: float, drop_starts: bool = False) -> list[list]:
    starts = [RequestStart(request_id=rid, arrival=wall - 0.005, queued=base, prompt_tokens=prompt,
                           external_id=rid.rsplit("-", 1)[0], model="tiny",
                           trace_headers={"traceparent": f"00-{TRACE}-b7ad6b7169203331-01"} if i == 0 else None,
                           sampling={"gen_ai.request.max_tokens": OUTPUTS})
              for i, (rid, prompt) in enumerate(PROMPTS.items())]
    a, b = PROMPTS
    plan = [[(a, 32, True, 0), (b, 8, True, 0)], [(a, 8, True, 32), (b, 1, False, 8)]]
    plan += [[(a, 1, False, 40 + k), (b, 1, False, 9 + k)] for k in range(6)]
    plan[-1] = [(a, 1, False, 45)]  # b finished a step earlier
    steps = []
    clock = base + 0.01
    for i, shares in enumerate(plan):
        step = StepRecord((77 << 32) | (i + 1), clock, clock + 0.02, [RequestShare(*s[:3]) for s in shares],
                          running=len(shares))
        step.contexts = [s[3] for s in shares]
        clock = step.end
        steps.append(step)
    finishes = [RequestFinish(request_id=rid, reason="length", arrival=wall - 0.005, queued=base,
                              end=steps[-1 if rid == a else -2].end + 0.001,
                              end_wall=wall + (steps[-1 if rid == a else -2].end + 0.001 - base),
                              prompt_tokens=prompt, output_tokens=OUTPUTS, external_id=rid.rsplit("-", 1)[0],
                              model="tiny")
                for rid, prompt in PROMPTS.items()]
    return [[] if drop_starts else starts, steps[:-1] + finishes, [steps[-1]], [], []]


def _agent(script: list[list]) -> tuple[Agent, InMemorySpanExporter, InMemoryMetricReader, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    agent = Agent(ours, lambda guard: ScriptedSteps(script))
    agent.open_receiver()
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"sample_rate": 1.0, "tail_quantile": 0, "baseline_detail": "steps"}, environ={})
    agent.pipeline = Pipeline(config, tp.get_tracer("t"), MeterProvider(metric_readers=[reader]).get_meter("t"),
                              engine="vllm")
    return agent, exporter, reader, theirs


def _metric(field: str) -> str:
    return next(h.name for h in SERVER_HISTOGRAMS if h.field == field)


def _histogram(reader: InMemoryMetricReader, name: str) -> tuple[int, float]:
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    points = list(m.data.data_points)
                    return sum(p.count for p in points), sum(p.sum for p in points)
    return 0, 0.0


def test_request_spans_phases_steps_and_metrics_from_the_engines_records():
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    agent, exporter, reader, _peer = _agent(_script(base, wall))
    for _ in range(5):
        agent.turn()
    p = agent.pipeline
    assert p.flush(10)
    assert not p.requests  # both settled, by the turns alone (no final read)
    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    assert sorted(s.attributes["gen_ai.response.id"] for s in servers) == ["cmpl-a-0", "cmpl-b-0"]
    by_response = {s.attributes["gen_ai.response.id"]: s for s in servers}
    a = by_response["cmpl-a-0"]
    assert format(a.context.trace_id, "032x") == TRACE  # the forwarded traceparent is its parent
    assert by_response["cmpl-b-0"].parent is None
    children = sorted(s.name for s in spans if s.parent is not None and s.parent.span_id == a.context.span_id)
    assert children == sorted([sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE])
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP
             and any(link.context.span_id == a.context.span_id for link in s.links)]
    assert steps, "engine-step spans linked to the request"
    # TTFT: the end of a's second prefill chunk (the step that completed its prompt), from its arrival
    ttft_count, ttft_sum = _histogram(reader, _metric("ttft"))
    e2e_count, _ = _histogram(reader, _metric("e2e"))
    assert (ttft_count, e2e_count) == (2, 2)
    a_first = base + 0.01 + 0.04  # two steps of 20 ms after scheduling
    b_first = base + 0.01 + 0.02
    expected = (a_first - base + 0.005) + (b_first - base + 0.005)
    assert ttft_sum == pytest.approx(expected, abs=1e-6)
    stats = agent.stats()
    assert (stats["agent_engine_starts"], stats["agent_engine_finishes"], stats["agent_orphans"]) == (2, 2, 0)


def test_a_lost_start_still_counts_the_request():
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    agent, exporter, reader, _peer = _agent(_script(base, wall, drop_starts=True))
    for _ in range(5):
        agent.turn()
    assert agent.pipeline.flush(10)
    e2e_count, e2e_sum = _histogram(reader, _metric("e2e"))
    assert e2e_count == 2  # 100 % of requests, without their starts
    assert e2e_sum > 0
    tokens = _histogram(reader, TOKEN_USAGE)[0]
    assert tokens >= 2
    assert agent.stats()["agent_orphans"] == 2
    assert not [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]  # metrics only


def test_the_engines_sink_counts_reach_stats_and_the_lost_counter():
    """Each engine process's latest (cumulative) counts, summed over the engines: a later record replaces its
    engine's earlier one, never adds to it; the orphans beside them, as the ``otel_llm.agent.lost`` counter."""
    from otel_llm.core.self_metrics import AGENT_LOST, register_agent

    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    script = _script(base, wall, drop_starts=True)
    script[1] += [SinkCounts(pid=11, steps_dropped=1, requests_dropped=1)]
    script[2] += [SinkCounts(pid=11, steps_dropped=3, requests_dropped=2), SinkCounts(pid=12, steps_dropped=4)]
    agent, _exporter, _reader, _peer = _agent(script)
    reader = InMemoryMetricReader()
    register_agent(MeterProvider(metric_readers=[reader]).get_meter("agent"), "vllm", agent.lost)
    for _ in range(5):
        agent.turn()
    assert agent.pipeline.flush(10)
    stats = agent.stats()
    assert (stats["engine_steps_dropped"], stats["engine_requests_dropped"], stats["agent_orphans"]) == (7, 2, 2)
    data = reader.get_metrics_data()
    lost = {p.attributes["otel_llm.state"]: p.value for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics if m.name == AGENT_LOST.name for p in m.data.data_points}
    assert lost == {"engine_steps_dropped": 7, "engine_requests_dropped": 2, "orphans": 2}


def test_stamps_place_outputs_as_the_step_tokens_rule_does():
    base = 100.0
    script = _script(base, 1000.0)
    steps = [x for batch in script for x in batch if isinstance(x, StepRecord)]
    a = next(iter(PROMPTS))
    own = [s for s in steps if a in s.ids]
    got = stamps_from_steps(a, own, PROMPTS[a], OUTPUTS)
    assert got.scheduled == own[0].start
    assert got.first_token == own[1].end  # the chunk that completes the prompt
    assert got.last_token == own[-1].end and got.tokens == OUTPUTS
    assert got.cached == 0
    assert stamps_from_steps(a, own, PROMPTS[a], 3).last_token == own[3].end  # the engine's count bounds it
    assert stamps_from_steps(a, [], 40, 3).tokens == 0
