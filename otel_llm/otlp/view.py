"""A reading view of an OTLP export request: the spans as their received bytes, attributes as a map of encoded values.

The receive path needs, per span, its encoded bytes (that is what is buffered and exported), a
few scalar fields, and - for request spans only - some attribute values. Reading those through
the full OTLP classes costs a Python wrapper per ``KeyValue`` and ``AnyValue`` (for every
attribute, read or not) plus re-encoding every span (benchmarks/collector_throughput.py, ingest). These messages are wire-compatible stand-ins built at
import time (no generated code): ``ScopeSpans.spans`` is ``repeated bytes`` (each span's bytes as
received), ``Span`` declares only the fields read here (the rest stays unknown, untouched), and
``Span.attributes`` is ``map<string, bytes>``: a ``KeyValue`` {1: key, 2: AnyValue} is exactly a
map entry, so upb builds the key -> encoded ``AnyValue`` dict in C (a repeated key: the last wins,
as when building a dict). ``value_of`` decodes one value as ``any_value`` does from the full class.

This view only reads what was validated: by the full OTLP classes (``messages.parse_request``) on the
collector's two-pass fallback, or by its one-pass C reader (``otel_llm_collector.fast._wire``), which reads
the same values as these types and is tested against them.
"""

from __future__ import annotations

import re
import struct
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from .. import semconv as sc

_F = descriptor_pb2.FieldDescriptorProto
_PKG = "otel_llm.otlp.view"


def _build() -> descriptor_pool.DescriptorPool:
    fd = descriptor_pb2.FileDescriptorProto(name="otel_llm_otlp_view.proto", package=_PKG, syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, bool, str]],
                parent: Any = None) -> descriptor_pb2.DescriptorProto:
        m = (parent.nested_type if parent is not None else fd.message_type).add(name=name)
        for fname, number, ftype, repeated, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype,
                            label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = f".{_PKG}.{type_name}"
        return m

    # field numbers and wire types as in opentelemetry/proto/trace/v1/trace.proto
    message("Status", [("code", 3, _F.TYPE_INT32, False, "")])  # an enum on the wire is a varint, as int32
    span = message("Span", [
        ("trace_id", 1, _F.TYPE_BYTES, False, ""),
        ("span_id", 2, _F.TYPE_BYTES, False, ""),
        ("parent_span_id", 4, _F.TYPE_BYTES, False, ""),
        ("kind", 6, _F.TYPE_INT32, False, ""),
        ("start_time_unix_nano", 7, _F.TYPE_FIXED64, False, ""),
        ("end_time_unix_nano", 8, _F.TYPE_FIXED64, False, ""),
        ("attributes", 9, _F.TYPE_MESSAGE, True, "Span.AttributesEntry"),
        ("status", 15, _F.TYPE_BYTES, False, ""),  # encoded; read (StatusView) only when not empty
    ])
    entry = message("AttributesEntry", [("key", 1, _F.TYPE_STRING, False, ""), ("value", 2, _F.TYPE_BYTES, False, "")],
                    parent=span)
    entry.options.map_entry = True
    message("ScopeSpans", [("scope", 1, _F.TYPE_BYTES, False, ""), ("spans", 2, _F.TYPE_BYTES, True, ""),
                           ("schema_url", 3, _F.TYPE_STRING, False, "")])
    message("ResourceSpans", [("resource", 1, _F.TYPE_BYTES, False, ""),
                              ("scope_spans", 2, _F.TYPE_MESSAGE, True, "ScopeSpans"),
                              ("schema_url", 3, _F.TYPE_STRING, False, "")])
    message("ExportTraceServiceRequest", [("resource_spans", 1, _F.TYPE_MESSAGE, True, "ResourceSpans")])
    message("Varints", [("values", 1, _F.TYPE_UINT64, True, "")])  # packed: a run of varints read in C
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return pool


_POOL = _build()
RequestView = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PKG}.ExportTraceServiceRequest"))
SpanView = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PKG}.Span"))
StatusView = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PKG}.Status"))
_Varints = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PKG}.Varints"))

_SCALAR = frozenset(("string_value", "int_value", "double_value", "bool_value", "bytes_value"))
_DOUBLE = struct.Struct("<d").unpack_from
_CACHE_MAX = 4096
_CACHE_VALUE_MAX = 1024  # bytes: longer values are decoded each time, never remembered


def any_value(v: AnyValue) -> Any:
    """A full-class ``AnyValue``'s value: scalars as Python values, arrays as tuples, kvlist/empty as None."""
    kind = v.WhichOneof("value")
    if kind in _SCALAR:
        return getattr(v, kind)
    if kind == "array_value":
        return tuple(any_value(x) for x in v.array_value.values)
    return None  # kvlist / empty: nothing a processor reads


def _cached(convert: Any) -> Any:
    """``convert`` of an encoded ``AnyValue``'s value, remembered by encoded value (model names,
    providers, token counts, finish reasons repeat); at most ``_CACHE_MAX`` values of at most
    ``_CACHE_VALUE_MAX`` bytes remembered, then forgotten whole."""
    cache: dict[bytes, Any] = {}

    def decode(encoded: bytes) -> Any:
        try:
            return cache[encoded]
        except KeyError:
            pass
        value = convert(any_value(AnyValue.FromString(encoded)))  # the full class
        if len(encoded) > _CACHE_VALUE_MAX:  # a client-chosen 1 MB model name must not stay in memory
            return value
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[encoded] = value
        return value
    return decode


_any_cached = _cached(lambda value: value)


def value_of(encoded: bytes) -> Any:
    """The value of an encoded ``AnyValue``: what ``any_value`` reads from the full class."""
    if len(encoded) == 9 and encoded[0] == 0x21:  # only field 4 (double_value, fixed64): latencies, never repeat
        return _DOUBLE(encoded, 1)[0]
    return _any_cached(encoded)


STATUS_CODE_ERROR = Status.STATUS_CODE_ERROR
SPAN_KIND_CLIENT = Span.SPAN_KIND_CLIENT
SERVICE_NAME = sc.SERVICE_NAME


def is_error(status: bytes) -> bool:
    """Whether an encoded (non-empty) ``Status`` says ERROR."""
    return StatusView.FromString(status).code == STATUS_CODE_ERROR


def read_resource(encoded: bytes, keys: frozenset[str] = frozenset()) -> tuple[str, list[tuple[str, Any]]]:
    """An encoded ``Resource``'s ``service.name`` (``unknown_service`` if none) and its attributes among ``keys``."""
    resource = Resource.FromString(encoded)
    service = "unknown_service"
    for kv in resource.attributes:
        if kv.key == SERVICE_NAME:
            service = kv.value.string_value or "unknown_service"
            break
    values = [(kv.key, any_value(kv.value)) for kv in resource.attributes if kv.key in keys] if keys else []
    return service, values


@lru_cache(maxsize=256)  # once per distinct scope: exporters send the same few
def scope_name(encoded: bytes) -> str:
    """An encoded ``InstrumentationScope``'s name ("" when it has none or cannot be read)."""
    try:
        return InstrumentationScope.FromString(encoded).name
    except Exception:  # a malformed scope costs only its name (the spans were validated already)
        return ""


def rejoin_span(encoded: bytes, joined: Mapping[bytes, tuple[bytes, bytes, bytes]]) -> tuple[bytes, bytes, bool] | None:
    """``encoded`` moved into the traces ``joined`` maps trace ids to (new trace id, new parent of the root, the
    root's span id): its trace id, its parent when it is that root, and its links' trace ids. None when nothing
    moved; else the re-encoded span, its trace id and whether it now has a parent (the gateway's trace join)."""
    span = Span.FromString(encoded)
    changed = False
    to = joined.get(span.trace_id)
    if to is not None:
        trace_id, parent, root = to
        span.trace_id = trace_id
        if span.span_id == root and not span.parent_span_id:
            span.parent_span_id = parent
        changed = True
    for link in span.links:
        target = joined.get(link.trace_id)
        if target is not None:
            link.trace_id = target[0]
            changed = True
    if not changed:
        return None
    return span.SerializeToString(), span.trace_id, bool(span.parent_span_id)


def decode_spans(encoded: Iterable[bytes]) -> list[Span]:
    """Encoded spans as full ``Span`` messages (tests and debugging, not the hot path)."""
    return [Span.FromString(raw) for raw in encoded]


# -- typed decoders for the collector's summary reader: each equals ``converters[kind](value_of(encoded))`` ---

def float_of(convert: Callable[[Any], Any]) -> Callable[[bytes], Any]:
    def decode(encoded: bytes) -> Any:
        if len(encoded) == 9 and encoded[0] == 0x21:  # double_value: what latencies are
            return _DOUBLE(encoded, 1)[0]
        return convert(value_of(encoded))
    return decode


def int_of(convert: Callable[[Any], Any]) -> Callable[[bytes], Any]:
    def decode(encoded: bytes) -> Any:
        n = len(encoded)
        if n == 2 and encoded[0] == 0x18:  # int_value (field 3, varint) below 128: one byte
            return encoded[1]
        if n == 3 and encoded[0] == 0x18:  # below 16384: two bytes (a validated varint ends at its last byte)
            return (encoded[1] & 0x7F) | (encoded[2] << 7)
        return convert(value_of(encoded))
    return decode


def counts_of(convert: Callable[[Any], Any]) -> Callable[[bytes], Any]:
    """An array of small non-negative ints (a request's inter-token bucket counts) read off the bytes: an
    ``array_value`` (field 5) of ``AnyValue``s that each hold only ``int_value`` (field 3) below 16384.
    Anything else, or a count that needs more bytes, goes through the full class, which builds a Python object
    per element and costs many times these paths (benchmarks/collector_throughput.py, inter_token).
    The bytes were validated by the receive path's full parse, so a varint's length says its range; such
    a tuple is what ``convert`` returns for it (non-negative ints), so the fast paths return it as is."""
    # width -> the bytes an array of one-byte counts has at offsets 0, 1, 2 of each 4-byte element
    patterns = {w: b"\x0a" * w + b"\x02" * w + b"\x18" * w for w in range(1, 64)}
    # otherwise: elements of 0x0a, length 2 or 3, 0x18 (int_value), a one- or two-byte varint; checked whole
    # in C, then each element's three header bytes cut out (a header cannot start inside a varint: a varint
    # byte 0x0a is followed by the next element's 0x0a, never by 0x02 or 0x03), and the varints read as one
    # packed field by the protobuf parser
    whole = re.compile(rb"(?:\x0a\x02\x18[\x00-\x7f]|\x0a\x03\x18[\x80-\xff][\x00-\x7f])+", re.S).fullmatch
    headers = re.compile(rb"\x0a[\x02\x03]\x18").sub

    def decode(encoded: bytes) -> Any:
        n = len(encoded)
        if n < 6 or encoded[0] != 0x2A or encoded[1] != n - 2:  # one-byte length (< 128) only
            return convert(value_of(encoded))
        body = encoded[2:]
        width = (n - 2) >> 2
        if (n - 2) & 3 == 0 and body[0::4] + body[1::4] + body[2::4] == patterns.get(width):
            return tuple(body[3::4])  # every count below 128: four bytes each, sliced in C
        if not whole(body):  # some element is not a one- or two-byte int_value
            return convert(value_of(encoded))
        varints = headers(b"", body)  # what is left: the counts' varints, back to back (<= 2 bytes each)
        return tuple(_Varints.FromString(b"\x0a" + bytes((len(varints),)) + varints).values)
    return decode


def typed_decoders(converters: Mapping[str, Callable[[Any], Any]]) -> dict[str, Callable[[bytes], Any]]:
    """Decoders by kind (``float``, ``int``, ``str``, ``first``, ``counts``) for values ``converters`` turn
    into a field: fast paths on the raw bytes for numbers and counts, remembered results for the rest."""
    return {"float": float_of(converters["float"]), "int": int_of(converters["int"]),
            "str": _cached(converters["str"]), "first": _cached(converters["first"]),
            "counts": counts_of(converters["counts"])}
