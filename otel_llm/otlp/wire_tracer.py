"""A tracer whose spans end as OTLP wire bytes in a DirectExport, for the SDK tracer it stands in for.

``SpanBuilder`` materializes a kept request with ``start_span`` / ``add_event`` /
``set_status`` / ``end``; given this tracer instead of the SDK's, the same code writes
the spans' protobuf directly (see direct_export for when that is allowed). What the SDK
would decide stays the SDK's: trace and span ids come from the tracer's id generator,
sampling from its sampler (``start_span`` here follows ``opentelemetry.sdk.trace.Tracer.
start_span`` step by step), links are capped by its span limits; only sampled spans are
exported, as the batch processor does. The bytes equal the SDK encoder's for the same
span (tests/otlp/test_otlp_wire.py).
"""

from __future__ import annotations

import struct
import time
from typing import Any, Sequence

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from . import encode as w
from . import sdk_bridge
from .direct_export import DirectExport

_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_EVENT = b"\x5a"  # Span.events
_DROPPED_LINKS = b"\x70"  # Span.dropped_links_count, varint


def usable(tracer: Any) -> bool:
    """Whether spans of this SDK tracer can be written here exactly as the SDK would: its span limits
    must not truncate or drop attributes we write (the defaults don't)."""
    try:
        limits = sdk_bridge.span_limits(tracer)
    except sdk_bridge.Moved:
        return False
    no_truncation = limits.max_attribute_length is None and limits.max_span_attribute_length is None
    room = (limits.max_span_attributes or 0) >= 64 and (limits.max_events or 0) >= 64 \
        and (limits.max_event_attributes or 0) >= 16
    return no_truncation and room


class WireTracer(trace.Tracer):
    """``frame``: the resource and scope its spans are sent under, when not the exporter's own
    (engine-step spans, under their own service)."""

    def __init__(self, sdk_tracer: Any, wire: DirectExport, frame: w.RequestFrame | None = None) -> None:
        self.wire = wire
        self.frame = frame
        self._ids = sdk_tracer.id_generator
        self._sampler = sdk_tracer.sampler
        try:  # the default sampler's answer for a child of one of our (local, sampled) spans is known
            self._local_children = sdk_bridge.samples_local_children(self._sampler)
        except sdk_bridge.Moved:
            self._local_children = False
        self._max_links = sdk_bridge.span_limits(sdk_tracer).max_links
        self._links: dict[tuple[int, int, bool], bytes] = {}  # a kept request is linked from every step it was in

    def start_span(self, name: str, context: Any = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: dict[str, Any] | None = None, links: Sequence[Link] | None = None,
                   start_time: int | None = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> trace.Span:
        parent = trace.get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = self._ids.generate_trace_id()
        else:
            trace_id = parent.trace_id
        if self._local_children and parent is not None and not parent.is_remote and parent.trace_flags.sampled:
            # what the SDK's default sampler returns here (sdk_bridge.samples_local_children), without the calls
            sampled, trace_state, attrs = True, parent.trace_state, dict(attributes) if attributes else {}
        else:
            result = self._sampler.should_sample(context, trace_id, name, kind, attributes, links)
            sampled, trace_state = result.decision.is_sampled(), result.trace_state
            attrs = dict(result.attributes or {})
        flags = TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT
        # W3C level 2 "random trace id" flag, on SDK releases that have it
        if parent is None:
            random_id = getattr(self._ids, "is_trace_id_random", lambda: False)()
        else:
            random_id = getattr(parent.trace_flags, "random_trace_id", False)
        if random_id:
            flags |= getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
        span_context = SpanContext(trace_id, self._ids.generate_span_id(), False, TraceFlags(flags), trace_state)
        if not sampled:  # recording-only spans never reach an exporter through the batch processor either
            return trace.NonRecordingSpan(span_context)
        return WireSpan(self, name, span_context, parent, kind, attrs, self._encode_links(links) if links else b"",
                        start_time if start_time is not None else time.time_ns())

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:  # not used by the span builder
        raise NotImplementedError("WireTracer builds retroactive spans only")

    def _encode_links(self, links: Sequence[Link]) -> bytes:
        cache = self._links
        if len(cache) > 65536:
            cache.clear()
        # over the limit the SDK keeps the newest links (a bounded deque), and counts the rest
        kept = links if self._max_links is None or len(links) <= self._max_links else links[-self._max_links:]
        out = []
        for ln in kept:
            c = ln.context
            # SpanContext itself is unhashable (its TraceState): (trace_id, span_id, is_remote), read as one slice
            # of the tuple it is where that holds (_SLICE_KEY: one slice, not three attribute reads, for each
            # link of an engine step, which links every request it served)
            key = c[:3] if _SLICE_KEY else (c.trace_id, c.span_id, c.is_remote)
            b = cache.get(key)
            if b is None:
                b = cache[key] = w.link(c)
            out.append(b)
        dropped = len(links) - len(kept)
        return b"".join(out) + (_DROPPED_LINKS + w.varint(dropped) if dropped else b"")


class WireSpan(trace.Span):
    def __init__(self, tracer: WireTracer, name: str, context: SpanContext, parent: SpanContext | None,
                 kind: SpanKind, attributes: dict[str, Any], links: bytes, start: int) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._start = start
        self._events: list[tuple[str, int, dict[str, Any]]] = []
        self._status = _UNSET  # replaced, never changed, by set_status
        self._ended = False

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return not self._ended

    def set_attribute(self, key: str, value: Any) -> None:
        self._attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self._attributes.update(attributes)

    def add_event(self, name: str, attributes: dict[str, Any] | None = None, timestamp: int | None = None) -> None:
        self._events.append((name, timestamp if timestamp is not None else time.time_ns(), dict(attributes or {})))

    def update_name(self, name: str) -> None:
        self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(self, exception: BaseException, attributes: dict[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self.add_event("exception", {"exception.type": type(exception).__name__,
                                     "exception.message": str(exception), **(attributes or {})}, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        end = end_time if end_time is not None else time.time_ns()
        self._tracer.wire.add(self._encode(end), 1, self._tracer.frame)

    def _encode(self, end: int) -> bytes:
        c, parent = self._context, self._parent
        state = c.trace_state.to_header() if c.trace_state else ""
        status = self._status
        if status is _UNSET:
            status_field = _EMPTY_STATUS
        else:
            status_body = b""
            if status.description:
                status_body += w.field(b"\x12", status.description.encode())
            if status.status_code is not StatusCode.UNSET:
                status_body += b"\x18" + w.varint(status.status_code.value)
            status_field = w.field(b"\x7a", status_body)
        name = _NAMES.get(self._name)
        if name is None:
            name = w.field(b"\x2a", self._name.encode())
            if len(_NAMES) < 4096:  # span names are ours and few; bounded all the same
                _NAMES[self._name] = name
        # Span fields in field order: trace_id and span_id (16 and 8 bytes), trace_state, parent_span_id, name,
        # kind, start and end, attributes, events, links, status, flags
        parts = [b"\x0a\x10", c.trace_id.to_bytes(16, "big"), b"\x12\x08", c.span_id.to_bytes(8, "big")]
        if state:
            parts.append(w.field(b"\x1a", state.encode()))
        if parent is not None:
            parts.append(b"\x22\x08")
            parts.append(parent.span_id.to_bytes(8, "big"))
        parts.append(name)
        parts.append(_KIND_FIELD[self._kind])
        parts.append(_TIMES(0x39, self._start, 0x41, end))
        if self._attributes:
            parts.append(w.attributes(self._attributes))
        if self._events:
            parts.append(b"".join(
                w.field(_EVENT, b"\x09" + struct.pack("<Q", ts) + w.field(b"\x12", name.encode())
                        + b"".join(w.field(b"\x1a", w.key_value(k, v)) for k, v in attrs.items()))
                for name, ts, attrs in self._events))
        parts.append(self._links)
        parts.append(status_field)
        parts.append(_FLAGS_REMOTE_PARENT if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        body = b"".join(parts)
        return b"\x12" + w.varint(len(body)) + body


def _slice_key() -> bool:
    """Whether a SpanContext's first three items are (trace_id, span_id, is_remote), as the API builds it."""
    try:
        c = SpanContext(0x1234, 0x5678, True, TraceFlags(1))
        return type(c[:3]) is tuple and c[:3] == (c.trace_id, c.span_id, c.is_remote) == (0x1234, 0x5678, True)
    except Exception:
        return False


_SLICE_KEY = _slice_key()
_UNSET = Status(StatusCode.UNSET)
_EMPTY_STATUS = b"\x7a\x00"
_NAMES: dict[str, bytes] = {}  # a span name's field, encoded once
_KIND_FIELD = {kind: b"\x30" + w.varint(value) for kind, value in _KIND.items()}
_TIMES = struct.Struct("<BQBQ").pack
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_REMOTE_PARENT = b"\x85\x01" + struct.pack("<I", 0x100 | 0x200)  # ... and the parent is remote
