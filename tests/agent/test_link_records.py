"""Every message on the agent link is a declared record (otel_llm/agent/control.py, protocol.py): each one
round-trips by name, the per-request ones framed straight from the frontend's timeline carry exactly their
record's fields, the positional tuples of earlier releases and records of the wrong kind are refused
(counted by the agent, which serves on), and no bytes make the reader raise anything but ``RecordError``."""

from __future__ import annotations

import marshal
import random
import socket
from dataclasses import fields

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

from otel_llm.agent import control, protocol, records
from otel_llm.agent.control import (FactsRecord, FinishRecord, FlushRecord, ReadyRecord, ReleaseRecord, ReplyRecord,
                                    RingRecord, StartRecord, StatsRecord)
from otel_llm.agent.process import Agent
from otel_llm.agent.records import RecordError
from otel_llm.core.config import Config
from otel_llm.core.finish_facts import EngineStats, FinishFacts
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.step_tokens import TokenWindow
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestGroup, RequestTimeline

TRACE_ID, SPAN_ID = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331


def _timeline(full: bool = True) -> RequestTimeline:
    base = 5000.0
    t = RequestTimeline("cmpl-1-0-abcd1234", 1.7e9, model="tiny", operation="text_completion", provider="vllm",
                        input_tokens=12)
    if full:
        ctx = SpanContext(TRACE_ID, SPAN_ID, True, TraceFlags(1), TraceState([("vendor", "x")]))
        t.kind, t.parent = SpanKind.SERVER, trace.set_span_in_context(NonRecordingSpan(ctx))
        t.response_id, t.lora_name, t.lora_id, t.steps_give_tokens = "cmpl-1", "sql", 3, True
        t.request_attributes = {"gen_ai.request.max_tokens": 16, "gen_ai.request.temperature": 0.5,
                                "llm.request.stream": True, "gen_ai.request.stop_sequences": ("a", "b")}
        t.prompt_text, t.group, t.choice_index = "hello", RequestGroup("cmpl-1-0", 2, 2), 1
        t.events = [(QUEUED, base), (SCHEDULED, base + 0.01)]
        t.token_ts = [base + 0.05, base + 0.06, base + 0.08]
        t.multi_token_steps = {2: 3}
        t.token_window = TokenWindow(base + 0.05, base + 0.08, 5, 12)
        t.cache_sources, t.spec = (4, 0), [2, 6, 3]
        t.first_output, t.last_output = 1.7e9 + 0.05, 1.7e9 + 0.08
        t.finish_reason, t.output_text = "length", "world"
    return t


def _facts() -> FinishFacts:
    stats = EngineStats(1.7e9 + 0.001, 5000.0, 5000.01, 5000.05, 5000.08, 0.05, 3, 1)
    return FinishFacts("r-1", "stop", 1.7e9 + 0.1, [(QUEUED, 5000.0), (SCHEDULED, 5000.01)], (4, 2), 6, 11,
                       "hello world", "tiny", "chat", "vllm", 12, 1.7e9, stats, 1.7e9 + 0.05, 1.7e9 + 0.08)


def _summary() -> RequestSummary:
    return RequestSummary(model="tiny", ttft=0.05, e2e=0.1, queue=0.01, prefill=0.04, decode=0.03, tpot=0.015,
                          input_tokens=12, output_tokens=3, output_characters=11, num_preemptions=1,
                          finish_reason="length", spec_draft_tokens=6, spec_accepted_tokens=3, spec_verify_steps=2,
                          tenant="team-a", lora="sql")


def _values(data: bytes) -> dict:
    assert data[0] == control.TAG
    version, values = marshal.loads(data[2:])
    assert version == 1
    return values


def _names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


# -- the per-request records: framed from the timeline, by the record's names ----------------------------

def test_a_start_carries_exactly_its_records_fields_and_round_trips():
    t = _timeline()
    data = protocol.start_message(t)
    assert set(_values(data)) == _names(StartRecord)  # every field named, nothing else
    r = control.decode(data)
    assert type(r) is StartRecord
    got = protocol.Starts().timeline(r)
    for name in ("request_id", "arrival", "model", "operation", "provider", "kind", "response_id", "input_tokens",
                 "lora_name", "lora_id", "steps_give_tokens", "prompt_text", "choice_index", "request_attributes"):
        assert getattr(got, name) == getattr(t, name), name
    sc = trace.get_current_span(got.parent).get_span_context()
    assert (sc.trace_id, sc.span_id, sc.is_remote, int(sc.trace_flags)) == (TRACE_ID, SPAN_ID, True, 1)
    assert sc.trace_state.to_header() == "vendor=x"
    assert (got.group.group_id, got.group.choice_count, got.group.expected) == ("cmpl-1-0", 2, 2)
    assert protocol.Starts().timeline(control.decode(protocol.start_message(t, content=False))).prompt_text is None


def test_a_start_without_parent_or_group_leaves_them_out():
    t = _timeline(full=False)
    values = _values(protocol.start_message(t))
    assert "trace_id" not in values and "group_id" not in values  # their defaults: no parent, no group
    got = protocol.Starts().timeline(control.decode(protocol.start_message(t)))
    assert got.parent is None and got.group is None and got.kind is SpanKind.INTERNAL


def test_facts_carry_exactly_their_records_fields_and_round_trip():
    f = _facts()
    data = protocol.facts_message(f)
    assert set(_values(data)) == _names(FactsRecord)
    assert protocol.facts_of(control.decode(data)) == f
    assert protocol.facts_of(control.decode(protocol.facts_message(f, content=False))).output_text is None


def test_a_finish_carries_exactly_its_records_fields_and_round_trips():
    t, s = _timeline(), _summary()
    data = protocol.finish_message(t.request_id, t, s)
    assert set(_values(data)) == _names(FinishRecord) - {"tracked"}  # (tracked: the default)
    assert set(_values(data)["summary"]) == {f.name for f in fields(RequestSummary)} - {"gaps"}
    r = protocol.checked(control.decode(data))
    got = RequestTimeline(t.request_id, t.arrival)
    rid, summary = protocol.finish_into(got, r)
    assert rid == t.request_id and summary == s
    for name in ("events", "token_ts", "multi_token_steps", "token_window", "cache_sources", "spec",
                 "first_output", "last_output", "finish_reason", "output_text"):
        assert getattr(got, name) == getattr(t, name), name
    assert isinstance(got.token_window, TokenWindow)
    assert protocol.last_output_stamp(r) == t.token_window.last
    untracked = control.decode(protocol.finish_message("r-9", None, s))
    assert untracked.tracked is False
    assert protocol.finish_into(None, protocol.checked(untracked)) == ("r-9", s)


def test_the_last_output_stamp_of_each_finish():
    t = _timeline()
    t.token_window = None
    r = protocol.checked(control.decode(protocol.finish_message(t.request_id, t, _summary())))
    assert protocol.last_output_stamp(r) == t.token_ts[-1]
    t.token_ts = []
    r = protocol.checked(control.decode(protocol.finish_message(t.request_id, t, _summary())))
    assert protocol.last_output_stamp(r) is None
    assert protocol.last_output_stamp(_facts()) == _facts().stats.last_token


def test_a_field_a_newer_writer_added_is_ignored_and_a_newer_version_refused():
    values = _values(protocol.start_message(_timeline()))
    values["tenant_hint"] = "x"
    r = control.decode(control.frame(control.START, 1, values))
    assert protocol.Starts().timeline(r).request_id == "cmpl-1-0-abcd1234"
    with pytest.raises(RecordError, match="version 2"):
        control.decode(control.frame(control.START, 2, values))
    summary = _values(protocol.finish_message("r", None, _summary()))
    summary["summary"]["a_newer_figure"] = 1.5
    assert protocol.finish_into(None, protocol.checked(control.decode(
        control.frame(control.FINISH, 1, summary))))[1] == _summary()


# -- control records -----------------------------------------------------------------------------------

@pytest.mark.parametrize("record", [
    RingRecord(b"\x01" * 20), RingRecord(None), FlushRecord(7, 2.5), StatsRecord(8), ReadyRecord(1234),
    ReplyRecord(7, ok=True), ReplyRecord(8, stats={"requests_kept": 3, "agent_errors": {"agent message": 1}}),
    ReleaseRecord(),
], ids=lambda r: type(r).__name__)
def test_each_control_record_round_trips(record):
    data = control.encode(record)
    assert set(_values(data)) == _names(type(record))
    assert control.decode(data) == record


# -- refused: positional tuples, the wrong kind, values of the wrong type ---------------------------------

# the positional messages of earlier releases, as they were framed: (kind, field, field, ...)
POSITIONAL = [
    marshal.dumps((1, "r", 1.7e9, "tiny", "text_completion", "vllm", 0, None, None, {}, 12, None, None, True, None,
                   None, None)),  # START
    marshal.dumps((9, "r", "stop", 1.0, [], None, 0, None, None, "tiny", "chat", "vllm", 12, 1.0,
                   (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0), 0.0, 0.0)),  # FACTS
    marshal.dumps((2, "r", None, None, (), (), None, None, None, None, None, (None,) * 28, None, None)),  # FINISH
    marshal.dumps((5, 1, 2.0)), marshal.dumps((6, 1)), marshal.dumps((10, None)),  # FLUSH, STATS, RING
    marshal.dumps((3, 1, None)),  # CONFIG's release
]


@pytest.mark.parametrize("data", POSITIONAL, ids=["start", "facts", "finish", "flush", "stats", "ring", "release"])
def test_a_positional_message_is_refused(data):
    with pytest.raises(RecordError, match="not a record of the agent link"):
        control.decode(data)


@pytest.mark.parametrize("kind, values, says", [
    (control.START, {"request_id": "r", "arrival": 1.0, "kind": 9}, "no span kind 9"),
    (control.START, {"request_id": "r", "arrival": 1.0, "trace_id": b"short", "span_id": 1}, "not a span context"),
    (control.START, {"request_id": "r", "arrival": 1.0, "trace_id": b"\x01" * 16, "span_id": 0},
     "not a span context"),
    (control.START, {"request_id": "r", "arrival": True}, "arrival: bool"),
    (control.START, {"arrival": 1.0}, "StartRecord"),
    (control.FACTS, {"request_id": "r", "reason": "stop", "end": 1.0, "arrival": 1.0, "events": [(1, "x")]},
     "events: not"),
    (control.FACTS, {"request_id": "r", "reason": "stop", "end": 1.0, "arrival": 1.0, "cache_sources": (1,)},
     "cache_sources: not two ints"),
    (control.FACTS, {"request_id": "r", "reason": "stop", "end": 1.0, "arrival": 1.0, "generation_tokens": 1.5},
     "generation_tokens: float"),
    (control.FINISH, {"request_id": "r", "summary": {}, "token_ts": [1.0, "2"]}, "token_ts: not numbers"),
    (control.FINISH, {"request_id": "r", "summary": {}, "multi_token_steps": {"1": 2}}, "multi_token_steps"),
    (control.FINISH, {"request_id": "r", "summary": {}, "token_window": {"first": 1.0}}, "not a token window"),
    (control.FINISH, {"request_id": "r", "summary": {}, "spec": [1, 2.5, 3]}, "spec: not ints"),
    (control.FINISH, {"request_id": "r", "summary": {"ttft": "fast"}}, "summary.ttft: str"),
    (control.FINISH, {"request_id": "r", "summary": {"output_tokens": True}}, "summary.output_tokens: bool"),
    (control.FINISH, {"request_id": "r", "summary": []}, "summary: list"),
    (control.FLUSH, {"token": 1}, "FlushRecord"),
    (control.REPLY, {"token": 1, "ok": 1}, "ok: int"),
])
def test_values_of_the_wrong_type_are_refused_with_a_clear_error(kind, values, says):
    with pytest.raises(RecordError, match=says):
        _read(control.frame(kind, 1, values))


def _read(data: bytes) -> object:
    """What the agent makes of a message (agent/process.Agent.handle's conversions)."""
    r = control.decode(data)
    if type(r) is StartRecord:
        return protocol.Starts().timeline(r)
    if type(r) is FactsRecord:
        return protocol.facts_of(r)
    if type(r) is FinishRecord:
        return protocol.finish_into(None, protocol.checked(r))
    if type(r) is control.ConfigRecord:
        return control.setup_of(r)
    if type(r) is control.EngineRecord:
        return control.engine_of(r)
    return r


def test_random_bytes_never_raise_anything_but_record_error():
    rng = random.Random(5)
    t = _timeline()
    goods = [protocol.start_message(t), protocol.facts_message(_facts()),
             protocol.finish_message(t.request_id, t, _summary()), protocol.finish_message("r", None, _summary()),
             control.encode(FlushRecord(1, 2.0)), control.encode(ReplyRecord(2, stats={"a": 1})),
             control.encode(RingRecord(b"\x00" * 24)), *POSITIONAL]
    for i in range(6000):
        data = bytearray(goods[i % len(goods)])
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[:rng.randint(0, len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            _read(data)
        except RecordError:
            pass
    for _ in range(2000):
        try:
            _read(bytes((control.TAG, rng.randint(0, 12))) + rng.randbytes(rng.randint(0, 64)))
        except RecordError:
            pass


# -- the agent: refuses what is not the frontend's to send, counts it, serves on ---------------------------

def _agent() -> tuple[Agent, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    agent = Agent(ours)
    config = Config.resolve({"sample_rate": 1.0, "engine_steps": False}, environ={})
    tp = TracerProvider()
    agent.pipeline = Pipeline(config, tp.get_tracer("t"),
                              MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t"), engine="vllm")
    return agent, theirs


def test_the_agent_refuses_positional_messages_and_records_of_the_wrong_kind():
    agent, peer = _agent()
    wrong = [
        control.encode(ReadyRecord(1)), control.encode(ReplyRecord(1, ok=True)),  # the agent's own records
        control.encode(RingRecord(None)),  # a ring after the first message
        records.encode(records.RequestStart("e-1", 1.7e9, 1.0, 4)),  # an engine's request records
        records.encode(records.SinkCounts(pid=1)),
        b"\x00\x01", b"",  # (an empty packet is the frontend's end; never reaches take)
    ]
    for data in POSITIONAL + wrong[:-1]:
        agent.take(data)
    assert agent.malformed == len(POSITIONAL) + len(wrong) - 1
    assert not agent.pipeline.requests and not agent.arrived
    # and serves on: a start and a finish by record
    t = _timeline()
    peer.send(protocol.start_message(t))
    peer.send(protocol.finish_message(t.request_id, t, _summary()))
    assert agent.receive() == 2
    assert t.request_id in agent.pipeline.requests and len(agent.arrived) == 1
    agent.turn(final=True)
    assert not agent.pipeline.requests and agent.orphans == 0
    assert agent.malformed == len(POSITIONAL) + len(wrong) - 1
    peer.close()
    agent.sock.close()


def test_the_agent_answers_a_flush_and_stats_by_token():
    agent, peer = _agent()
    peer.settimeout(5.0)
    agent.take(control.encode(FlushRecord(41, 1.0)))
    reply = control.decode(peer.recv(1 << 16))
    assert reply == ReplyRecord(41, ok=True)
    agent.take(control.encode(StatsRecord(42)))
    reply = control.decode(peer.recv(1 << 20))
    assert type(reply) is ReplyRecord and reply.token == 42 and reply.stats["agent_malformed"] == 0
    peer.close()
    agent.sock.close()


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, float("inf")])
def test_a_flush_without_a_bound_is_refused(timeout):
    agent, peer = _agent()
    agent.take(control.encode(FlushRecord(43, timeout)))
    assert agent.malformed == 1
    peer.close()
    agent.sock.close()


def test_the_first_message_must_be_a_ring():
    agent, peer = _agent()
    agent.open_ring(control.encode(RingRecord(None)), [])
    assert agent.ring is None and agent.malformed == 0
    agent.open_ring(marshal.dumps((10, None)), [])  # an older frontend's positional RING: refused, counted
    agent.open_ring(control.encode(StatsRecord(1)), [])
    assert agent.malformed == 2
    peer.close()
    agent.sock.close()

