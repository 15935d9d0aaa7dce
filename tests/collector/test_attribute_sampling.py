"""Attribute policies in the gateway: the values they read are collected per trace, from spans and resources."""

from __future__ import annotations

from typing import Any

from collector_testkit import FakeClock, any_value, export_request, request_attrs, span
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from otel_llm_collector.config import CollectorConfig
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.spans import MAX_VALUES_PER_KEY, extract

from otel_llm import semconv as sc


class Capture:
    """An exporter stand-in: the trace ids of what the gateway exports."""

    def __init__(self) -> None:
        self.traces: list[int] = []

    def submit(self, payload: bytes, spans: int) -> bool:
        req = ExportTraceServiceRequest.FromString(payload)
        self.traces += [int.from_bytes(s.trace_id, "big") for rs in req.resource_spans for ss in rs.scope_spans
                        for s in ss.spans]
        return True

    def close(self, timeout: float = 0) -> None:
        pass


def gateway(clock: FakeClock, policies: list[dict[str, Any]]) -> tuple[Gateway, Capture]:
    cfg = CollectorConfig.from_mapping({
        "receivers": {"otlp": {"protocols": {"grpc": None, "http": None}}},
        "processors": {"tail_sampling": {"decision_wait": "30s", "decision_wait_after_root_received": "1s",
                                         "policies": policies}},
        "exporters": {"prometheus": None},
    })
    g = Gateway(cfg, clock=clock, manual_ticks=True)
    sink = Capture()
    g.exporters = [sink]  # type: ignore[list-item]
    return g, sink


def with_resource(req: ExportTraceServiceRequest, **attrs: Any) -> ExportTraceServiceRequest:
    for k, v in attrs.items():
        req.resource_spans[0].resource.attributes.append(KeyValue(key=k, value=any_value(v)))
    return req


def test_attribute_policies_match_values_on_any_span_or_resource_of_the_trace(clock: FakeClock) -> None:
    g, sink = gateway(clock, [
        {"name": "gold", "type": "string_attribute", "string_attribute": {"key": "tenant", "values": ["gold"]}},
        {"name": "long", "type": "numeric_attribute",
         "numeric_attribute": {"key": sc.USAGE_OUTPUT_TOKENS, "min_value": 1000}},
        {"name": "flagged", "type": "boolean_attribute", "boolean_attribute": {"key": "debug", "value": True}},
    ])
    # 1: the tenant is on a child span that arrives before the request span, in another batch
    g.ingest(export_request(span(1, 2, parent=1, attrs={"tenant": "gold"})))
    g.ingest(export_request(span(1, 1, attrs=request_attrs())))
    # 2: on the resource; 3: a long answer; 4: a flag on a child; 5: other values only
    g.ingest(with_resource(export_request(span(2, 1, attrs=request_attrs())), tenant="gold"))
    g.ingest(export_request(span(3, 1, attrs=request_attrs(**{sc.USAGE_OUTPUT_TOKENS: 1500}))))
    g.ingest(export_request(span(4, 1, attrs=request_attrs()), span(4, 2, parent=1, attrs={"debug": True})))
    g.ingest(with_resource(export_request(span(5, 1, attrs=request_attrs(tenant="free")),
                                          span(5, 2, parent=1, attrs={"debug": 1})), tenant="silver"))
    clock.advance(2)
    g.tick()
    assert sorted(set(sink.traces)) == [1, 2, 3, 4] and sink.traces.count(1) == 2
    assert g.telemetry.value("count_traces_sampled", policy="gold", decision="sampled") == 2


def test_span_count_policy_counts_every_buffered_span(clock: FakeClock) -> None:
    g, sink = gateway(clock, [{"name": "big", "type": "span_count", "span_count": {"min_spans": 3}}])
    g.ingest(export_request(span(1, 1, attrs=request_attrs()), span(1, 2, parent=1)))
    g.ingest(export_request(span(1, 3, parent=1)))
    g.ingest(export_request(span(2, 1, attrs=request_attrs()), span(2, 2, parent=1)))
    clock.advance(2)
    g.tick()
    assert sorted(set(sink.traces)) == [1]


def test_nothing_is_collected_without_attribute_policies_and_values_per_key_are_bounded() -> None:
    req = export_request(*(span(1, i, parent=1 if i > 1 else 0, attrs={"k": i, "other": "x"}) for i in range(1, 200)))
    assert extract(req).attributes is None
    got = extract(req, keys=frozenset({"k", "absent"}))
    assert got.attributes is not None and set(got.attributes[(1).to_bytes(16, "big")]) == {"k"}
    assert got.attributes[(1).to_bytes(16, "big")]["k"] == list(range(1, MAX_VALUES_PER_KEY + 1))
    # the same value twice is kept once; True is not 1
    both = extract(export_request(span(2, 1, attrs={"k": 1}), span(2, 2, parent=1, attrs={"k": 1}),
                                  span(2, 3, parent=1, attrs={"k": True})), keys=frozenset({"k"}))
    assert both.attributes == {(2).to_bytes(16, "big"): {"k": [1, True]}}
