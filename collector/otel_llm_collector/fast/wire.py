"""The one-pass receive path: ``_wire`` (C) validates an encoded export request and builds what ``spans.extract``
reads, in one pass.

The C validator's tables are derived at import (``otel_llm.otlp.wire_schema``) from the installed descriptors
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

from otel_llm.otlp.messages import ExportTraceServiceRequest, MalformedRequest
from otel_llm.otlp.wire_schema import Unsupported, depth_limit, tables

__all__ = ["AVAILABLE", "REASON", "Unsupported", "read", "tables"]

_TABLES: list | None = None
LIMIT = 0
try:
    if os.environ.get("OTEL_LLM_COLLECTOR_ONE_PASS", "1").strip().lower() in ("0", "false", "no", "off"):
        raise Unsupported("OTEL_LLM_COLLECTOR_ONE_PASS=0")
    if sys.byteorder != "little":
        raise Unsupported("big-endian machine (the C code reads fixed64 in place)")
    from . import _wire  # noqa: E402 - built by setup.py (optional: no compiler, no extension)
    _TABLES = tables(ExportTraceServiceRequest.DESCRIPTOR)
    LIMIT = depth_limit()
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

