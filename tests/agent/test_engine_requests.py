"""The agent's join of an engine's own request records with its steps (agent/engine_requests.py, the
EngineCore as its requests' source: vLLM's Rust frontend, headless engines).

The records come as the EngineCore sends them and the agent reads them: a start before any step that serves
its request, a finish read one read *before* its request's last step (it is sent inside
``update_from_output``, the step's record after). The request spans, their phases and linked steps, and the
metrics must come out as for a Python frontend; a start lost must still leave the request counted."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

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
from otel_llm.agent.records import RequestEnrichment, RequestFinish, RequestStart, SinkCounts, decode, encode
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


# -- a Python frontend's enrichment (agent/records.RequestEnrichment): one path for every frontend ------------

PARENT = "4bf92f3577b34da6a3ce929d0e0e4736"


def _enriched(script: list[list]) -> list[list]:
    """The same records as a Python frontend's engine sends them: each says an enrichment will come."""
    return [[replace(x, enriched=True) if isinstance(x, (RequestStart, RequestFinish)) else x for x in batch]
            for batch in script]


def _enrichment(rid: str, wall: float, **kw) -> RequestEnrichment:
    arrival = wall - 0.005
    values = dict(operation="chat", server=True, parent={"traceparent": f"00-{PARENT}-00f067aa0ba902b7-01"},
                  response_id="chatcmpl-" + rid, model="tiny", attributes={sc.REQUEST_MODEL: "my-alias"},
                  reason="length", output_tokens=OUTPUTS, output_characters=21, first_output=arrival + 0.25,
                  last_output=arrival + 0.5, end=arrival + 0.5)
    values.update(kw)
    return RequestEnrichment(rid, **values)


def _server_spans(exporter: InMemorySpanExporter) -> dict[str, object]:
    return {s.attributes["gen_ai.response.id"]: s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER}


def test_an_enrichment_joins_the_engines_records_and_nothing_is_counted_twice():
    """The engine's finish is read first and waits; the frontend's record (as it arrives on the link, wire
    form) joins it: the request span takes the frontend's operation, parent, model asked for and reason,
    its TTFT and e2e end where the frontend received the outputs (vLLM's own statistics), its phases and
    steps stay the engine's. Each request is counted once, in every metric."""
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    agent, exporter, reader, _peer = _agent(_enriched(_script(base, wall)))
    for _ in range(4):
        agent.turn()
    assert len(agent.engine_requests.enrichments.held) == 2  # the engine's finishes, waiting
    assert agent.pipeline.counts.requests_finished == 0
    for rid in PROMPTS:
        agent.take(encode(_enrichment(rid, wall)))
    agent.turn()
    p = agent.pipeline
    assert p.flush(10) and not p.requests
    servers = _server_spans(exporter)
    assert sorted(servers) == sorted("chatcmpl-" + rid for rid in PROMPTS)
    a = servers["chatcmpl-" + next(iter(PROMPTS))]
    assert format(a.context.trace_id, "032x") == PARENT  # the frontend's parent, not the engine's headers
    assert a.attributes[sc.OPERATION_NAME] == "chat" and a.attributes[sc.REQUEST_MODEL] == "my-alias"
    assert a.attributes[sc.RESPONSE_FINISH_REASONS] == ("length",)
    children = sorted(s.name for s in exporter.get_finished_spans()
                      if s.parent is not None and s.parent.span_id == a.context.span_id)
    assert children == sorted([sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE])
    ttft = _histogram(reader, _metric("ttft"))
    e2e = _histogram(reader, _metric("e2e"))
    assert ttft == (2, pytest.approx(0.5, abs=1e-6)) and e2e == (2, pytest.approx(1.0, abs=1e-6))
    assert p.counts.requests_finished == 2 and p.counts.requests_started == 2
    stats = agent.stats()
    assert (stats["agent_enriched"], stats["agent_enrichments_missing"], stats["agent_orphans"]) == (2, 0, 0)
    for _ in range(3):  # nothing is left to count again
        agent.turn()
    assert p.flush(10) and _histogram(reader, _metric("e2e"))[0] == 2


def test_each_api_servers_agent_keeps_only_its_own_requests(monkeypatch):
    """Several Python API servers share the engines, and each one's agent reads every engine record: the
    agent of API server 1 (``link.CLIENT_ENV``) settles the requests whose records carry its ``client_index``,
    skips (and counts) the other's, and never waits for an enrichment the other API server sends its own
    agent. Records of no Python frontend (not enriched: the Rust frontend, headless) are every agent's."""
    from otel_llm.agent.link import CLIENT_ENV

    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    mine, other = PROMPTS
    script = [[replace(x, enriched=True, client_index=1 if x.request_id == mine else 0)
               if isinstance(x, (RequestStart, RequestFinish)) else x for x in batch]
              for batch in _script(base, wall)]
    monkeypatch.setenv(CLIENT_ENV, "1")
    agent, exporter, reader, _peer = _agent(script)
    for _ in range(4):
        agent.turn()
    assert list(agent.engine_requests.enrichments.held) == [mine]  # not the other's
    agent.take(encode(_enrichment(mine, wall)))
    agent.turn()
    p = agent.pipeline
    assert p.flush(10) and not p.requests
    assert sorted(_server_spans(exporter)) == ["chatcmpl-" + mine]
    assert _histogram(reader, _metric("e2e"))[0] == 1
    stats = agent.stats()
    assert (stats["agent_engine_starts"], stats["agent_engine_finishes"], stats["agent_engine_others"]) == (1, 1, 2)
    assert (stats["agent_enriched"], stats["agent_enrichments_missing"], stats["agent_orphans"]) == (1, 0, 0)

    monkeypatch.setenv(CLIENT_ENV, "1")  # the engine's own requests (no Python frontend): whatever the index
    agent, exporter, reader, _peer = _agent(_script(base, wall))
    for _ in range(5):
        agent.turn()
    assert agent.pipeline.flush(10) and len(_server_spans(exporter)) == 2 and agent.others == 0


def test_a_stop_string_the_frontend_found_wins_over_the_engines_abort():
    """The frontend finishes the request (a stop string), then aborts it in the engine: its record comes
    first, the engine's abort later, with tokens the frontend never took. The reason and the count are the
    frontend's."""
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    script = _enriched(_script(base, wall))
    script[1] = [replace(x, reason="abort", output_tokens=OUTPUTS) if isinstance(x, RequestFinish) else x
                 for x in script[1]]
    agent, exporter, reader, _peer = _agent(script)
    agent.turn()  # the starts
    for rid in PROMPTS:
        agent.take(encode(_enrichment(rid, wall, reason="stop", output_tokens=5)))
    for _ in range(4):
        agent.turn()
    p = agent.pipeline
    assert p.flush(10) and not p.requests and not agent.engine_requests.enrichments.held
    servers = _server_spans(exporter)
    assert {s.attributes[sc.RESPONSE_FINISH_REASONS] for s in servers.values()} == {("stop",)}
    assert {s.attributes[sc.USAGE_OUTPUT_TOKENS] for s in servers.values()} == {5}
    assert _histogram(reader, _metric("e2e"))[0] == 2


class _FakeTime:
    def __init__(self) -> None:
        self.now, self.slept = 1000.0, 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


@pytest.mark.parametrize("comes", [True, False], ids=["the abort comes", "it never does"])
def test_a_flush_right_after_a_stop_string_waits_a_bounded_while_for_the_engines_abort(comes: bool):
    """The frontend found a stop string: its enrichment is sent and the flush follows at once, while the
    engine's abort (the request's finish) is still on its way. The flush reads the engine for it (it comes two
    polls later) and settles the request with the frontend's reason; one that never comes costs that flush
    ``FLUSH_STEP_WAIT_S`` and no later flush anything, and the request stays held for its engine finish."""
    from otel_llm.agent import process

    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    script = _enriched(_script(base, wall))
    steps = [x for x in script[1] if isinstance(x, StepRecord)] + script[2]
    aborts = [replace(x, reason="abort") for x in script[1] if isinstance(x, RequestFinish)]
    later = [[], [], aborts] if comes else []
    agent, exporter, _reader, _peer = _agent([script[0], steps] + later)
    fake = _FakeTime()
    agent.clock, agent.sleep = fake.clock, fake.sleep
    agent.turn()  # the starts
    agent.turn()  # the steps
    for rid in PROMPTS:
        agent.take(encode(_enrichment(rid, wall, reason="stop", output_tokens=5)))
    agent.turn(final=True)  # the flush
    p = agent.pipeline
    assert p.flush(10)
    if comes:
        assert 0 < fake.slept < process.FLUSH_STEP_WAIT_S
        assert not p.requests and not agent.engine_requests.enrichments.arrived
        servers = _server_spans(exporter)
        assert {s.attributes[sc.RESPONSE_FINISH_REASONS] for s in servers.values()} == {("stop",)}
        assert len(servers) == 2
    else:
        assert fake.slept == pytest.approx(process.FLUSH_STEP_WAIT_S)
        assert len(p.requests) == 2 and len(agent.engine_requests.enrichments.arrived) == 2
        agent.turn(final=True)  # waited for once
        assert fake.slept == pytest.approx(process.FLUSH_STEP_WAIT_S)


def test_a_lost_enrichment_waits_a_bounded_time_and_a_late_one_counts_nothing():
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    agent, exporter, reader, _peer = _agent(_enriched(_script(base, wall)))
    agent.engine_requests.enrichments.hold_turns = 3
    for _ in range(4):
        agent.turn()
    assert agent.pipeline.counts.requests_finished == 0
    for _ in range(3):
        agent.turn()
    p = agent.pipeline
    assert p.flush(10) and not p.requests
    assert _histogram(reader, _metric("e2e"))[0] == 2  # the engine's own numbers, as under the Rust frontend
    assert {s.attributes[sc.OPERATION_NAME] for s in _server_spans(exporter).values()} == {"text_completion"}
    for rid in PROMPTS:  # too late: kept a bounded while, never counted
        agent.take(encode(_enrichment(rid, wall)))
    for _ in range(3):
        agent.turn()
    assert p.flush(10) and _histogram(reader, _metric("e2e"))[0] == 2
    assert agent.stats()["agent_enrichments_missing"] == 2


def test_the_sequences_of_a_request_with_n_choices_are_one_trace():
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    agent, exporter, _reader, _peer = _agent(_enriched(_script(base, wall)))
    for _ in range(4):
        agent.turn()
    for i, rid in enumerate(PROMPTS):
        agent.take(encode(_enrichment(rid, wall, group_id="cmpl-g-0", group_size=2, group_expected=2,
                                      choice_index=i)))
    agent.turn()
    assert agent.pipeline.flush(10)
    spans = exporter.get_finished_spans()
    choices = [s for s in spans if s.name == sc.SPAN_CHOICE]
    assert len(choices) == 2 and len({s.context.trace_id for s in choices}) == 1
    assert not agent.engine_requests.enrichments.groups


def test_an_engine_record_arriving_on_the_frontends_link_is_refused_and_counted():
    agent, _exporter, _reader, _peer = _agent([])
    agent.take(encode(RequestFinish(request_id="x", reason="stop", arrival=1.0, queued=1.0, end=2.0, end_wall=2.0,
                                    prompt_tokens=1, output_tokens=1)))
    agent.take(b"\xd0\x03garbage")
    assert agent.malformed == 2 and not agent.engine_requests.enrichments.arrived


def test_an_enrichment_whose_engine_finish_never_comes_is_dropped_after_a_bounded_wait_and_counted():
    """A request another process's engine ran (a ``--headless`` rank under a Python head) sends this agent
    its enrichment and never an engine finish: it is kept ``enrichment_turns`` turns, then dropped (counted
    in ``agent_enrichments_missing``); one whose finish comes within them joins it."""
    base, wall = time.monotonic() - 5.0, time.time() - 5.0
    agent, exporter, _reader, _peer = _agent([])
    joins = agent.engine_requests.enrichments
    joins.enrichment_turns = 5
    agent.take(encode(_enrichment("elsewhere-1", wall)))
    for _ in range(4):
        agent.turn()
    assert "elsewhere-1" in joins.arrived
    agent.take(encode(_enrichment("elsewhere-2", wall)))
    agent.turn()
    assert list(joins.arrived) == ["elsewhere-2"] and list(joins.came) == ["elsewhere-2"]
    assert agent.stats()["agent_enrichments_missing"] == 1
    for _ in range(5):
        agent.turn()
    assert not joins.arrived and not joins.came and not joins.fresh
    assert agent.stats()["agent_enrichments_missing"] == 2
