"""Parsing happens outside the pipeline lock; OTLP/JSON has its own size cap; every parse error is a 400;
spans with bad span or parent ids are refused by partial_success and never reach an export batch."""

from __future__ import annotations

import http.client
import json
import threading

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from collector_testkit import export_request, loopback_config, request_attrs, span
from otel_llm.otlp.json_codec import dumps
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.receivers import http_receiver

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def post(g: Gateway, body: bytes, ctype: str = "application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", g.http.port, timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": ctype})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_a_json_body_being_parsed_does_not_hold_the_pipeline_lock(monkeypatch) -> None:
    """While an OTLP/JSON body is parsed, a gRPC export from another client completes. The parse is held
    open until that export is done: if parsing held the pipeline lock, the export could not finish."""
    started, grpc_done = threading.Event(), threading.Event()
    real = http_receiver.parse_request

    def held_open(body: bytes):
        started.set()
        assert grpc_done.wait(20), "the concurrent gRPC export did not complete while JSON was being parsed"
        return real(body)

    monkeypatch.setattr(http_receiver, "parse_request", held_open)
    # the handler thread's own parse (json_workers: 0); the worker process's is in test_fairness.py
    cfg = loopback_config(processors={"tail_sampling": None}, receivers={"otlp": {"protocols": {
        "grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0", "json_workers": 0}}}})
    with Gateway(cfg, manual_ticks=True) as g:
        big = dumps(export_request(*[span(7, i + 1, attrs=request_attrs()) for i in range(2000)])).encode()
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("status", post(g, big[: 1 << 20] if len(big) > 1 << 20
                                                                                   else big)[0]))
        t.start()
        assert started.wait(20)
        with grpc.insecure_channel(g.grpc_endpoint) as ch:
            call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            good = export_request(span(8, 1, attrs=request_attrs())).SerializeToString()
            assert ExportTraceServiceResponse.FromString(call(good, timeout=10)) is not None
        grpc_done.set()
        t.join(30)
        assert g.telemetry.value("receiver_accepted_spans", transport="grpc") == 1


def test_json_has_its_own_smaller_size_limit() -> None:
    with Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True) as g:
        assert g.config.http.max_json_body_bytes == 1 << 20 < g.config.http.max_body_bytes
        body = b'{"resourceSpans": []' + b" " * (2 << 20) + b"}"
        status, reply = post(g, body)
        assert status == 413 and b"OTLP/JSON" in reply
        assert post(g, b" " * (2 << 20) + b"{}", "application/x-protobuf")[0] == 400  # protobuf: under its cap


@pytest.mark.parametrize("body", [
    b'{"resourceSpans":' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # RecursionError in the parser
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "1e400"}]}]}]}',
    b'{"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": {"intValue": "99999999999999999999"}}]}}]}',
    b'{"resourceSpans": {"a": 1}}',
    b'[1, 2]',
])
def test_every_json_parse_error_is_a_400(body: bytes) -> None:
    with Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True) as g:
        status, reply = post(g, body)
        assert status == 400, reply
        assert g.telemetry.value("receiver_bad_requests", transport="http", reason="malformed_json") == 1


def test_bad_span_and_parent_ids_are_refused_without_costing_other_spans(tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    cfg = loopback_config(processors={"tail_sampling": None}, exporters={"file": {"path": str(out)}})
    with Gateway(cfg, manual_ticks=True) as g:
        bad_span = span(20, 1, attrs=request_attrs())
        bad_span.span_id = b"\x01\x02"  # 2 bytes
        bad_parent = span(21, 2)
        bad_parent.parent_span_id = b"\x01\x02\x03"
        zero_span = span(22, 3)
        zero_span.span_id = b"\0" * 8
        mixed = export_request(bad_span, bad_parent, zero_span, span(23, 4, attrs=request_attrs()), service="a")
        status, reply = post(g, mixed.SerializeToString(), "application/x-protobuf")
        resp = ExportTraceServiceResponse.FromString(reply)
        assert status == 200 and resp.partial_success.rejected_spans == 3
        assert "span id" in resp.partial_success.error_message
        with grpc.insecure_channel(g.grpc_endpoint) as ch:
            call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            resp = ExportTraceServiceResponse.FromString(call(export_request(span(24, 5), service="b")
                                                              .SerializeToString(), timeout=10))
            assert resp.partial_success.rejected_spans == 0
        assert g.flush(10)
        t = g.telemetry
        assert t.value("receiver_refused_spans", transport="http", reason="invalid_span_id") == 2
        assert t.value("receiver_refused_spans", transport="http", reason="invalid_parent_span_id") == 1
    exported = [s for line in out.read_text().splitlines() for rs in json.loads(line)["resourceSpans"]
                for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert sorted(int(s["traceId"], 16) for s in exported) == [23, 24]  # every good span, from both clients
    assert all(len(s["spanId"]) == 16 and len(s.get("parentSpanId", "")) in (0, 16) for s in exported)


def test_a_big_request_is_processed_in_parts_and_loses_nothing(tmp_path, monkeypatch) -> None:
    """Requests above INGEST_CHUNK spans are processed in parts (the lock is released in between): every
    span is exported once and every request span counted once."""
    from otel_llm_collector import gateway as gateway_module

    holds = []
    out = tmp_path / "out.jsonl"
    cfg = loopback_config(processors={"tail_sampling": None}, exporters={"file": {"path": str(out)}})
    with Gateway(cfg, manual_ticks=True) as g:
        real = g._ingest  # noqa: SLF001

        def counting(batch, transport, peer=None):
            holds.append(len(batch.spans))
            return real(batch, transport, peer)

        monkeypatch.setattr(g, "_ingest", counting)
        bad = span(1, 1)
        bad.span_id = b"\x01"
        spans = [bad] + [span(100 + i // 2, i + 1, parent=(i if i % 2 else 0), attrs=request_attrs() if i % 2 == 0
                              else None) for i in range(2 * gateway_module.INGEST_CHUNK + 500)]
        assert g.ingest(export_request(*spans)) == 1
        assert g.flush(10)
        assert holds == [gateway_module.INGEST_CHUNK, gateway_module.INGEST_CHUNK, 500]
        assert g.telemetry.value("llm_metrics_requests", source="otel_llm") == gateway_module.INGEST_CHUNK + 250
        assert g.telemetry.value("receiver_refused_spans", transport="direct", reason="invalid_span_id") == 1
    exported = [s for line in out.read_text().splitlines() for rs in json.loads(line)["resourceSpans"]
                for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(exported) == 2 * gateway_module.INGEST_CHUNK + 500
