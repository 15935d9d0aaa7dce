"""OTLP trace protobuf, written byte by byte for the one shape that dominates full detail.

A decode-step span differs from its siblings only in its span id, its two timestamps and
two small integers. Building it as an SDK ``ReadableSpan`` and letting the SDK's Python
encoder turn it into protobuf objects repeats, span after span, the work that is the same for
all of them; writing its wire bytes from a per-request template pays only for what differs
(benchmarks/decode_detail.py, benchmarks/vllm_overhead.py). The bytes parse to the
same ``Span`` message the SDK's encoder makes from the same span (tests/otlp/test_otlp_wire.py).

Wire format reference: opentelemetry-proto ``trace/v1/trace.proto``, ``common/v1/common.proto``.
"""

from __future__ import annotations

import random
import struct
from typing import Any, Iterable, Mapping, Protocol, Sequence

from opentelemetry.trace import SpanContext

# field tags: (field number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32)
_TRACE_ID, _SPAN_ID, _TRACE_STATE, _PARENT, _NAME, _KIND = b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x2a", b"\x30"
_ATTRIBUTE, _LINK = b"\x4a", b"\x6a"
_LINK_FLAGS = b"\x35"  # Span.Link.flags, fixed32
_EMPTY_STATUS = b"\x7a\x00"  # the SDK always writes a Status, empty when unset
_FLAGS_LOCAL_PARENT = b"\x85\x01" + struct.pack("<I", 0x100)  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, not remote
_SPAN_KIND_INTERNAL = 1
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_TIMES = struct.Struct("<BQBQ")  # start (field 7) and end (field 8), fixed64 each
_ZERO_ID = bytes(8)


_ONE_BYTE = [bytes((i,)) for i in range(128)]


def varint(n: int) -> bytes:
    if 0 <= n < 128:  # lengths of small messages, step indices: the common case
        return _ONE_BYTE[n]
    if n < 0:
        n += 1 << 64  # int64 on the wire: two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def any_value(value: Any) -> bytes | None:
    """An ``AnyValue`` message body; None for types this encoder does not write."""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, str):
        return field(b"\x0a", value.encode())
    if isinstance(value, (tuple, list)):
        items = [any_value(v) for v in value]
        if any(i is None for i in items):
            return None
        return field(b"\x2a", b"".join(field(b"\x0a", i) for i in items))  # ArrayValue.values
    return None


def key_value(key: str, value: Any) -> bytes:
    body = any_value(value)
    if body is None:
        raise TypeError(f"attribute {key!r}: {type(value).__name__} values are not encoded here")
    return field(b"\x0a", key.encode()) + field(b"\x12", body)


_KEYS: dict[str, tuple[bytes, bytes, bytes]] = {}  # attribute names repeat on every span: see _key
_MAX_KEYS = 4096  # names are ours (semconv) and the user's few: bounded all the same
_DOUBLE = struct.Struct("<d").pack


def _key(k: str) -> tuple[bytes, bytes, bytes]:
    """An attribute name's ``KeyValue.key`` field, and the whole attribute's bytes up to the value for the two
    values whose length is fixed: a double (9 bytes: tag, 8) and an int below 128 (2 bytes: tag, one byte)."""
    kb = field(b"\x0a", k.encode())
    entry = (kb, _ATTRIBUTE + varint(len(kb) + 11) + kb + b"\x12\x09\x21",
             _ATTRIBUTE + varint(len(kb) + 4) + kb + b"\x12\x02\x18")
    if len(_KEYS) < _MAX_KEYS:
        _KEYS[k] = entry
    return entry


def attributes(attrs: Mapping[str, Any]) -> bytes:
    """``key_value`` for each attribute, byte for byte; the common types (exactly str, int, float, and arrays
    of them) and the encoded names written inline: full detail writes attributes on every span and many on
    a request's, and the generic path's calls were most of their cost."""
    out: list[bytes] = []
    append = out.append
    keys = _KEYS
    one = _ONE_BYTE
    for k, v in attrs.items():
        entry = keys.get(k)
        if entry is None:
            entry = _key(k)
        t = type(v)
        if t is float:
            append(entry[1])
            append(_DOUBLE(v))
            continue
        if t is int:
            if 0 <= v < 128:
                append(entry[2])
                append(one[v])
                continue
            body = b"\x18" + varint(v)
        elif t is str:
            b = v.encode()
            n = len(b)
            body = (b"\x0a" + one[n] if n < 128 else b"\x0a" + varint(n)) + b
        elif (t is tuple or t is list) and v:  # arrays, e.g. a request's bucket counts, finish reasons
            body = _array(v)
            if body is None:
                raise TypeError(f"attribute {k!r}: {t.__name__} values are not encoded here")
        else:  # bool (an int subclass), empty sequences, other subclasses: the generic path
            body = any_value(v)
            if body is None:
                raise TypeError(f"attribute {k!r}: {t.__name__} values are not encoded here")
        n = len(body)
        kv = entry[0] + b"\x12" + (one[n] if n < 128 else varint(n)) + body
        n = len(kv)
        append(_ATTRIBUTE + (one[n] if n < 128 else varint(n)) + kv)
    return b"".join(out)


def _array(values: Sequence[Any]) -> bytes | None:
    """``any_value`` of a non-empty tuple or list, byte for byte: items of exactly str, int or float written
    inline (each an ``ArrayValue.values`` entry: tag, length, the ``AnyValue`` body), others the generic way."""
    out = []
    for v in values:
        t = type(v)
        if t is int:
            if 0 <= v < 128:  # a bucket count, a small index: one-byte varint, body of 2 bytes
                out.append(_SMALL_INT_ITEMS[v])
                continue
            body = b"\x18" + varint(v)
        elif t is str:
            b = v.encode()
            body = b"\x0a" + varint(len(b)) + b
        elif t is float:
            out.append(_DOUBLE_ITEM + _DOUBLE(v))
            continue
        else:
            body = any_value(v)
            if body is None:
                return None
        out.append(b"\x0a" + varint(len(body)) + body)
    payload = b"".join(out)
    return b"\x2a" + varint(len(payload)) + payload


_SMALL_INT_ITEMS = [b"\x0a\x02\x18" + bytes((i,)) for i in range(128)]  # an ArrayValue entry of a small int
_DOUBLE_ITEM = b"\x0a\x09\x21"  # an ArrayValue entry of a double: tag, length 9, AnyValue.double_value tag


class IntAttribute:
    """One integer attribute's encoded bytes, cached per value (step indices repeat across requests)."""

    def __init__(self, key: str, cache_below: int = 4096) -> None:
        self._key = key
        self._cache: list[bytes | None] = [None] * cache_below

    def __call__(self, value: int) -> bytes:
        if 0 <= value < len(self._cache):
            hit = self._cache[value]
            if hit is None:
                hit = self._cache[value] = field(_ATTRIBUTE, key_value(self._key, value))
            return hit
        return field(_ATTRIBUTE, key_value(self._key, value))


class FloatAttribute:
    """One float attribute's encoded bytes: the key's bytes once, the value packed per call (exactly
    ``attributes({key: value})``; values other than a ``float`` take that generic path)."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._prefix = _key(key)[1]

    def __call__(self, value: float) -> bytes:
        if type(value) is float:
            return self._prefix + _DOUBLE(value)
        return attributes({self._key: value})


def span_ids(n: int) -> list[bytes]:
    """``n`` random non-zero 8-byte span ids, drawn in one call (as the SDK's RandomIdGenerator does, per id)."""
    raw = random.getrandbits(64 * n).to_bytes(8 * n, "big") if n else b""
    ids = [raw[i:i + 8] for i in range(0, 8 * n, 8)]
    for i, sid in enumerate(ids):
        while sid == _ZERO_ID:  # invalid as a span id; 2**-64 per id, but cheap to rule out
            sid = ids[i] = random.getrandbits(64).to_bytes(8, "big")
    return ids


def _flags(remote: bool) -> bytes:
    return struct.pack("<I", _HAS_IS_REMOTE | (_IS_REMOTE if remote else 0))


def link(context: SpanContext) -> bytes:
    """A ``Span.Link`` without attributes, as the SDK's encoder writes it (no trace state)."""
    body = (field(b"\x0a", context.trace_id.to_bytes(16, "big")) + field(b"\x12", context.span_id.to_bytes(8, "big"))
            + _LINK_FLAGS + _flags(context.is_remote))
    return field(_LINK, body)


class SiblingSpans:
    """Encodes INTERNAL spans that share a trace, a (local) parent and a name, e.g. one request's
    decode steps. Each ``encode`` returns one length-prefixed ``ScopeSpans.spans`` entry."""

    def __init__(self, parent: SpanContext, name: str) -> None:
        self._head = field(_TRACE_ID, parent.trace_id.to_bytes(16, "big")) + _SPAN_ID + b"\x08"
        state = parent.trace_state.to_header() if parent.trace_state else ""
        self._middle = ((field(_TRACE_STATE, state.encode()) if state else b"")
                        + field(_PARENT, parent.span_id.to_bytes(8, "big"))
                        + field(_NAME, name.encode()) + _KIND + bytes([_SPAN_KIND_INTERNAL]))

    def encode(self, span_id: bytes, start_ns: int, end_ns: int, attrs: bytes) -> bytes:
        body = b"".join((self._head, span_id, self._middle, _TIMES.pack(0x39, start_ns, 0x41, end_ns), attrs,
                         _EMPTY_STATUS, _FLAGS_LOCAL_PARENT))
        return b"\x12" + varint(len(body)) + body


# ExportTraceServiceRequest{1: ResourceSpans}; ResourceSpans{1: Resource, 2: ScopeSpans, 3: schema_url};
# ScopeSpans{1: InstrumentationScope, 2: Span, 3: schema_url}: the same three tags at each level
_F1, _F2, _F3 = b"\x0a", b"\x12", b"\x1a"


def _schema(url: str) -> bytes:
    return field(_F3, url.encode()) if url else b""


def _resource_spans(resource: bytes, scope_spans: Iterable[bytes], resource_tail: bytes) -> bytes:
    """One ``ExportTraceServiceRequest.resource_spans`` entry: the framed resource (``resource``), each
    ``ScopeSpans`` body, the schema URL (``resource_tail``). Requests concatenate these."""
    return field(_F1, resource + b"".join(field(_F2, body) for body in scope_spans) + resource_tail)


class RequestFrame:
    """The ``ExportTraceServiceRequest`` around encoded spans: one resource, one scope.

    Resource and scope come from the SDK's own encoder (once), so they are exactly what
    the SDK's exporter sends for the tracer's other spans and a backend groups them together.
    """

    def __init__(self, resource: bytes, resource_schema: str, scope: bytes, scope_schema: str) -> None:
        self._resource = field(_F1, resource)
        self._resource_tail = _schema(resource_schema)
        self._scope = field(_F1, scope)
        self._scope_tail = _schema(scope_schema)

    @classmethod
    def for_tracer(cls, resource: Any, scope: Any) -> "RequestFrame":
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace import ReadableSpan

        probe = ReadableSpan(name="probe", context=SpanContext(1, 1, False), resource=resource,
                             instrumentation_scope=scope)
        rs = encode_spans([probe]).resource_spans[0]
        ss = rs.scope_spans[0]
        return cls(rs.resource.SerializeToString(), rs.schema_url, ss.scope.SerializeToString(), ss.schema_url)

    def request(self, spans: Iterable[bytes] | Sequence[bytes]) -> bytes:
        """``spans``: ``ScopeSpans.spans`` entries, each framed (as ``SiblingSpans.encode`` returns them)."""
        return _resource_spans(self._resource, (self._scope + b"".join(spans) + self._scope_tail,),
                               self._resource_tail)


class SpanGroup(Protocol):
    """Where a received span came from (the collector's ``spans.Group``): encoded resource and scope."""

    resource: tuple[bytes, str]  # (encoded Resource, ResourceSpans.schema_url)
    scope: tuple[bytes, str]  # (encoded InstrumentationScope, ScopeSpans.schema_url)


_SMALL: list[bytes] = []  # varints below 16 KiB (span lengths), built on the first ``encode_request``


def encode_request(items: Iterable[tuple[SpanGroup, bytes]]) -> bytes:
    """An encoded ``ExportTraceServiceRequest`` of (group, encoded span) items, regrouped by resource and
    scope (schema URLs included), each span framed as received: the collector's export path."""
    small = _SMALL or _SMALL.extend(varint(i) for i in range(1 << 14)) or _SMALL
    tree: dict[tuple[bytes, str], dict[tuple[bytes, str], list[bytes]]] = {}
    for group, raw in items:
        scopes = tree.get(group.resource)
        if scopes is None:
            scopes = tree[group.resource] = {}
        spans = scopes.get(group.scope)
        if spans is None:
            spans = scopes[group.scope] = []
        n = len(raw)
        spans.append(_F2)
        spans.append(small[n] if n < 16384 else varint(n))
        spans.append(raw)
    return b"".join(
        _resource_spans(field(_F1, resource), [field(_F1, scope) + b"".join(framed) + _schema(scope_schema)
                                               for (scope, scope_schema), framed in scopes.items()],
                        _schema(resource_schema))
        for (resource, resource_schema), scopes in tree.items())
