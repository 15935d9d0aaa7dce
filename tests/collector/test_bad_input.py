"""Acceptance 6: bad input gets a clear 4xx / gRPC status with the reason, is counted, and never
takes the gateway down; other clients are unaffected. Property tests feed random bytes and
random valid-but-odd OTLP to both receivers."""

from __future__ import annotations

import gzip
import http.client
import json

import grpc
import pytest
from google.rpc.status_pb2 import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                     ExportTraceServiceResponse)

from collector_testkit import export_request, loopback_config, request_attrs, span
from otel_llm_collector.gateway import Gateway
from otel_llm.otlp.json_codec import dumps

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
LIMIT = 64 << 10


@pytest.fixture(scope="module")
def gw():
    g = Gateway(loopback_config(receivers={"otlp": {"protocols": {
        "grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 1},
        "http": {"endpoint": "127.0.0.1:0", "max_request_body_size": LIMIT}}}}), manual_ticks=True).start()
    yield g
    g.shutdown()


def post(g: Gateway, body: bytes, headers: dict[str, str], path: str = "/v1/traces", method: str = "POST"):
    conn = http.client.HTTPConnection("127.0.0.1", g.http.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Length": str(len(body)), **headers})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        conn.close()


PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
GOOD = export_request(span(1, 1, attrs=request_attrs())).SerializeToString()


def bomb() -> bytes:
    return gzip.compress(b"\0" * (LIMIT * 64))  # ~4 MiB of zeros in a few KiB


@pytest.mark.parametrize("label,body,headers,path,method,status,reason", [
    ("malformed protobuf", b"\xff\xff\xff\xff garbage", PB, "/v1/traces", "POST", 400, "malformed_protobuf"),
    ("malformed json", b"{not json", JS, "/v1/traces", "POST", 400, "malformed_json"),
    ("json not an object", b"[1,2]", JS, "/v1/traces", "POST", 400, "malformed_json"),
    ("json bad hex id", json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}).encode(),
     JS, "/v1/traces", "POST", 400, "malformed_json"),
    ("json wrong field type", b'{"resourceSpans": 5}', JS, "/v1/traces", "POST", 400, "malformed_json"),
    ("wrong content type", GOOD, {"Content-Type": "text/plain"}, "/v1/traces", "POST", 415, "content_type"),
    ("unknown encoding", GOOD, {**PB, "Content-Encoding": "br"}, "/v1/traces", "POST", 415, "content_encoding"),
    ("oversized body", b"\0" * (LIMIT + 1), PB, "/v1/traces", "POST", 413, "too_large"),
    ("gzip bomb", bomb(), {**PB, "Content-Encoding": "gzip"}, "/v1/traces", "POST", 413, "gzip_too_large"),
    ("corrupt gzip", b"\x1f\x8b\x08\x00garbage", {**PB, "Content-Encoding": "gzip"}, "/v1/traces", "POST", 400,
     "bad_gzip"),
    ("truncated gzip", gzip.compress(GOOD)[:-12], {**PB, "Content-Encoding": "gzip"}, "/v1/traces", "POST", 400,
     "bad_gzip"),
    ("wrong path", GOOD, PB, "/v1/profiles", "POST", 404, "path"),
    ("wrong method", b"", PB, "/v1/traces", "GET", 405, "method"),
])
def test_http_bad_input(gw: Gateway, label, body, headers, path, method, status, reason) -> None:
    before = gw.telemetry.value("receiver_bad_requests", transport="http", reason=reason)
    code, ctype, payload = post(gw, body, headers, path, method)
    assert code == status
    if "json" in (ctype or ""):
        assert json.loads(payload)["message"]
    else:
        assert Status.FromString(payload).message  # the reason, in a google.rpc.Status
    assert gw.telemetry.value("receiver_bad_requests", transport="http", reason=reason) == before + 1
    # the gateway still serves other clients
    assert post(gw, GOOD, PB)[0] == 200


def test_http_accepts_protobuf_json_and_gzip(gw: Gateway) -> None:
    req = export_request(span(2, 1, attrs=request_attrs()))
    code, _, body = post(gw, req.SerializeToString(), PB)
    assert code == 200 and ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 0
    code, _, body = post(gw, dumps(req).encode(), JS)
    assert code == 200 and json.loads(body) == {}
    code, _, _ = post(gw, gzip.compress(req.SerializeToString()), {**PB, "Content-Encoding": "gzip"})
    assert code == 200


def test_json_ids_are_hex(gw: Gateway) -> None:
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x"}]}]}]}
    from otel_llm.otlp.json_codec import parse_request

    s = parse_request(json.dumps(doc).encode()).resource_spans[0].scope_spans[0].spans[0]
    assert s.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c" and s.span_id.hex() == "b7ad6b7169203331"


def test_invalid_trace_id_is_partial_success(gw: Gateway) -> None:
    req = export_request(span(3, 1))
    bad = req.resource_spans[0].scope_spans[0].spans.add()
    bad.trace_id = b"short"
    code, _, body = post(gw, req.SerializeToString(), PB)
    resp = ExportTraceServiceResponse.FromString(body)
    assert code == 200 and resp.partial_success.rejected_spans == 1 and resp.partial_success.error_message


def grpc_call(g: Gateway, payload: bytes, compression=None):
    with grpc.insecure_channel(g.grpc_endpoint) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        return call(payload, timeout=10, compression=compression)


@pytest.mark.parametrize("payload,code,reason", [
    (b"\xff\xff\xff\xff garbage", grpc.StatusCode.INVALID_ARGUMENT, "malformed"),
    (b"\x0a\x05\x0a\x03\x0a", grpc.StatusCode.INVALID_ARGUMENT, "malformed"),  # truncated nested message
    (b"\0" * ((1 << 20) + 10), grpc.StatusCode.RESOURCE_EXHAUSTED, "too_large"),
])
def test_grpc_bad_input(gw: Gateway, payload, code, reason) -> None:
    before = gw.telemetry.value("receiver_bad_requests", transport="grpc", reason=reason)
    with pytest.raises(grpc.RpcError) as err:
        grpc_call(gw, payload)
    assert err.value.code() == code and err.value.details()
    assert gw.telemetry.value("receiver_bad_requests", transport="grpc", reason=reason) == before + 1
    assert ExportTraceServiceResponse.FromString(grpc_call(gw, GOOD)) is not None  # still serving


def test_grpc_gzip_bomb_is_refused(gw: Gateway) -> None:
    """gRPC inflates before our handler; its cap (ours + 64 KiB) applies after decompression."""
    big = export_request(span(4, 1, attrs={"pad": "\0" * (4 << 20)})).SerializeToString()
    with pytest.raises(grpc.RpcError) as err:
        grpc_call(gw, big, compression=grpc.Compression.Gzip)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_call(gw, GOOD) is not None


def test_spans_missing_llm_attributes_pass_through_unchanged(tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    cfg = loopback_config(processors={"tail_sampling": None}, exporters={"file": {"path": str(out)}})
    with Gateway(cfg, manual_ticks=True) as g:
        req = export_request(span(5, 1, name="GET /health", attrs={"http.route": "/health"}))
        g.ingest(req)
        g.flush(10)
        assert g.telemetry.total("llm_metrics_requests") == 0
    line = json.loads(out.read_text())
    got = line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert got["name"] == "GET /health" and got["attributes"] == [{"key": "http.route",
                                                                   "value": {"stringValue": "/health"}}]


# -- property-based: random bytes and odd-but-valid OTLP, to both receivers ----------------------

odd_values = st.one_of(st.text(max_size=20), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True),
                       st.booleans(), st.lists(st.text(max_size=5), max_size=3))
odd_attrs = st.dictionaries(st.sampled_from(["gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e",
                                             "llm.latency.e2e", "llm.latency.time_to_first_token",
                                             "gen_ai.usage.completion_tokens", "llm.sampling.reason",
                                             "gen_ai.request.model", "other", ""]), odd_values, max_size=6)


@st.composite
def odd_requests(draw) -> ExportTraceServiceRequest:
    from collector_testkit import any_value  # noqa: F401 - used via span()

    spans = []
    for _ in range(draw(st.integers(0, 5))):
        s = span(draw(st.integers(0, 2**128 - 1)), draw(st.integers(0, 2**64 - 1)),
                 parent=draw(st.integers(0, 2**64 - 1)), name=draw(st.text(max_size=10)),
                 attrs=draw(odd_attrs), error=draw(st.booleans()),
                 start=draw(st.integers(0, 2**64 - 1)), end=draw(st.integers(0, 2**64 - 1)))
        if draw(st.booleans()):
            s.trace_id = draw(st.binary(max_size=20))
        spans.append(s)
    return export_request(*spans, service=draw(st.text(max_size=10)))


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(body=st.binary(max_size=2000), json_type=st.booleans(), gz=st.booleans())
def test_random_bytes_never_5xx_http(gw: Gateway, body: bytes, json_type: bool, gz: bool) -> None:
    headers = dict(JS if json_type else PB)
    if gz:
        headers["Content-Encoding"] = "gzip"
    code, _, _ = post(gw, body, headers)
    assert code in (200, 400, 413)


@SETTINGS
@given(body=st.binary(max_size=2000))
def test_random_bytes_never_internal_grpc(gw: Gateway, body: bytes) -> None:
    try:
        grpc_call(gw, body)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


@SETTINGS
@given(req=odd_requests())
def test_odd_but_valid_otlp_is_accepted_by_both(gw: Gateway, req: ExportTraceServiceRequest) -> None:
    n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
    resp = ExportTraceServiceResponse.FromString(grpc_call(gw, req.SerializeToString()))
    assert 0 <= resp.partial_success.rejected_spans <= n
    code, _, _ = post(gw, req.SerializeToString(), PB)
    assert code == 200
    code, _, _ = post(gw, dumps(req).encode(), JS)
    assert code == 200
