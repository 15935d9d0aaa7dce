"""The OTLP trace service's messages as the collector's receivers and senders use them.

Requests are validated here (the full OTLP classes parse them: malformed bytes are refused with
the parser's reason); responses, ``partial_success`` and the ``google.rpc.Status`` error bodies are
built and read here. JSON bodies go through ``json_codec`` (hex ids).
"""

from __future__ import annotations

import json

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTracePartialSuccess,
                                                                     ExportTraceServiceRequest,
                                                                     ExportTraceServiceResponse)

from .json_codec import to_dict

__all__ = ["SERVICE", "EXPORT_METHOD", "ExportTraceServiceRequest", "MalformedRequest", "parse_request",
           "response", "read_response", "read_json_response", "error_status", "span_count"]

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
EXPORT_METHOD = f"/{SERVICE}/Export"


class MalformedRequest(ValueError):
    """Bytes that are not an ``ExportTraceServiceRequest``; the message says why."""


def parse_request(raw: bytes) -> ExportTraceServiceRequest:
    """Validate (and parse) an encoded export request; ``MalformedRequest`` with the parser's reason."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise MalformedRequest(f"malformed ExportTraceServiceRequest: {exc or 'cannot decode protobuf'}") from None
    return request


def response(rejected: int = 0, message: str = "", as_json: bool = False) -> bytes:
    """An ``ExportTraceServiceResponse``; with ``rejected`` spans it carries a ``partial_success``."""
    out = ExportTraceServiceResponse()
    if rejected:
        out.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=rejected, error_message=message))
    return json.dumps(to_dict(out)).encode() if as_json else out.SerializeToString()


def read_response(body: bytes) -> tuple[int, str]:
    """(spans the backend refused, its message) from a protobuf ``ExportTraceServiceResponse``
    (garbage raises one of ``RESPONSE_ERRORS``)."""
    ps = ExportTraceServiceResponse.FromString(body).partial_success
    return (max(0, ps.rejected_spans), ps.error_message) if ps.rejected_spans else (0, "")


def read_json_response(body: bytes) -> tuple[int, str]:
    """The same from an OTLP/JSON response body."""
    ps = (json.loads(body) or {}).get("partialSuccess") or {}
    n = int(ps.get("rejectedSpans") or 0)
    return (max(0, n), str(ps.get("errorMessage") or "")) if n else (0, "")


RESPONSE_ERRORS = (ValueError, TypeError, AttributeError, DecodeError)  # what the two readers raise on garbage


def error_status(code: int, message: str, as_json: bool = False) -> bytes:
    """A ``google.rpc.Status`` body (an OTLP/HTTP error reply), protobuf or JSON."""
    from google.rpc.status_pb2 import Status

    status = Status(code=code, message=message)
    return json.dumps(to_dict(status)).encode() if as_json else status.SerializeToString()


def span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
