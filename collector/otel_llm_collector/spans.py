"""What the processors read from one OTLP span, extracted once per span on the receive path.

Attributes are decoded into a dict only for spans that carry request latencies (ours or
the engines' native ones); every other span costs a scan of its attribute keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.core import semconv as sc
from otel_llm.core.summary import RequestSummary

# keys whose presence marks a request span (see RequestSummary.from_attributes)
_TRIGGERS = frozenset((sc.LATENCY_E2E, sc.LATENCY_TTFT, sc.VLLM_TTFT, sc.VLLM_E2E))
SERVICE_NAME = "service.name"
_ERROR = Status.STATUS_CODE_ERROR


def any_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return tuple(any_value(x) for x in v.array_value.values)
    if kind == "bytes_value":
        return v.bytes_value
    return None  # kvlist / empty: nothing a processor reads


def attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def service_name(resource: Resource) -> str:
    for kv in resource.attributes:
        if kv.key == SERVICE_NAME:
            return kv.value.string_value or "unknown_service"
    return "unknown_service"


@dataclass(slots=True)
class SpanFacts:
    """One received span and what sampling and metrics need from it."""

    resource: Resource
    scope: InstrumentationScope
    span: Span
    service: str
    summary: RequestSummary | None
    source: str | None  # "otel_llm" (our llm.latency.*) or "native" (vLLM / TensorRT-LLM llm_request)
    reason: str | None  # llm.sampling.reason recorded by the SDK
    error: bool
    root: bool


def request_summary(span: Span) -> tuple[RequestSummary | None, str | None, str | None]:
    """(summary, source, recorded sampling reason) of a request span; Nones for any other span."""
    for kv in span.attributes:
        if kv.key in _TRIGGERS:
            attrs = attributes(span.attributes)
            reason = attrs.get(sc.SAMPLING_REASON)
            source = "otel_llm" if sc.LATENCY_E2E in attrs or sc.LATENCY_TTFT in attrs else "native"
            return RequestSummary.from_attributes(attrs), source, reason if isinstance(reason, str) else None
    return None, None, None


def extract(request: ExportTraceServiceRequest) -> tuple[list[SpanFacts], int]:
    """Every span with a valid (16-byte) trace id and its facts; returns (facts, rejected span count)."""
    out: list[SpanFacts] = []
    rejected = 0
    for rs in request.resource_spans:
        resource = rs.resource
        service = service_name(resource)
        for ss in rs.scope_spans:
            scope = ss.scope
            for span in ss.spans:
                if len(span.trace_id) != 16 or span.trace_id == b"\0" * 16:
                    rejected += 1  # the OTLP spec: a span without a valid trace id is invalid
                    continue
                summary, source, reason = request_summary(span)
                out.append(SpanFacts(resource, scope, span, service, summary, source, reason,
                                     span.status.code == _ERROR, not span.parent_span_id))
    return out, rejected


def build_request(items: Sequence[tuple[Resource, InstrumentationScope, Span]]) -> ExportTraceServiceRequest:
    """Re-group spans under their resource and scope, preserving both."""
    req = ExportTraceServiceRequest()
    by_resource: dict[int, Any] = {}
    by_scope: dict[tuple[int, int], Any] = {}
    for resource, scope, span in items:
        rs = by_resource.get(id(resource))
        if rs is None:
            rs = by_resource[id(resource)] = req.resource_spans.add()
            rs.resource.CopyFrom(resource)
        key = (id(resource), id(scope))
        ss = by_scope.get(key)
        if ss is None:
            ss = by_scope[key] = rs.scope_spans.add()
            ss.scope.CopyFrom(scope)
        ss.spans.append(span)
    return req
