"""What the frontend tells its agent, one message a packet on a ``SOCK_SEQPACKET`` socket pair.

Every message is a declared record (agent/control.py: named fields, a version, ``marshal`` of a field dict
behind a tag byte and a kind byte; records.py's ``RequestEnrichment`` on the one path). Nothing is pickled
and nothing is read by position: a message of another form (an older frontend's positional tuple) is
refused whole, counted (``agent_malformed``). Every message is one packet, so a full socket refuses it
whole (counted by the sender) and never leaves half a message.

Per request, where the frontend is its requests' source (an engine off the one path:
docs/design/enginecore-source.md), two messages: ``StartRecord`` when it takes the request, and its finish,
the engine's own numbers (``FactsRecord``, core/finish_facts.py) where the frontend has them (the summary is
made in the agent), else (an engine without statistics) the frontend's summary (``FinishRecord``). Each is
built straight from the frontend's timeline (``start_message``, ``facts_message``, ``finish_message``); one
whose captured content makes it too long for the channel goes again without the content (agent/link.py).
The agent turns them back into a timeline (``Starts``), facts (``facts_of``) or a summary
(``finish_into``), each nested value checked there.

Replies go the other way only for ``FlushRecord`` and ``StatsRecord`` (``ReplyRecord``, and ``ReadyRecord``
once), each carrying the request's token, so the frontend never has unsolicited data waiting on its end.

The frontend's first message after ``READY`` is ``RingRecord``: the announcement of a shared-memory ring
(otel_llm/shm_ring.py, with its descriptor), through which it sends every later message, or None where
the platform has none (then every message is a packet). One channel either way, so the agent reads the
messages in the order they were sent.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

from ..core.finish_facts import EngineStats, FinishFacts
from ..core.step_tokens import TokenWindow
from ..core.summary import RequestSummary
from ..core.timeline import RequestGroup, RequestTimeline
from . import control
from .control import FACTS, FINISH, START, FactsRecord, FinishRecord, StartRecord
from .declared import RecordError, attribute_value

# one byte on the socket where the frontend's messages go through a ring: a control message (a flush, stats,
# options) was written there, read it now (no record is this one byte)
DOORBELL = b"\x00"
MAX_PACKET = control.MAX_CONTROL  # the reader's bound: a longer message (captured content) is refused by the sender

_SUMMARY_FIELDS = tuple(f.name for f in fields(RequestSummary) if f.name != "gaps")  # gaps: made in the agent
_SUMMARY_TYPES = {name: control.accepted(hint) for name, hint in typing.get_type_hints(RequestSummary).items()
                  if name in _SUMMARY_FIELDS}  # the built-in types each field takes on the wire
_WINDOW_FIELDS = TokenWindow._fields
_NUMBER = (int, float)


@dataclass
class AgentConfig:
    """What an instrumentation hands its agent (once per ``instrument()``, as a ``control.ConfigRecord``): the
    options, and the exporters to build (``destinations.Destinations``)."""

    config: Any  # core.config.Config
    destinations: Any


# -- the frontend: a request's start and finish, framed straight from its timeline ------------------------

_START_V, _FACTS_V, _FINISH_V = StartRecord.VERSION, FactsRecord.VERSION, FinishRecord.VERSION
_frame = control.frame


def start_message(t: RequestTimeline, content: bool = True) -> bytes:
    """``START``. ``content``: False leaves the captured prompt out (too long for the channel)."""
    group = t.group
    values = {
        "request_id": t.request_id, "arrival": t.arrival, "model": t.model, "operation": t.operation,
        "provider": t.provider, "kind": t.kind.value, "response_id": t.response_id,
        "attributes": t.request_attributes, "input_tokens": t.input_tokens, "lora_name": t.lora_name,
        "lora_id": t.lora_id, "steps_give_tokens": t.steps_give_tokens,
        "prompt_text": t.prompt_text if content else None, "choice_index": t.choice_index,
    }
    if group is not None:
        values["group_id"], values["group_size"], values["group_expected"] = (group.group_id, group.choice_count,
                                                                              group.expected)
    if t.parent is not None:
        _parent(t.parent, values)
    return _frame(START, _START_V, values)


def facts_message(f: FinishFacts, content: bool = True) -> bytes:
    """``FACTS``: a finish as the engine's own numbers. ``content``: False leaves the captured completion out."""
    s = f.stats
    return _frame(FACTS, _FACTS_V, {
        "request_id": f.request_id, "reason": f.reason, "end": f.end, "arrival": f.arrival, "events": f.events,
        "cache_sources": f.cache_sources, "cached_tokens": f.cached_tokens,
        "output_characters": f.output_characters, "output_text": f.output_text if content else None,
        "model": f.model, "operation": f.operation, "provider": f.provider, "input_tokens": f.input_tokens,
        "engine_arrival": s.arrival, "queued": s.queued, "scheduled": s.scheduled, "first_token": s.first_token,
        "last_token": s.last_token, "first_token_latency": s.first_token_latency,
        "generation_tokens": s.generation_tokens, "preemptions": s.preemptions, "first_output": f.first_output,
        "last_output": f.last_output,
    })


def finish_message(request_id: str, t: RequestTimeline | None, s: RequestSummary, content: bool = True) -> bytes:
    """``FINISH``: a finish as the frontend's summary. ``t``: None for a request the frontend did not track
    (over ``max_requests``): metrics only there. ``content``: False leaves the captured completion out."""
    summary = {name: getattr(s, name) for name in _SUMMARY_FIELDS}
    if t is None:
        return _frame(FINISH, _FINISH_V, {"request_id": request_id, "summary": summary, "tracked": False})
    window = t.token_window
    return _frame(FINISH, _FINISH_V, {
        "request_id": request_id, "summary": summary, "reason": t.finish_reason, "error_type": t.error_type,
        "events": t.events, "token_ts": t.token_ts, "multi_token_steps": t.multi_token_steps,
        "token_window": dict(zip(_WINDOW_FIELDS, window)) if window is not None else None,
        "cache_sources": t.cache_sources, "output_text": t.output_text if content else None, "spec": t.spec,
        "first_output": t.first_output, "last_output": t.last_output,
    })


def _parent(context: Any, values: dict[str, Any]) -> None:
    sc = trace.get_current_span(context).get_span_context()
    if sc.is_valid:
        values["trace_id"] = sc.trace_id.to_bytes(16, "big")
        values["span_id"], values["trace_flags"], values["remote"] = sc.span_id, int(sc.trace_flags), sc.is_remote
        values["trace_state"] = sc.trace_state.to_header() if sc.trace_state else ""


# -- the agent: what each record carries, every nested value checked (RecordError) ------------------------

class Starts:
    """The agent's side of ``START``: timelines, and the groups (n > 1) their sequences belong to."""

    def __init__(self) -> None:
        self.groups: dict[str, RequestGroup] = {}

    def timeline(self, r: StartRecord) -> RequestTimeline:
        try:
            kind = SpanKind(r.kind)
        except ValueError:
            raise RecordError(f"StartRecord.kind: no span kind {r.kind}") from None
        t = RequestTimeline(request_id=r.request_id, arrival=r.arrival, model=r.model, operation=r.operation,
                            provider=r.provider, kind=kind, parent=_context(r), response_id=r.response_id,
                            request_attributes=_attributes(r.attributes), input_tokens=r.input_tokens)
        t.lora_name, t.lora_id, t.steps_give_tokens, t.prompt_text = (r.lora_name, r.lora_id, r.steps_give_tokens,
                                                                      r.prompt_text)
        if r.group_id is not None:
            g = self.groups.get(r.group_id)
            if g is None or g.complete:
                g = self.groups[r.group_id] = RequestGroup(r.group_id, r.group_size, r.group_expected)
            g.expected = r.group_expected
            t.group, t.choice_index = g, r.choice_index
        return t

    def forget_complete(self) -> None:
        for gid in [gid for gid, g in self.groups.items() if g.complete]:
            del self.groups[gid]


def facts_of(r: FactsRecord) -> FinishFacts:
    """The ``FinishFacts`` a ``FACTS`` carries."""
    return FinishFacts(
        r.request_id, r.reason, r.end, _events("FactsRecord", r.events),
        _pair("FactsRecord.cache_sources", r.cache_sources), r.cached_tokens, r.output_characters, r.output_text,
        r.model, r.operation, r.provider, r.input_tokens, r.arrival,
        EngineStats(r.engine_arrival, r.queued, r.scheduled, r.first_token, r.last_token, r.first_token_latency,
                    r.generation_tokens, r.preemptions), r.first_output, r.last_output)


def checked(r: FinishRecord) -> FinishRecord:
    """``r`` with its nested values checked and made the types ``finish_into`` and ``last_output_stamp`` read
    (RecordError for one of another type): done when it arrives, since it waits before it is settled."""
    where = "FinishRecord"
    r.events = _events(where, r.events)
    ts = r.token_ts
    if not all(type(x) is float for x in ts):  # (a list of floats: one check a token)
        if not all(isinstance(x, _NUMBER) and not isinstance(x, bool) for x in ts):
            raise RecordError(f"{where}.token_ts: not numbers")
    r.token_ts = list(ts)
    multi = r.multi_token_steps
    if multi is not None and not all(type(k) is int and type(v) is int for k, v in multi.items()):
        raise RecordError(f"{where}.multi_token_steps: not ints")
    if r.token_window is not None:
        w = r.token_window
        values = [w.get(name) for name in _WINDOW_FIELDS]
        if not all(isinstance(x, _NUMBER) and not isinstance(x, bool) for x in values):
            raise RecordError(f"{where}.token_window: not a token window")
        r.token_window = dict(zip(_WINDOW_FIELDS, values))
    r.cache_sources = _pair(f"{where}.cache_sources", r.cache_sources)
    if r.spec is not None:
        if not all(type(x) is int for x in r.spec):
            raise RecordError(f"{where}.spec: not ints")
        r.spec = list(r.spec)
    for name, value in r.summary.items():
        accepted = _SUMMARY_TYPES.get(name)
        if accepted is not None and (not isinstance(value, accepted)
                                     or isinstance(value, bool) and bool not in accepted):
            raise RecordError(f"{where}.summary.{name}: {type(value).__name__}")
    return r


def finish_into(t: RequestTimeline | None, r: FinishRecord) -> tuple[str, RequestSummary]:
    """The request id and summary of a ``FINISH`` (``checked``); fills ``t`` (the started timeline, if known)."""
    if t is not None and r.tracked:
        t.first_output, t.last_output = r.first_output, r.last_output
        t.finish_reason, t.error_type, t.output_text = r.reason, r.error_type, r.output_text
        t.events = r.events
        t.token_ts = r.token_ts
        t.multi_token_steps = r.multi_token_steps
        w = r.token_window
        t.token_window = TokenWindow(**w) if w is not None else None
        t.cache_sources = r.cache_sources
        if r.spec is not None and t.spec is None:
            t.spec = r.spec
    return r.request_id, RequestSummary(**{k: v for k, v in r.summary.items() if k in _SUMMARY_TYPES})


def last_output_stamp(f: FinishFacts | FinishRecord) -> float | None:
    """A finish's last output stamp (the engine's monotonic clock: its output batch's, which is the end of
    the step that produced it), or None where it has none."""
    if type(f) is FinishRecord:
        window = f.token_window
        last = window["last"] if window is not None else f.token_ts[-1] if f.token_ts else None
    else:
        last = f.stats.last_token
    return last or None


def _events(where: str, events: Any) -> list[tuple[int, float]]:
    out = []
    for e in events:
        if not (isinstance(e, (tuple, list)) and len(e) == 2 and type(e[0]) is int
                and isinstance(e[1], _NUMBER) and not isinstance(e[1], bool)):
            raise RecordError(f"{where}.events: not (kind, stamp) pairs")
        out.append((e[0], e[1]))
    return out


def _pair(where: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (len(value) == 2 and type(value[0]) is int and type(value[1]) is int):
        raise RecordError(f"{where}: not two ints")
    return (value[0], value[1])


def _attributes(attrs: dict) -> dict[str, Any]:
    """Span attribute values only (declared.attribute_value): another is left out."""
    return {k: a for k, v in attrs.items() if type(k) is str and (a := attribute_value(v)) is not None}


def _context(r: StartRecord) -> Any:
    if r.trace_id is None:
        return None
    if len(r.trace_id) != 16 or not 0 < r.span_id < 1 << 64 or not 0 <= r.trace_flags < 256:
        raise RecordError("StartRecord: not a span context")
    ctx = SpanContext(int.from_bytes(r.trace_id, "big"), r.span_id, r.remote, TraceFlags(r.trace_flags),
                      TraceState.from_header([r.trace_state]) if r.trace_state else None)
    return trace.set_span_in_context(NonRecordingSpan(ctx))
