"""OTLP receivers (gRPC and HTTP). Both hand a parsed request to one ``Ingest`` callable."""

from __future__ import annotations

from typing import Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

# (request, transport) -> number of spans refused (partial success)
Ingest = Callable[[ExportTraceServiceRequest, str], int]
