"""What the frontend tells its agent, one message a packet on a ``SOCK_SEQPACKET`` socket pair.

The two messages a request costs the frontend (a start, a finish) are plain tuples of built-in values,
``marshal``-ed: ~1–2 µs each, where pickling the ``RequestTimeline`` and ``RequestSummary`` themselves
took ~10 µs. A finish is the engine's own numbers (``FACTS``, core/finish_facts.py) where the frontend has
them: the summary is made in the agent; else (an engine without statistics) a summary (``FINISH``). Rare
messages (the configuration, an engine's shape) are declared records (control.py). Nothing is pickled.
Every message is one packet, so a full
socket refuses it whole (counted by the sender) and never leaves half a message.

Replies go the other way only for ``FLUSH`` and ``STATS`` (and ``READY`` once), each carrying the
request's token, so the frontend never has unsolicited data waiting on its end.

The frontend's first message after ``READY`` is ``RING``: the announcement of a shared-memory ring
(otel_llm/shm_ring.py, with its descriptor), through which it sends every later message, or None where
the platform has none (then every message is a packet). One channel either way, so the agent reads the
messages in the order they were sent.
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass, fields
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

from ..core.finish_facts import EngineStats, FinishFacts
from ..core.step_tokens import TokenWindow
from ..core.summary import RequestSummary
from ..core.timeline import RequestGroup, RequestTimeline

# message kinds (the first item of every message)
START, FINISH, CONFIG, ENGINE, FLUSH, STATS, READY, REPLY, FACTS, RING = range(1, 11)
# one byte on the socket where the frontend's messages go through a ring: a control message (a flush, stats,
# options) was written there, read it now (no marshal value is this one byte)
DOORBELL = b"\x00"
MAX_PACKET = 1 << 20  # a longer message (captured content) is refused by the sender, counted

_SUMMARY_FIELDS = tuple(f.name for f in fields(RequestSummary))
_GAPS = _SUMMARY_FIELDS.index("gaps")
_KINDS = tuple(SpanKind)


@dataclass
class AgentConfig:
    """What an instrumentation hands its agent (once per ``instrument()``, as a ``control.ConfigRecord``): the
    options, and the exporters to build (``destinations.Destinations``)."""

    config: Any  # core.config.Config
    destinations: Any


def pack(message: tuple) -> bytes:
    return marshal.dumps(message)


def unpack(data: bytes) -> tuple:
    message = marshal.loads(data)
    if not isinstance(message, tuple) or not message or not isinstance(message[0], int):
        raise ValueError("not an agent message")
    return message


# -- a request's start and finish ---------------------------------------------------------------------

def start_message(t: RequestTimeline, content: bool = True) -> bytes:
    """``content``: False leaves the captured prompt out (too long for a packet)."""
    group = t.group
    return marshal.dumps((
        START, t.request_id, t.arrival, t.model, t.operation, t.provider, _KINDS.index(t.kind),
        _parent(t.parent), t.response_id, t.request_attributes, t.input_tokens, t.lora_name, t.lora_id,
        t.steps_give_tokens, t.prompt_text if content else None,
        (group.group_id, group.choice_count, group.expected) if group is not None else None, t.choice_index,
    ))


def finish_message(request_id: str, t: RequestTimeline | None, s: RequestSummary, content: bool = True) -> bytes:
    """``t``: None for a request the frontend did not track (over ``max_requests``): metrics only there.
    ``content``: False leaves the captured completion out (too long for a packet)."""
    values = [getattr(s, name) for name in _SUMMARY_FIELDS]
    values[_GAPS] = None  # derived in the agent, from the token times
    if t is None:
        return marshal.dumps((FINISH, request_id, None, None, (), (), None, None, None, None, None, tuple(values),
                              None, None))
    window = t.token_window
    return marshal.dumps((
        FINISH, request_id, t.finish_reason, t.error_type, t.events, t.token_ts, t.multi_token_steps,
        tuple(window) if window is not None else None, t.cache_sources, t.output_text if content else None,
        t.spec, tuple(values), t.first_output, t.last_output,
    ))


class Starts:
    """The agent's side of ``START``: timelines, and the groups (n > 1) their sequences belong to."""

    def __init__(self) -> None:
        self.groups: dict[str, RequestGroup] = {}

    def timeline(self, m: tuple) -> RequestTimeline:
        (_, rid, arrival, model, operation, provider, kind, parent, response_id, attrs, input_tokens,
         lora_name, lora_id, steps_give_tokens, prompt_text, group, choice_index) = m
        t = RequestTimeline(request_id=rid, arrival=arrival, model=model, operation=operation, provider=provider,
                            kind=_KINDS[kind], parent=_context(parent), response_id=response_id,
                            request_attributes=attrs, input_tokens=input_tokens)
        t.lora_name, t.lora_id, t.steps_give_tokens, t.prompt_text = lora_name, lora_id, steps_give_tokens, prompt_text
        if group is not None:
            gid, n, expected = group
            g = self.groups.get(gid)
            if g is None or g.complete:
                g = self.groups[gid] = RequestGroup(gid, n, expected)
            g.expected = expected
            t.group, t.choice_index = g, choice_index
        return t

    def forget_complete(self) -> None:
        for gid in [gid for gid, g in self.groups.items() if g.complete]:
            del self.groups[gid]


def facts_message(f: FinishFacts, content: bool = True) -> bytes:
    """A finish as the engine's own numbers (``FACTS``): the frontend's finish where it has them.
    ``content``: False leaves the captured completion out (too long for a packet)."""
    return marshal.dumps((FACTS, f.request_id, f.reason, f.end, f.events, f.cache_sources, f.cached_tokens,
                          f.output_characters, f.output_text if content else None, f.model, f.operation,
                          f.provider, f.input_tokens, f.arrival, tuple(f.stats), f.first_output, f.last_output))


def facts_of(m: tuple) -> FinishFacts:
    return FinishFacts(*m[1:14], EngineStats(*m[14]), *m[15:17])


def last_output_stamp(m: tuple) -> float | None:
    """A ``FINISH``'s or ``FACTS``' last output stamp (the engine's monotonic clock: its output batch's, which
    is the end of the step that produced it), or None where it has none."""
    if m[0] == FACTS:
        last = m[14][4]  # EngineStats.last_token
    else:
        window, token_ts = m[7], m[5]
        last = window[1] if window is not None else token_ts[-1] if token_ts else None
    return last or None


def finish_into(t: RequestTimeline | None, m: tuple) -> tuple[str, RequestSummary]:
    """The request id and summary of a ``FINISH``; fills ``t`` (the started timeline, if known)."""
    (_, rid, reason, error_type, events, token_ts, multi, window, cache_sources, output_text, spec, values,
     first_output, last_output) = m
    if t is not None:
        t.first_output, t.last_output = first_output, last_output
        t.finish_reason, t.error_type, t.output_text = reason, error_type, output_text
        t.events = [tuple(e) for e in events]
        t.token_ts = list(token_ts)
        t.multi_token_steps = multi
        t.token_window = TokenWindow(*window) if window is not None else None
        t.cache_sources = tuple(cache_sources) if cache_sources is not None else None
        if spec is not None and t.spec is None:
            t.spec = list(spec)
    return rid, RequestSummary(*values)


def _parent(context: Any) -> tuple | None:
    if context is None:
        return None
    sc = trace.get_current_span(context).get_span_context()
    if not sc.is_valid:
        return None
    return (sc.trace_id.to_bytes(16, "big"), sc.span_id, int(sc.trace_flags), sc.is_remote,
            sc.trace_state.to_header() if sc.trace_state else "")


def _context(parent: tuple | None) -> Any:
    if parent is None:
        return None
    trace_id, span_id, flags, remote, state = parent
    ctx = SpanContext(int.from_bytes(trace_id, "big"), span_id, remote, TraceFlags(flags),
                      TraceState.from_header([state]) if state else None)
    return trace.set_span_in_context(NonRecordingSpan(ctx))
