"""OTLP/JSON <-> protobuf, with the spec's hex trace and span ids.

OTLP/JSON encodes ``traceId``/``spanId``/``parentSpanId`` as hex, where protobuf's JSON
mapping expects base64 for ``bytes``; plain ``json_format.Parse`` would silently produce
wrong ids. We swap the encodings on the id fields only, then use ``json_format``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


class OtlpJsonError(ValueError):
    pass


def _walk_ids(spans: Any, convert) -> None:
    if not isinstance(spans, list):
        return
    for span in spans:
        if not isinstance(span, dict):
            continue
        for key in _ID_KEYS:
            if isinstance(span.get(key), str):
                span[key] = convert(span[key], key)
        links = span.get("links")
        for link in links if isinstance(links, list) else ():
            if isinstance(link, dict):
                for key in ("traceId", "spanId"):
                    if isinstance(link.get(key), str):
                        link[key] = convert(link[key], key)


def _each_span_list(doc: Any):
    if not isinstance(doc, dict):
        raise OtlpJsonError("OTLP/JSON body must be an object with resourceSpans")
    # only walk well-formed parts; json_format reports the malformed ones with a reason
    resource_spans = doc.get("resourceSpans")
    for rs in resource_spans if isinstance(resource_spans, list) else ():
        scope_spans = rs.get("scopeSpans") if isinstance(rs, dict) else None
        for ss in scope_spans if isinstance(scope_spans, list) else ():
            if isinstance(ss, dict):
                yield ss.get("spans")


def _hex_to_b64(value: str, key: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    except ValueError:
        raise OtlpJsonError(f"{key} must be hex, got {value[:40]!r}") from None


def _b64_to_hex(value: str, key: str) -> str:
    try:
        return base64.b64decode(value).hex()
    except (binascii.Error, ValueError):
        return value


def parse_request(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON trace export body; raises ``OtlpJsonError`` with the reason."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise OtlpJsonError(f"malformed JSON: {exc}") from None
    for spans in _each_span_list(doc):
        _walk_ids(spans, _hex_to_b64)
    try:
        return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, RecursionError) as exc:
        raise OtlpJsonError(f"not an OTLP trace export: {exc}") from None


def to_dict(message: Any) -> dict:
    """A message as OTLP/JSON (hex ids, lowerCamelCase keys, enums as integers)."""
    doc = json_format.MessageToDict(message, use_integers_for_enums=True)
    if "resourceSpans" in doc:
        for spans in _each_span_list(doc):
            _walk_ids(spans, _b64_to_hex)
    return doc


def dumps(message: Any) -> str:
    return json.dumps(to_dict(message), separators=(",", ":"))
