"""The one-pass receive path: ``_wire`` (C) validates an encoded export request and builds what ``spans.extract``
reads, in one pass.

The C validator's tables are derived here, at import, from the installed descriptors
(``ExportTraceServiceRequest.DESCRIPTOR`` and every message type under it: field number, the wire type it
expects, proto3 ``string`` (UTF-8 checked) or ``bytes``, submessage), and the nesting limit is measured on the
installed upb parser; so a newer opentelemetry-proto or protobuf is followed without a change here. A schema
the C code does not cover (packed repeated scalars, groups, proto2 or editions files) or a missing build makes
``AVAILABLE`` false, with ``REASON`` saying why, and the receivers keep the two-pass path
(``messages.parse_request`` then ``otel_llm.otlp.view``). ``OTEL_LLM_COLLECTOR_ONE_PASS=0`` forces that path.

``read(raw, wanted)`` returns, per ``ResourceSpans``: (encoded resource, schema_url, [(encoded scope,
schema_url, [span, ...]), ...]), a span being (its bytes as received, trace_id, span_id, parent_span_id, kind,
start, end, status is ERROR, {attribute key: encoded AnyValue} for the keys in ``wanted`` or None when it has
none of them). The values are what the view's types read (last occurrence of a bytes or string field, kind as
an int32, last occurrence of a repeated attribute key).
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from otel_llm.otlp.messages import ExportTraceServiceRequest, MalformedRequest

__all__ = ["AVAILABLE", "REASON", "Unsupported", "read", "tables"]

_FD = FieldDescriptor
# the C code's kinds (fast/_wire.c: K_VARINT ... K_FIXED32)
VARINT, FIXED64, BYTES, STRING, MESSAGE, FIXED32 = range(6)
_KIND = {**dict.fromkeys((_FD.TYPE_INT32, _FD.TYPE_INT64, _FD.TYPE_UINT32, _FD.TYPE_UINT64, _FD.TYPE_SINT32,
                          _FD.TYPE_SINT64, _FD.TYPE_BOOL, _FD.TYPE_ENUM), VARINT),
         **dict.fromkeys((_FD.TYPE_FIXED64, _FD.TYPE_SFIXED64, _FD.TYPE_DOUBLE), FIXED64),
         **dict.fromkeys((_FD.TYPE_FIXED32, _FD.TYPE_SFIXED32, _FD.TYPE_FLOAT), FIXED32),
         _FD.TYPE_BYTES: BYTES, _FD.TYPE_STRING: STRING, _FD.TYPE_MESSAGE: MESSAGE}

# what extraction reads (fast/_wire.c: R_RESOURCE_SPANS ... R_CODE), as (message role, field name, kind);
# the message a role's field belongs to is the submessage of the role before it in this walk
ROLES = ("resource_spans", "resource", "scope_spans", "rs_schema_url", "scope", "spans", "ss_schema_url",
         "trace_id", "span_id", "parent_span_id", "kind", "start_time_unix_nano", "end_time_unix_nano",
         "attributes", "status", "key", "value", "code")
_ROLE = {name: i + 1 for i, name in enumerate(ROLES)}


class Unsupported(Exception):
    """A schema the C validator does not cover (the two-pass path is used)."""


@lru_cache(maxsize=None)
def _syntax(file: Any) -> str:
    return descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb).syntax


def tables(root: Descriptor) -> list[list[tuple[int, int, int, int, str]]]:
    """Per message type reachable from ``root`` (``root`` first): (number, kind, submessage index, role, name)."""
    order: list[Descriptor] = [root]
    index = {root.full_name: 0}
    out: list[list[tuple[int, int, int, int, str]]] = []
    # the role each field plays, by (message full name, field name): found by walking the names in ROLES
    req = root
    rs = req.fields_by_name["resource_spans"].message_type
    ss = rs.fields_by_name["scope_spans"].message_type
    span = ss.fields_by_name["spans"].message_type
    kv = span.fields_by_name["attributes"].message_type
    status = span.fields_by_name["status"].message_type
    where = {"resource_spans": (req, "resource_spans", MESSAGE), "resource": (rs, "resource", MESSAGE),
             "scope_spans": (rs, "scope_spans", MESSAGE), "rs_schema_url": (rs, "schema_url", STRING),
             "scope": (ss, "scope", MESSAGE), "spans": (ss, "spans", MESSAGE),
             "ss_schema_url": (ss, "schema_url", STRING), "trace_id": (span, "trace_id", BYTES),
             "span_id": (span, "span_id", BYTES), "parent_span_id": (span, "parent_span_id", BYTES),
             "kind": (span, "kind", VARINT), "start_time_unix_nano": (span, "start_time_unix_nano", FIXED64),
             "end_time_unix_nano": (span, "end_time_unix_nano", FIXED64), "attributes": (span, "attributes", MESSAGE),
             "status": (span, "status", MESSAGE), "key": (kv, "key", STRING), "value": (kv, "value", MESSAGE),
             "code": (status, "code", VARINT)}
    roles = {(m.full_name, name): (_ROLE[role], kind) for role, (m, name, kind) in where.items()}
    i = 0
    while i < len(order):
        m = order[i]
        if _syntax(m.file) != "proto3":
            raise Unsupported(f"{m.full_name}: not a proto3 file")
        fields = []
        for f in m.fields:
            kind = _KIND.get(f.type)
            if kind is None:
                raise Unsupported(f"{f.full_name}: field type {f.type}")
            if f.is_repeated and kind not in (BYTES, STRING, MESSAGE):
                raise Unsupported(f"{f.full_name}: repeated scalar (packed encoding not handled)")
            sub = -1
            if kind == MESSAGE:
                t = f.message_type
                if t.full_name not in index:
                    index[t.full_name] = len(order)
                    order.append(t)
                sub = index[t.full_name]
            role, expected = roles.pop((m.full_name, f.name), (0, kind))
            if expected != kind:
                raise Unsupported(f"{f.full_name}: kind {kind}, expected {expected}")
            fields.append((f.number, kind, sub, role, f.full_name))
        out.append(fields)
        i += 1
    if roles:
        raise Unsupported(f"fields not found: {sorted(roles)}")
    return out


def _depth_limit() -> int:
    """upb's nesting limit, measured: the deepest run of nested (unknown) groups the installed parser accepts
    (a group and a submessage each count one level; tests check both kinds around the boundary)."""
    def accepted(n: int) -> bool:
        try:
            ExportTraceServiceRequest.FromString(b"\x2b" * n + b"\x2c" * n)  # field 5: start/end group
            return True
        except Exception:  # noqa: BLE001 - DecodeError (or RecursionError): refused
            return False
    lo, hi = 1, 4096  # accepted(lo); not accepted(hi)
    if not accepted(lo) or accepted(hi):
        raise Unsupported("cannot measure the parser's nesting limit")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accepted(mid) else (lo, mid)
    return lo


_TABLES: list | None = None
LIMIT = 0
try:
    if os.environ.get("OTEL_LLM_COLLECTOR_ONE_PASS", "1").strip().lower() in ("0", "false", "no", "off"):
        raise Unsupported("OTEL_LLM_COLLECTOR_ONE_PASS=0")
    if sys.byteorder != "little":
        raise Unsupported("big-endian machine (the C code reads fixed64 in place)")
    from . import _wire  # noqa: E402 - built by setup.py (optional: no compiler, no extension)
    _TABLES = tables(ExportTraceServiceRequest.DESCRIPTOR)
    LIMIT = _depth_limit()
    REASON = ""
except ImportError as exc:
    REASON = f"the C extension is not built ({exc})"
except Unsupported as exc:
    REASON = str(exc)
AVAILABLE = not REASON


@lru_cache(maxsize=16)  # one per key set: the gateway's is fixed
def schema(wanted: frozenset[str] | None) -> Any:
    """The compiled tables keeping the attribute keys in ``wanted`` (None: every key)."""
    return _wire.compile(_TABLES, None if wanted is None else sorted(wanted), LIMIT)


def read(raw: bytes, wanted: frozenset[str] | None) -> list:
    """``raw`` validated and read in one pass; ``MalformedRequest`` with the reason if upb would refuse it."""
    try:
        return _wire.read(schema(wanted), raw)
    except ValueError as exc:
        raise MalformedRequest(f"malformed ExportTraceServiceRequest: {exc}") from None

