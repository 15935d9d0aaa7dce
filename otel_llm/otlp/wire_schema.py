"""The wire-level schema of ``ExportTraceServiceRequest``, from the installed descriptors: the tables of the
collector's one-pass C reader (``otel_llm_collector.fast.wire``), so it follows a newer opentelemetry-proto
without a change, and upb's nesting limit, measured on the installed parser.

``tables`` lists, per message type reachable from the request (the request first), each field as (number,
kind, submessage index, role, full name): the kind says which wire type the field expects and whether its
payload is checked (proto3 ``string``: UTF-8) or walked (a message); the role marks the fields the reader
returns (``ROLES``). A schema the C reader does not cover raises ``Unsupported``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from .messages import ExportTraceServiceRequest

__all__ = ["BYTES", "FIXED32", "FIXED64", "MESSAGE", "ROLES", "STRING", "VARINT", "Unsupported", "depth_limit",
           "tables"]

_FD = FieldDescriptor
# the C reader's kinds (otel_llm_collector/fast/_wire.c: K_VARINT ... K_FIXED32, same order)
VARINT, FIXED64, BYTES, STRING, MESSAGE, FIXED32 = range(6)
_KIND = {**dict.fromkeys((_FD.TYPE_INT32, _FD.TYPE_INT64, _FD.TYPE_UINT32, _FD.TYPE_UINT64, _FD.TYPE_SINT32,
                          _FD.TYPE_SINT64, _FD.TYPE_BOOL, _FD.TYPE_ENUM), VARINT),
         **dict.fromkeys((_FD.TYPE_FIXED64, _FD.TYPE_SFIXED64, _FD.TYPE_DOUBLE), FIXED64),
         **dict.fromkeys((_FD.TYPE_FIXED32, _FD.TYPE_SFIXED32, _FD.TYPE_FLOAT), FIXED32),
         _FD.TYPE_BYTES: BYTES, _FD.TYPE_STRING: STRING, _FD.TYPE_MESSAGE: MESSAGE}

# the fields the reader returns, in the order of otel_llm_collector/fast/_wire.c's R_RESOURCE_SPANS ... R_CODE
# (which message and field each is, and the kind the C code assumes for it: ``tables``'s ``where``)
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


def depth_limit() -> int:
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
