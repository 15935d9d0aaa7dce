"""The two-tier layout end to end on loopback: our gateways, configured from the generated tier-2 file, behind a
stand-in for the upstream load-balancing tier that routes by trace id as the generated tier-1 file asks.

The stand-in is test code (the upstream binary does not run here): an OTLP/gRPC server that splits each
export request by trace id and forwards each part to the gateway a consistent-hash ring picks, the ring
built as upstream's loadbalancingexporter builds it (consistent_hashing.go: 100 crc32 positions per
endpoint on a 36000-position ring, a trace id goes to the next position at or after crc32(trace id)).
What is asserted is what our gateways decide: each trace arrives whole at one of them, and their derived
metrics add up to what one gateway computes from the same traffic."""

from __future__ import annotations

import bisect
import json
import zlib
from concurrent import futures
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                     ExportTraceServiceResponse)
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector_testkit import FakeClock, export_request, request_attrs, span
from otel_llm import semconv as sc
from otel_llm_collector.config import CollectorConfig
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.scale_config import ScaleOptions, generate
from otel_llm.core.metrics import GOOD_REQUESTS, REQUESTS
from otel_llm.core.slo import SLOTable
from support.metrics import points_by_name

GATEWAYS = 3
TRACES = 60
SLO = "ttft=0.5,tpot=0.05; big: ttft=2"


class HashRing:
    """upstream loadbalancingexporter/consistent_hashing.go, in Python."""

    MAX_POSITIONS, WEIGHT = 36000, 100

    def __init__(self, endpoints: list[str]) -> None:
        items: dict[int, str] = {}
        for ep in endpoints:
            for i in range(self.WEIGHT):
                pos = zlib.crc32(ep.encode() + bytes([i])) % self.MAX_POSITIONS
                items.setdefault(pos, ep)  # an occupied position keeps its first endpoint
        self.positions = sorted(items)
        self.endpoints = [items[p] for p in self.positions]

    def endpoint_for(self, trace_id: bytes) -> str:
        pos = zlib.crc32(trace_id) % self.MAX_POSITIONS
        i = bisect.bisect_left(self.positions, pos)
        return self.endpoints[i % len(self.endpoints)]


class TraceIdRouter(trace_service_pb2_grpc.TraceServiceServicer):
    """Stand-in for tier 1: split by trace id, keep resource and scope, forward to the ring's gateway."""

    def __init__(self, endpoints: list[str]) -> None:
        self.ring = HashRing(endpoints)
        self.channels = {ep: grpc.insecure_channel(ep) for ep in endpoints}
        self.stubs = {ep: trace_service_pb2_grpc.TraceServiceStub(ch) for ep, ch in self.channels.items()}

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:  # noqa: N802
        parts: dict[str, ExportTraceServiceRequest] = {}
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    part = parts.setdefault(self.ring.endpoint_for(s.trace_id), ExportTraceServiceRequest())
                    out_rs = part.resource_spans.add()
                    out_rs.resource.CopyFrom(rs.resource)
                    out_ss = out_rs.scope_spans.add()
                    out_ss.scope.CopyFrom(ss.scope)
                    out_ss.spans.add().CopyFrom(s)
        for ep, part in parts.items():
            self.stubs[ep].Export(part, timeout=30)
        return ExportTraceServiceResponse()

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


def _gateway_config(tier2: dict[str, Any], out: Path) -> CollectorConfig:
    raw = dict(tier2)
    raw["receivers"] = {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": None}}}  # loopback
    raw["exporters"] = {"file": {"path": str(out)}, "prometheus": None}  # metrics read from the registry
    return CollectorConfig.from_mapping(raw)


def _traffic() -> tuple[list[ExportTraceServiceRequest], dict[int, set[int]]]:
    """TRACES requests (root + 2 children), some breaching SLOs, some failing; each trace's spans are spread
    over different export requests and every request mixes traces, as batching SDKs and agents send them."""
    roots, children = [], []
    sent: dict[int, set[int]] = {}
    for t in range(1, TRACES + 1):
        trace = 0x5EED_0000_0000_0000_0000_0000_0000_0000 + t * 7919
        model = "big" if t % 3 == 0 else "small"
        attrs = request_attrs(model=model, ttft=0.1 + (t % 7) * 0.15, tpot=0.01 + (t % 5) * 0.02,
                              e2e=1.0 + t / 10)
        if t % 4 == 0:
            attrs["llm.slo.met"] = True
        roots.append(span(trace, 1, name=f"text_completion {model}", attrs=attrs, error=(t % 11 == 0)))
        children += [span(trace, 2, parent=1, name="llm.queue"), span(trace, 3, parent=1, name="llm.decode")]
        sent[trace] = {1, 2, 3}
    requests = []
    # children first, in batches of 7 across traces; then the roots, in batches of 5
    for batch in (children[i:i + 7] for i in range(0, len(children), 7)):
        requests.append(export_request(*batch, service="engine"))
    for batch in (roots[i:i + 5] for i in range(0, len(roots), 5)):
        requests.append(export_request(*batch, service="engine"))
    return requests, sent


def _kept(path: Path) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    out.setdefault(int(s["traceId"], 16), set()).add(int(s["spanId"], 16))
    return out


def _derived_metrics(g: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The gateway's request metrics as a scrape shows them (its own otelcol_* telemetry left out)."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(g.registry).decode()):
        for s in family.samples:
            if s.name.startswith(("gen_ai_", "llm_")) and not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def two_tier(tmp_path: Path) -> Iterator[tuple[list[Gateway], Gateway, str, FakeClock, Path]]:
    clock = FakeClock()
    # baseline 100%: every trace is kept, so the files show where every span went
    opts = ScaleOptions(slo=SLOTable.parse(SLO), baseline_percent=100.0)
    tier2 = generate(opts, "two-tier")["tier2-gateway.yaml"]
    gateways = [Gateway(_gateway_config(tier2, tmp_path / f"gw{i}.jsonl"), clock=clock, manual_ticks=True).start()
                for i in range(GATEWAYS)]
    single = Gateway(_gateway_config(tier2, tmp_path / "single.jsonl"), clock=clock, manual_ticks=True).start()
    # tier 1 as generated for these gateways: the stand-in takes its routing from the file
    tier1 = generate(ScaleOptions(gateways=tuple(g.grpc_endpoint for g in gateways)), "two-tier")
    lb = tier1["tier1-loadbalancer.yaml"]["exporters"]["load_balancing"]
    assert lb["routing_key"] == "traceID"
    router = TraceIdRouter(lb["resolver"]["static"]["hostnames"])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(router, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield gateways, single, f"127.0.0.1:{port}", clock, tmp_path
    finally:
        server.stop(None)
        router.close()
        for g in (*gateways, single):
            g.shutdown()


def test_every_trace_reaches_one_gateway_whole_and_metrics_add_up(two_tier) -> None:
    gateways, single, router_endpoint, clock, tmp_path = two_tier
    requests, sent = _traffic()
    with grpc.insecure_channel(router_endpoint) as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        for req in requests:
            stub.Export(req, timeout=30)  # via tier 1 to the gateways
            single.ingest(req)            # the same traffic to one gateway, for the totals

    clock.advance(31)  # past decision_wait: every buffered trace is due
    for g in (*gateways, single):
        g.tick()
        assert g.flush(30)

    # every span of a trace reached exactly one gateway, and that gateway has the whole trace
    kept = [_kept(tmp_path / f"gw{i}.jsonl") for i in range(GATEWAYS)]
    owners = {trace: [i for i, k in enumerate(kept) if trace in k] for trace in sent}
    assert all(len(o) == 1 for o in owners.values()), {t: o for t, o in owners.items() if len(o) != 1}
    for trace, (i,) in owners.items():
        assert kept[i][trace] == sent[trace]
    assert sum(len(k) for k in kept) == TRACES and _kept(tmp_path / "single.jsonl") == sent
    assert sum(1 for k in kept if k) >= 2  # the ring did spread the traces
    assert sum(g.telemetry.value("receiver_accepted_spans", transport="grpc") for g in gateways) == 3 * TRACES

    # the derived metrics, summed over the gateways (as `sum by (...)` does), equal one gateway's
    total: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for g in gateways:
        for key, value in _derived_metrics(g).items():
            total[key] = total.get(key, 0.0) + value
    reference = _derived_metrics(single)
    assert reference and set(total) == set(reference)
    counts = [k for k in reference if k[0].endswith(("_count", "_bucket", "_total"))]
    assert len(counts) > 50
    for key in counts:
        assert total[key] == reference[key], key
    for key in reference:
        assert total[key] == pytest.approx(reference[key], rel=1e-9, abs=1e-12), key
    requests_total = sum(v for (name, _), v in reference.items() if name == "llm_server_requests_total")
    assert requests_total == TRACES


def _disaggregated_traffic() -> tuple[list[ExportTraceServiceRequest], dict[int, set[int]], set[int]]:
    """Disaggregated requests as four processes send them: the client's root span, the router's span, the
    prefill instance's request (one token, no TPOT, its KV save; exported for the gateway to decide:
    ``llm.sampling.reason = kv_handoff``) and the decode instance's request. Only some decodes breach
    (their TPOT). Each process exports its own batches, across traces, in its own order."""
    clients, routers, prefills, decodes = [], [], [], []
    sent: dict[int, set[int]] = {}
    breached: set[int] = set()
    for t in range(1, TRACES + 1):
        trace = 0xD15A_0000_0000_0000_0000_0000_0000_0000 + t * 104729
        slow = t % 3 == 0
        if slow:
            breached.add(trace)
        clients.append(span(trace, 1, name="chat small"))
        routers.append(span(trace, 2, parent=1, name="router /v1/chat/completions"))
        prefills += [span(trace, 3, parent=2, name="chat small", attrs={
                         **request_attrs(model="small", ttft=0.1, tpot=0.0, e2e=0.1), sc.USAGE_OUTPUT_TOKENS: 1,
                         sc.DISAGG_ROLE: sc.DISAGG_ROLE_PREFILL, sc.SAMPLING_REASON: sc.SAMPLING_REASON_DEFERRED}),
                     span(trace, 4, parent=3, name=sc.SPAN_KV_TRANSFER)]
        decodes += [span(trace, 5, parent=2, name="chat small", attrs={
                        **request_attrs(model="small", ttft=0.05, tpot=0.2 if slow else 0.01, e2e=1.0),
                        sc.DISAGG_ROLE: sc.DISAGG_ROLE_DECODE}),
                    span(trace, 6, parent=5, name=sc.SPAN_KV_TRANSFER)]
        sent[trace] = {1, 2, 3, 4, 5, 6}
    requests = []
    for service, spans, size in (("vllm-decode", decodes, 7), ("vllm-prefill", prefills, 5),
                                 ("router", routers, 11), ("client", clients, 13)):
        requests += [export_request(*spans[i:i + size], service=service) for i in range(0, len(spans), size)]
    return requests, sent, breached


def test_a_decode_breach_keeps_the_prefill_half_of_its_trace_and_others_drop_whole(tmp_path: Path) -> None:
    """Prefill and decode instances both export to the load-balancing tier; the gateway that owns a trace
    keeps it whole when the decode half breached (the prefill half, which did not, comes along) and drops
    it whole otherwise: the prefill instance's deferred reason is not a decision to keep."""
    clock = FakeClock()
    opts = ScaleOptions(slo=SLOTable.parse("tpot=0.05"), baseline_percent=0.0)
    tier2 = generate(opts, "two-tier")["tier2-gateway.yaml"]
    gateways = [Gateway(_gateway_config(tier2, tmp_path / f"gw{i}.jsonl"), clock=clock, manual_ticks=True).start()
                for i in range(GATEWAYS)]
    tier1 = generate(ScaleOptions(gateways=tuple(g.grpc_endpoint for g in gateways)), "two-tier")
    router = TraceIdRouter(tier1["tier1-loadbalancer.yaml"]["exporters"]["load_balancing"]["resolver"]["static"]
                           ["hostnames"])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(router, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        requests, sent, breached = _disaggregated_traffic()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = trace_service_pb2_grpc.TraceServiceStub(ch)
            for req in requests:
                stub.Export(req, timeout=30)
        clock.advance(31)
        for g in gateways:
            g.tick()
            assert g.flush(30)
        kept = [_kept(tmp_path / f"gw{i}.jsonl") for i in range(GATEWAYS)]
        everywhere: dict[int, list[set[int]]] = {}
        for k in kept:
            for trace, spans in k.items():
                everywhere.setdefault(trace, []).append(spans)
        assert set(everywhere) == breached and 0 < len(breached) < TRACES
        for trace, copies in everywhere.items():
            assert copies == [sent[trace]]  # at one gateway, whole: P's request and its hand-off included
        # goodput counts each user request once: each gateway joined the halves of the traces it owns into the
        # user's request, and only those are in the request and goodput counters
        counted: dict[tuple[str, Any], float] = {}
        for g in gateways:
            for name in (REQUESTS, GOOD_REQUESTS):
                for p in points_by_name(g.metric_reader.get_metrics_data()).get(name, []):
                    key = (name, dict(p.attributes).get(sc.DISAGG_ROLE))
                    counted[key] = counted.get(key, 0) + p.value
        assert counted == {(REQUESTS, "user"): TRACES, (GOOD_REQUESTS, "user"): TRACES - len(breached)}
        assert sum(g.telemetry.value("disagg_join_joined") for g in gateways) == TRACES
    finally:
        server.stop(None)
        router.close()
        for g in gateways:
            g.shutdown()
