"""The OTLP metrics and logs services' requests, as the collector's receivers take them.

Parsed here (like the trace service's in ``messages``), so nothing outside this package decodes OTLP: bytes
that are not a request are refused with the parser's reason (``MalformedRequest``).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from .messages import MalformedRequest

__all__ = ["METRICS_SERVICE", "LOGS_SERVICE", "ExportMetricsServiceRequest", "ExportLogsServiceRequest",
           "parse_metrics_request", "parse_logs_request", "metric_point_count", "log_record_count"]

METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


def _parse(cls: type, raw: bytes):
    request = cls()
    try:
        request.ParseFromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise MalformedRequest(f"malformed {cls.__name__}: {exc or 'cannot decode protobuf'}") from None
    return request


def parse_metrics_request(raw: bytes) -> ExportMetricsServiceRequest:
    return _parse(ExportMetricsServiceRequest, raw)


def parse_logs_request(raw: bytes) -> ExportLogsServiceRequest:
    return _parse(ExportLogsServiceRequest, raw)


def metric_point_count(request: ExportMetricsServiceRequest) -> int:
    n = 0
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                which = m.WhichOneof("data")
                n += len(getattr(m, which).data_points) if which else 0
    return n


def log_record_count(request: ExportLogsServiceRequest) -> int:
    return sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
