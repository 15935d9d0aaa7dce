"""A real agent process (``python -m otel_llm.agent``) behind a frontend ``AgentPipeline``, no engine.

The frontend hands each request's start and finish over an ``AgentLink``; the agent exports to an
``OTLPSink`` through providers it rebuilds from the ``OTEL_*`` variables it inherits. What it sends is
compared with an in-process pipeline fed the same requests. Then the agent's failure modes: killed,
stopped (a full socket), an oversized message, its parent's death, garbage on the socket; each one
leaves the host's calls unharmed and is counted in ``stats()``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest
from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import semconv as sc
from otel_llm import shm_ring
from otel_llm.agent import destinations, link, protocol
from otel_llm.agent.link import AgentLink
from otel_llm.instrumentation.vllm import AGENT_MODULE
from otel_llm.core.config import Config
from otel_llm.core.diagnosis.anatomy import EngineFacts
from otel_llm.core.finish_facts import EngineStats, FinishFacts
from otel_llm.core.agent_pipeline import AgentPipeline
from otel_llm.core.pipeline import Pipeline, RequestPipeline
from otel_llm.core.providers import _sdk_meter_provider, _sdk_tracer_provider
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestTimeline
from otel_llm.guard import Guard
from support.otlp_sink import OTLPSink

OPTIONS = {"sample_rate": 1.0, "engine_steps": False}
DURATION = "gen_ai.server.request.duration"
WAIT_S = 30.0  # generous: exports and process exits on a loaded machine (a wait, not an assertion)


def request(rid: str, tokens: int = 8, output_text: str | None = None) -> tuple[RequestTimeline, RequestSummary]:
    """A finished request as the vLLM adapter hands it over: stamped token times (not from steps)."""
    base = time.monotonic() - 2.0
    t = RequestTimeline(rid, time.time() - 2.0 - 0.002, model="m", response_id=rid, input_tokens=100)
    t.events += [(QUEUED, base), (SCHEDULED, base + 0.01)]
    first = base + 0.06
    t.token_ts = [first + 0.01 * i for i in range(tokens)]
    t.finish_reason, t.output_text = "length", output_text
    decode = t.token_ts[-1] - first
    s = RequestSummary(model="m", ttft=0.062, e2e=0.062 + decode, queue=0.01, prefill=0.05, decode=decode,
                       tpot=RequestSummary.mean_tpot(decode, tokens), input_tokens=100, output_tokens=tokens,
                       output_characters=4 * tokens, finish_reason="length")
    return t, s


def feed(pipeline: RequestPipeline, rid: str, **kw) -> None:
    t, s = request(rid, **kw)
    pipeline.start(t)
    pipeline.finish(rid, s)


def feed_facts(pipeline: RequestPipeline, rid: str, output_text: str | None = None) -> None:
    """A request as the vLLM adapter hands it over with an agent: its start, then the engine's own numbers."""
    t, _ = request(rid)
    t.steps_give_tokens = True
    pipeline.start(t)
    base = t.events[0][1]
    stats = EngineStats(t.arrival + 0.002, base, base + 0.01, t.token_ts[0], t.token_ts[-1], 0.062,
                        len(t.token_ts), 0)
    t.token_ts = []  # (its token times come from the engine's steps: none here)
    pipeline.finish_facts(FinishFacts(rid, "length", t.arrival + 1.0, list(t.events), None, 16,
                                      len(output_text or ""), output_text, t.model, t.operation, t.provider,
                                      t.input_tokens, t.arrival, stats))


def request_spans(spans: list, rid: str) -> list:
    return [s for s in spans if s.attributes.get(sc.RESPONSE_ID) == rid and not s.parent_span_id]


def duration_count(sink: OTLPSink) -> int:
    """The request-duration histogram's count, as the agent's latest export has it (cumulative)."""
    points = sink.metric_points(DURATION)
    if not points:
        return 0
    last = points[-1].time_ns
    return sum(p.count for p in points if p.time_ns == last)


def exited(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (the agent of an exited parent is reparented)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_until(predicate, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture
def sink() -> Iterator[OTLPSink]:
    with OTLPSink() as s:
        yield s


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch, sink: OTLPSink) -> None:
    """What the agent inherits (set before it starts): OTLP/HTTP to the sink, metrics only on flush."""
    for var in [v for v in os.environ if v.startswith(("OTEL_", "OTEL_LLM_"))]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agent-test")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")


@pytest.fixture
def setup(otel_env: None) -> protocol.AgentConfig:
    """The options, and the providers otel-llm builds from ``OTEL_*`` as the agent is to rebuild them."""
    tp, mp = _sdk_tracer_provider(), _sdk_meter_provider()
    try:
        verdict = destinations.Verdict()
        dest = destinations.describe(tp, mp, verdict)
        assert dest is not None, verdict.reason
    finally:
        tp.shutdown()
        mp.shutdown()
    assert dest.resource[sc.SERVICE_NAME] == "agent-test"
    return protocol.AgentConfig(Config.resolve(OPTIONS, environ={}), dest)


def test_an_agent_stands_in_only_for_providers_as_otel_variables_build_them(otel_env: None, sink: OTLPSink) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    def verdict_of(tp: TracerProvider, mp: MeterProvider) -> str | None:
        v = destinations.Verdict()
        found = destinations.describe(tp, mp, v)
        return None if found is not None else v.reason

    built = [_sdk_tracer_provider(), _sdk_meter_provider()]
    memory = TracerProvider()
    memory.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    elsewhere = TracerProvider()  # an endpoint given in code: the agent, building from OTEL_*, could not know it
    elsewhere.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")))
    try:
        assert verdict_of(*built) is None
        assert verdict_of(TracerProvider(), built[1]) == "no span processor"
        assert "InMemory" in verdict_of(memory, built[1]) or "SimpleSpanProcessor" in verdict_of(memory, built[1])
        assert "OTEL_*" in verdict_of(elsewhere, built[1])
        assert verdict_of(built[0], MeterProvider(metric_readers=[InMemoryMetricReader()])) is not None
    finally:
        for p in (*built, memory, elsewhere):
            p.shutdown()


class Frontend:
    """A frontend pipeline whose work an agent does (its own providers record nothing)."""

    def __init__(self, setup: protocol.AgentConfig) -> None:
        self.link = AgentLink(Guard(), AGENT_MODULE)
        assert self.link.start()
        self.link.configure(setup)
        self.pipeline = AgentPipeline(setup.config, self.link, Guard(), meter=NoOpMeter("frontend"))

    def close(self) -> None:
        self.link.close()
        self.pipeline.close(1.0)


CHANNELS = ["ring", "socket"] if shm_ring.AVAILABLE else ["socket"]


@pytest.fixture(params=CHANNELS)
def frontend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
             setup: protocol.AgentConfig) -> Iterator[Frontend]:
    """Over each channel the link has: the shared-memory ring (x86-64 Linux), and the socket elsewhere."""
    monkeypatch.setattr(link, "USE_RING", request.param == "ring")
    f = Frontend(setup)
    assert (f.link.ring is not None) == (request.param == "ring")
    yield f
    f.close()


# -- the agent does what the frontend would --------------------------------------------------------


def agent_and_local_spans(frontend: Frontend, sink: OTLPSink, feeder, ids: list[str]) -> tuple[list, list]:
    """``feeder(pipeline, rid)`` for each id into the agent's frontend and into an in-process pipeline:
    what the sink got from the agent, and what the in-process pipeline exported."""
    for rid in ids:
        feeder(frontend.pipeline, rid)
    assert frontend.pipeline.flush(WAIT_S)
    spans = sink.wait_for(lambda s: len({x.attributes.get(sc.RESPONSE_ID) for x in s if not x.parent_span_id})
                          >= len(ids))
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    local = Pipeline(Config.resolve(OPTIONS, environ={}), tp.get_tracer("t"),
                     MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t"), engine="vllm")
    for rid in ids:
        feeder(local, rid)
    assert local.flush(WAIT_S)
    expected = list(exporter.get_finished_spans())
    local.close()
    assert sorted(s.name for s in spans) == sorted(s.name for s in expected)
    return spans, expected


def test_agent_exports_what_the_frontend_would(frontend: Frontend, sink: OTLPSink) -> None:
    ids = [f"r{i}" for i in range(5)]
    spans, expected = agent_and_local_spans(frontend, sink, feed, ids)
    for rid in ids:
        (got,) = request_spans(spans, rid)
        (want,) = [s for s in expected if s.attributes.get(sc.RESPONSE_ID) == rid and s.parent is None]
        assert got.name == want.name
        assert got.attributes == dict(want.attributes)
        assert got.service == "agent-test"

    assert duration_count(sink) == len(ids)
    stats = frontend.pipeline.stats()
    assert stats["requests_finished"] == len(ids) and stats["requests_kept"] == len(ids)
    assert stats["agent_pid"] == frontend.link.pid != 0
    assert stats["agent_unreachable"] == 0
    assert stats["agent_dropped"] == stats["agent_lost"] == stats["agent_oversized"] == 0
    assert stats["agent_gc_frozen"] > 0  # its collector tuned at its start (agent/process.tune_gc)
    if frontend.link.ring is not None:  # every message went through the ring: its options, two a request,
        assert frontend.link.ring.written == 1 + 2 * len(ids) + 2  # the flush and the stats asked for


def test_a_finish_as_the_engines_numbers_exports_what_the_frontend_would(frontend: Frontend, sink: OTLPSink) -> None:
    """The agent makes the summary from the facts as an in-process pipeline does: the same spans."""
    ids = [f"f{i}" for i in range(3)]
    spans, expected = agent_and_local_spans(frontend, sink, lambda p, rid: feed_facts(p, rid, output_text="abcd"), ids)
    for rid in ids:
        (got,) = request_spans(spans, rid)
        (want,) = [s for s in expected if s.attributes.get(sc.RESPONSE_ID) == rid and s.parent is None]
        assert got.attributes == dict(want.attributes)
        assert got.attributes[sc.USAGE_OUTPUT_TOKENS] == 8
    assert duration_count(sink) == len(ids)
    stats = frontend.pipeline.stats()
    assert stats["requests_finished"] == len(ids) and stats["agent_orphans"] == 0


def test_closing_the_link_delivers_what_was_sent_before(frontend: Frontend, sink: OTLPSink) -> None:
    """No flush: the agent reads what came before its frontend's end closed (a ring's records too), then exits."""
    ids = [f"c{i}" for i in range(3)]
    for rid in ids:
        feed(frontend.pipeline, rid)
    pid = frontend.link.pid
    frontend.link.close()
    assert exited(pid)
    spans = sink.wait_for(lambda s: all(request_spans(s, rid) for rid in ids))
    assert all(len(request_spans(spans, rid)) == 1 for rid in ids)


# -- failure modes: the host unaffected, the loss counted ------------------------------------------


def kill(f: Frontend) -> int:
    assert f.pipeline.flush(WAIT_S)  # the agent has read everything so far: what is lost is what comes next
    pid = f.link.pid
    os.kill(pid, signal.SIGKILL)
    f.link.proc.wait(WAIT_S)
    return pid


def test_killed_agent_costs_counted_messages(frontend: Frontend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link, "RESTART_S", 1e9)  # no restart in this test
    kill(frontend)
    feed(frontend.pipeline, "after")  # a start and a finish: neither raises
    assert frontend.pipeline.flush(1.0) is False
    stats = frontend.pipeline.stats()
    assert stats["agent_unreachable"] == 1
    assert stats["agent_lost"] >= 2 and stats["agent_restarts"] == 0
    assert stats["agent_pid"] == 0
    assert stats["requests_started"] == stats["requests_finished"] == 1


def test_killed_agent_is_restarted(frontend: Frontend, sink: OTLPSink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link, "RESTART_S", 0.0)
    monkeypatch.setattr(link, "CHECK_S", 0.0)  # a ring's write asks whether the agent lives every time
    old = kill(frontend)
    t, s = request("lost")
    frontend.pipeline.start(t)  # finds the agent gone: lost, and a new agent starting, on a thread of its own
    assert frontend.link.counts()["agent_lost"] == 1
    deadline = time.monotonic() + WAIT_S  # (a bound for a hang, not a speed)
    while not (frontend.link.alive() and frontend.link.sock is not None) and time.monotonic() < deadline:
        time.sleep(0.05)
    counts = frontend.link.counts()
    assert counts["agent_restarts"] == 1 and counts["agent_lost"] == 1
    assert counts["agent_pid"] not in (0, old)
    frontend.pipeline.finish("lost", s)  # reaches the new agent, which never saw its start
    feed(frontend.pipeline, "later")
    assert frontend.pipeline.flush(WAIT_S)
    spans = sink.wait_for(lambda s: request_spans(s, "later"))
    assert len(request_spans(spans, "later")) == 1
    stats = frontend.pipeline.stats()
    assert stats["agent_unreachable"] == 0 and stats["agent_restarts"] == 1
    assert stats["agent_orphans"] == 1  # "lost"'s finish reached the new agent without its start


def test_a_watched_agent_is_restarted_with_nothing_sent(frontend: Frontend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor of engines that are their requests' source sends its agent nothing per request: the
    watch thread notices a killed agent and starts another (it then binds the step socket again)."""
    monkeypatch.setattr(link, "RESTART_S", 0.0)
    frontend.link.watch(0.05)
    old = kill(frontend)
    assert wait_until(lambda: frontend.link.alive() and frontend.link.pid not in (0, old))
    counts = frontend.link.counts()
    assert counts["agent_restarts"] == 1 and counts["agent_lost"] == 1
    frontend.link.close()
    assert wait_until(lambda: frontend.link._watching.is_set())
    time.sleep(0.2)
    assert frontend.link.counts()["agent_restarts"] == 1  # closed: not started again


def test_stopped_agent_fills_the_socket_and_drops(frontend: Frontend, sink: OTLPSink) -> None:
    pid = frontend.link.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(20_000):
            feed(frontend.pipeline, f"s{i}", tokens=64)  # none raises, none blocks: the test finishing shows it
        assert frontend.link.counts()["agent_dropped"] > 0
        assert frontend.pipeline.flush(timeout=0.5) is False
    finally:
        os.kill(pid, signal.SIGCONT)
    assert frontend.pipeline.flush(WAIT_S) is True
    stats = frontend.pipeline.stats()
    assert stats["agent_dropped"] > 0 and stats["agent_lost"] == 0
    assert stats["requests_finished"] == 20_000
    # every finish the agent got was settled (metrics), with or without its start
    assert 0 < duration_count(sink) < 20_000


def test_oversized_finish_is_resent_without_content(frontend: Frontend, sink: OTLPSink) -> None:
    feed(frontend.pipeline, "big", output_text="x" * (2 << 20))
    assert frontend.pipeline.flush(WAIT_S)
    assert frontend.link.counts()["agent_oversized"] == 1
    assert duration_count(sink) == 1
    (span,) = request_spans(sink.wait_for(lambda s: request_spans(s, "big")), "big")
    assert frontend.pipeline.stats()["requests_kept"] == 1


def test_oversized_facts_are_resent_without_content(frontend: Frontend, sink: OTLPSink) -> None:
    feed_facts(frontend.pipeline, "big-facts", output_text="x" * (2 << 20))
    assert frontend.pipeline.flush(WAIT_S)
    assert frontend.link.counts()["agent_oversized"] == 1
    (span,) = request_spans(sink.wait_for(lambda s: request_spans(s, "big-facts")), "big-facts")
    assert frontend.pipeline.stats()["requests_kept"] == 1


def test_oversized_start_is_resent_without_the_prompt(frontend: Frontend, sink: OTLPSink) -> None:
    t, s = request("long-prompt")
    t.prompt_text = "y" * (2 << 20)  # a captured prompt longer than a packet
    frontend.pipeline.start(t)
    frontend.pipeline.finish("long-prompt", s)
    assert frontend.pipeline.flush(WAIT_S)
    assert frontend.link.counts()["agent_oversized"] == 1
    # its start reached the agent (without the prompt): a tracked request, kept with its spans, not an orphan
    (span,) = request_spans(sink.wait_for(lambda x: request_spans(x, "long-prompt")), "long-prompt")
    stats = frontend.pipeline.stats()
    assert stats["agent_orphans"] == 0 and stats["requests_kept"] == 1


@pytest.mark.parametrize("channel, buffer, cap, text", [
    # a host whose net.core.wmem_max caps the send buffer below MAX_PACKET (Linux's default does): a finish
    # between the two is too long for the kernel
    pytest.param("socket", 64 << 10, None, 400 << 10, id="over-the-socket-buffer"),
    # a message takes at most a quarter of the ring: one long message never leaves no room for the rest
    pytest.param("ring", 256 << 10, 64 << 10, 100 << 10, id="over-a-quarter-of-the-ring",
                 marks=pytest.mark.skipif(not shm_ring.AVAILABLE, reason="no shared-memory ring here")),
])
def test_finish_longer_than_the_channel_takes_is_resent_without_content(
        monkeypatch: pytest.MonkeyPatch, setup: protocol.AgentConfig, sink: OTLPSink,
        channel: str, buffer: int, cap: int | None, text: int) -> None:
    """Under MAX_PACKET, over what this channel takes: it must still count as a request."""
    monkeypatch.setattr(link, "USE_RING", channel == "ring")
    monkeypatch.setattr(link, "SEND_BUFFER", buffer)
    f = Frontend(setup)
    try:
        if cap is not None:
            assert f.link.max_packet == cap
        feed(f.pipeline, "long", output_text="x" * text)
        assert f.pipeline.flush(WAIT_S)
        assert f.link.counts()["agent_oversized"] == 1
        assert duration_count(sink) == 1
    finally:
        f.close()


def test_malformed_messages_are_counted_and_the_agent_serves_on(frontend: Frontend, sink: OTLPSink) -> None:
    import marshal

    frontend.link.send(b"xx")  # not marshal data
    frontend.link.send(marshal.dumps([1, 2]))  # not a message
    frontend.link.send(marshal.dumps((99, 1)))  # an unknown kind
    # an earlier release's positional START and FLUSH: refused (no request started, no flush answered)
    frontend.link.send(marshal.dumps((1, "positional", time.time(), "m", "text_completion", None, 0, None, None,
                                      {}, 100, None, None, False, None, None, None)))
    frontend.link.send(marshal.dumps((5, 1, 1.0)))
    feed(frontend.pipeline, "after-garbage")
    assert frontend.pipeline.flush(WAIT_S)
    stats = frontend.pipeline.stats()
    assert stats["agent_malformed"] == 5 and stats["requests_kept"] == 1
    assert stats["agent_unreachable"] == 0 and stats["requests_kept"] == 1
    assert request_spans(sink.wait_for(lambda s: request_spans(s, "after-garbage")), "after-garbage")


PARENT = r"""
from otel_llm.agent.link import AgentLink
from otel_llm.instrumentation.vllm import AGENT_MODULE
from otel_llm.guard import Guard
link = AgentLink(Guard(), AGENT_MODULE)
assert link.start()
print(link.pid, flush=True)
"""  # and exits without closing the link


def test_agent_exits_with_its_parent(otel_env: None) -> None:
    out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    assert pid > 0
    assert wait_until(lambda: exited(pid))


def test_an_engine_is_set_up_in_the_agent_not_the_frontend(frontend: Frontend) -> None:
    """An engine built (or, instrumenting again, one built earlier) under an agent: its diagnosis (the roofline, an
    NVIDIA GPU's sampler, the LoRA slots) is the agent's; the frontend sets up none of it, and the facts the link
    keeps for a restarted agent are kept once."""
    facts = EngineFacts(None, on_cuda=True, devices=2, max_loras=4, kv_cache={"llm.kv_cache.dtype": "fp8"})
    frontend.pipeline.engine_built(facts)
    frontend.pipeline.engine_built(facts)
    # the frontend's half holds no diagnosis, no step window, no sampler: nothing to set up
    assert not hasattr(frontend.pipeline, "diagnosis") and not hasattr(frontend.pipeline, "window")
    assert frontend.link._engines == [facts]  # kept once, re-sent to a restarted agent
    assert frontend.pipeline.flush(WAIT_S)  # the agent took it and serves on
    assert frontend.link.agent_errors() == {}
