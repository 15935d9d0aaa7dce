"""OTLP receivers (gRPC and HTTP). Both hand a parsed request to one ``Ingest`` callable."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from otel_llm.otlp.messages import ExportTraceServiceRequest
from otel_llm.otlp.signals import LOGS_SERVICE, METRICS_SERVICE


REFUSED_MESSAGE = ("spans with an invalid trace id (16 bytes, not all zero), span id (8 bytes, not all zero) "
                   "or parent span id (empty or 8 bytes) were refused")


class Ingest(Protocol):
    """(request, transport, its protobuf bytes as received if any, the peer that sent it) -> number of spans
    refused (partial success).

    The request is validated: what ``Parse`` returned for a protobuf body (the gateway's one-pass reading, or a
    request parsed by the full OTLP classes), or an OTLP/JSON request; ``raw`` spares the gateway encoding it again."""

    def __call__(self, request: ExportTraceServiceRequest | Any, transport: str, raw: bytes | None = None,
                 peer: Any = None) -> int: ...


class SignalIngest(Protocol):
    """(an encoded ExportMetricsServiceRequest or ExportLogsServiceRequest, transport, the peer) ->
    (points or records refused, why): the gateway's metrics and logs pipelines. ``MalformedRequest``: refused."""

    def __call__(self, raw: bytes, transport: str, peer: Any = None) -> tuple[int, str]: ...


# the standard OTLP/HTTP paths and OTLP/gRPC services of the other signals (traces: ``PATH``, ``SERVICE``)
SIGNAL_PATHS = {"/v1/metrics": "metrics", "/v1/logs": "logs"}
SIGNAL_SERVICES = {"metrics": METRICS_SERVICE, "logs": LOGS_SERVICE}

# a protobuf body -> what ``Ingest`` takes; ``messages.MalformedRequest`` (with the reason) when it is refused
Parse = Callable[[bytes], Any]
