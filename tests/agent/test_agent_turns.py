"""The agent's turns with a Python frontend's finishes (agent/process.py): a finish waits for the step that
produced its request's last output.

Where the steps come as datagrams, the EngineCore's sink holds the records a full socket refused and sends
them with its next step, after that step's outputs reached the frontend: the frontend's finish can reach the
agent before its request's last step. Settled then, the request's token times would not add up (counted
``token_times_unplaced``) and it would lose its decode span. The steps here come as the real receiver hands
them over, one list per read; the frontend's messages are the real wire messages on a socket."""

from __future__ import annotations

import socket
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import semconv as sc
from otel_llm.agent import control, process, protocol
from otel_llm.agent.process import Agent
from otel_llm.core.config import Config
from otel_llm.core.finish_facts import EngineStats, FinishFacts
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.timeline import RequestShare, RequestTimeline, StepRecord

RID, PROMPT, OUTPUTS = "r-1", 8, 3


class ScriptedSteps:
    """Each read hands over the next list of the script (nothing once it is spent)."""

    def __init__(self, script: list[list]) -> None:
        self.script = script
        self.reads = 0

    def drain(self, deliver) -> None:
        self.reads += 1
        if self.script:
            for x in self.script.pop(0):
                deliver(x)

    def close(self) -> None:
        pass


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


def _steps(base: float) -> list[StepRecord]:
    """The request's prefill (one output) and two decode steps (one output each), 20 ms each."""
    out = []
    for i, (tokens, prefill) in enumerate([(PROMPT, True), (1, False), (1, False)]):
        step = StepRecord((5 << 32) | (i + 1), base + 0.02 * i, base + 0.02 * (i + 1),
                          [RequestShare(RID, tokens, prefill)], running=1)
        step.contexts = [0 if prefill else PROMPT + i - 1]
        out.append(step)
    return out


def _agent(script: list[list]) -> tuple[Agent, InMemorySpanExporter, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    agent = Agent(ours, lambda guard: ScriptedSteps(script))
    agent.open_receiver()
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"sample_rate": 1.0, "tail_quantile": 0, "baseline_detail": "steps"}, environ={})
    agent.pipeline = Pipeline(config, tp.get_tracer("t"), MeterProvider(metric_readers=[InMemoryMetricReader()])
                              .get_meter("t"), engine="vllm")
    return agent, exporter, theirs


def _start(wall: float) -> bytes:
    t = RequestTimeline(request_id=RID, arrival=wall, model="tiny", operation="text_completion", provider="vllm",
                        input_tokens=PROMPT, steps_give_tokens=True)
    return protocol.start_message(t)


def _facts(base: float, wall: float, steps: list[StepRecord]) -> bytes:
    first, last = steps[0].end, steps[-1].end
    stats = EngineStats(arrival=wall, queued=base, scheduled=base, first_token=first, last_token=last,
                        first_token_latency=first - base, generation_tokens=OUTPUTS, preemptions=0)
    return protocol.facts_message(FinishFacts(
        request_id=RID, reason="length", end=wall + (last - base), events=[], cache_sources=None, cached_tokens=0,
        output_characters=None, output_text=None, model="tiny", operation="text_completion", provider="vllm",
        input_tokens=PROMPT, arrival=wall, stats=stats))


def _decode_spans(exporter: InMemorySpanExporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_DECODE]


def _run(agent: Agent, peer: socket.socket, steps: list[StepRecord], base: float, wall: float) -> None:
    """The start, two reads holding the first two steps, then the finish (the last step still held by the
    engine's sink), and turns: the last step comes at the fourth read after the finish."""
    peer.send(_start(wall))
    agent.receive()
    agent.turn()  # reads steps 1-2
    peer.send(_facts(base, wall, steps))
    for _ in range(6):
        agent.receive()
        agent.turn()


def test_a_finish_waits_for_its_last_output_step_and_its_token_times_add_up():
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    steps = _steps(base)
    agent, exporter, peer = _agent([steps[:2], [], [], [], [steps[2]]])
    _run(agent, peer, steps, base, wall)
    assert not agent.behind and not agent.pipeline.requests  # settled, once its last step was added
    assert agent.pipeline.flush(10)
    assert agent.stats()["token_times_unplaced"] == 0
    (decode,) = _decode_spans(exporter)  # its token times placed: the decode phase ends at its last token
    assert decode.end_time == int((wall + (steps[-1].end - base)) * 1e9) or abs(
        decode.end_time - (wall + (steps[-1].end - base)) * 1e9) < 2e6


def test_a_finish_whose_step_never_comes_settles_after_a_bounded_wait():
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    steps = _steps(base)
    agent, exporter, peer = _agent([steps[:2]])  # the last step was dropped
    peer.send(_start(wall))
    agent.receive()
    agent.turn()
    peer.send(_facts(base, wall, steps))
    agent.receive()
    turns = 0
    while agent.pipeline.requests and turns < 2 * process.STEP_WAIT_TURNS:
        agent.turn()
        turns += 1
    assert process.STEP_WAIT_TURNS <= turns <= process.STEP_WAIT_TURNS + 3
    assert agent.pipeline.flush(10)
    assert agent.stats()["token_times_unplaced"] == 1  # counted, as a lost step is
    assert not _decode_spans(exporter)


@pytest.mark.parametrize("comes", [True, False], ids=["the step comes", "it never does"])
def test_a_flush_reads_the_steps_a_finish_waits_for_within_a_bound(comes: bool):
    """A flush settles everything; a finish whose last step is still held by the engine's sink first gets up to
    FLUSH_STEP_WAIT_S of reads for it (the flush's own read finds nothing; the sink sends it two polls later)."""
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    steps = _steps(base)
    agent, exporter, peer = _agent([steps[:2], [], [], [], [steps[2]]] if comes else [steps[:2]])
    fake = FakeTime()
    agent.clock, agent.sleep = fake.clock, fake.sleep
    peer.send(_start(wall))
    agent.receive()
    agent.turn()
    peer.send(_facts(base, wall, steps))
    agent.receive()
    agent.turn(final=True)
    assert not agent.pipeline.requests and not agent.behind
    if comes:
        assert 0 < fake.slept < process.FLUSH_STEP_WAIT_S
    else:  # the whole bound, and no longer
        assert abs(fake.slept - process.FLUSH_STEP_WAIT_S) < 1e-9
    assert agent.pipeline.flush(10)
    assert agent.stats()["token_times_unplaced"] == (0 if comes else 1)
    assert len(_decode_spans(exporter)) == (1 if comes else 0)


def test_a_control_message_through_the_ring_rings_the_agents_socket_and_the_bell_is_not_a_message():
    """Where the frontend's messages go through a ring, the agent waits on its socket between ticks: a control
    message (a flush, stats, options) rings it once, so it is answered at once, not at the next tick. The
    hot path's starts and finishes ring nothing. The agent skips the bell: nothing counted malformed."""
    from otel_llm import shm_ring
    from otel_llm.agent.link import AgentLink
    from otel_llm.guard import Guard

    if not shm_ring.AVAILABLE:
        pytest.skip("no rings on this platform")
    frontend_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    frontend_end.setblocking(False)
    agent_end.setblocking(False)
    ring = shm_ring.RingWriter(1 << 16, name="otel-llm-agent-test")
    link = AgentLink(Guard(), "unused")
    link.sock, link.ring = frontend_end, ring
    link.alive = lambda: True  # (no agent process behind this link)
    link._put(frontend_end, ring, control.encode(control.StatsRecord(1)), time.monotonic() + 1)
    assert ring.written == 1 and agent_end.recv(16) == protocol.DOORBELL
    link.send(_start(time.time()))  # a start: into the ring, no bell
    assert ring.written == 2
    try:
        agent_end.recv(16)
        rang = True
    except BlockingIOError:
        rang = False
    assert not rang
    agent, _exporter, peer = _agent([])
    peer.send(protocol.DOORBELL)
    assert agent.receive() == 0 and agent.malformed == 0
    for s in (frontend_end, agent_end):
        s.close()
