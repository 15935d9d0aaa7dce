"""Builders shared by the collector tests: a fake clock, OTLP spans and requests, loopback configs."""

from __future__ import annotations

import time
from typing import Any, Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm import semconv as sc
from otel_llm_collector.config import CollectorConfig


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def any_value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[any_value(x) for x in v]))
    return AnyValue(string_value=str(v))


def span(trace: int, span_id: int, parent: int = 0, name: str = "s", attrs: dict | None = None,
         error: bool = False, start: int = 1_000_000_000, end: int = 2_000_000_000) -> Span:
    s = Span(trace_id=trace.to_bytes(16, "big"), span_id=span_id.to_bytes(8, "big"), name=name,
             start_time_unix_nano=start, end_time_unix_nano=end)
    if parent:
        s.parent_span_id = parent.to_bytes(8, "big")
    for k, v in (attrs or {}).items():
        s.attributes.append(KeyValue(key=k, value=any_value(v)))
    if error:
        s.status.code = Status.STATUS_CODE_ERROR
    return s


def request_attrs(model: str = "m", ttft: float = 0.1, tpot: float = 0.01, e2e: float = 1.0, **extra: Any) -> dict:
    a = {sc.OPERATION_NAME: "text_completion", sc.PROVIDER_NAME: "vllm", sc.REQUEST_MODEL: model,
         sc.LATENCY_TTFT: ttft, sc.LATENCY_TPOT: tpot, sc.LATENCY_E2E: e2e,
         sc.USAGE_INPUT_TOKENS: 10, sc.USAGE_OUTPUT_TOKENS: 20}
    a.update(extra)
    return a


def export_request(*spans: Span, service: str = "svc") -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
    ss = rs.scope_spans.add()
    ss.scope.name = "test"
    ss.spans.extend(spans)
    return req


def loopback_config(**over: Any) -> CollectorConfig:
    raw: dict[str, Any] = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                             "http": {"endpoint": "127.0.0.1:0"}}}},
        "exporters": {"prometheus": {"endpoint": "127.0.0.1:0"}},
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return CollectorConfig.from_mapping(raw)


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``cond`` until true (a bounded wait for something the gateway does on its own threads)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()
