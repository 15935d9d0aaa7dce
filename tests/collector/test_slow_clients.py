"""Slow and hostile clients on loopback: they hold no processing slot or worker, they are cut at their
deadline and counted, and valid exports from another client keep succeeding throughout."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from collector_testkit import FakeClock, export_request, loopback_config, request_attrs, span, wait_for
from otel_llm_collector.gateway import Gateway

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
GOOD = export_request(span(1, 1, attrs=request_attrs())).SerializeToString()


def http_export(g: Gateway, body: bytes = GOOD, timeout: float = 10.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", g.http.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def grpc_export(channel: grpc.Channel, body: bytes = GOOD) -> ExportTraceServiceResponse:
    call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    return ExportTraceServiceResponse.FromString(call(body, timeout=10))


def slow_http_client(port: int, declared: int = 100_000) -> socket.socket:
    """A client that sends its headers and one byte of a declared 100 KB body (the rest never comes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
              b"Content-Length: %d\r\n\r\n\x0a" % declared)
    return s


def bad(g: Gateway, transport: str, reason: str) -> float:
    return g.telemetry.value("receiver_bad_requests", transport=transport, reason=reason)


def gateway(read_timeout: str = "4s") -> Gateway:
    # every client here is one peer (127.0.0.1) and nothing fills a pool, so the shares never bite: what bites
    # is the slow-client defences (tests/collector/test_fairness.py contends the pools)
    cfg = loopback_config(receivers={"otlp": {"protocols": {
        "grpc": {"endpoint": "127.0.0.1:0", "read_timeout": read_timeout},
        "http": {"endpoint": "127.0.0.1:0", "read_timeout": read_timeout, "read_header_timeout": "4s"}}}},
        processors={"tail_sampling": None})
    return Gateway(cfg, manual_ticks=True).start()


@pytest.fixture
def gw():
    g = gateway()
    yield g
    g.shutdown()


@pytest.fixture
def patient_gw():
    """Slow clients stay attached for 15 s: setting them up and the exports among them must fit in that
    window on a loaded machine too (with 4 s they could be cut before the test looked)."""
    g = gateway(read_timeout="15s")
    yield g
    g.shutdown()


def test_100_slow_http_clients_and_20_slow_grpc_calls_do_not_stop_normal_exports(patient_gw: Gateway) -> None:
    gw = patient_gw
    # 100 HTTP clients trickling a body (more than the 64 processing slots), 20 gRPC calls that opened and
    # will send their message only after the test (more than the 8 processing workers)
    slow_http = [slow_http_client(gw.http.port) for _ in range(100)]
    release = threading.Event()

    def trickle() -> None:  # a body byte a second each: never idle for the 10 s per-read backstop, so the
        while not release.wait(1.0):  # body's read_timeout is what cuts them
            for s in slow_http:
                try:
                    s.sendall(b"\x0a")
                except OSError:
                    pass

    threading.Thread(target=trickle, name="trickle", daemon=True).start()
    channel = grpc.insecure_channel(gw.grpc_endpoint)
    stream = channel.stream_unary(METHOD, request_serializer=None, response_deserializer=None)

    def late_message():
        release.wait(60)
        yield GOOD

    # the calls' own deadline is past the gateway's read_timeout: the gateway cuts them first
    slow_grpc = [stream.future(late_message(), timeout=60) for _ in range(20)]
    try:
        assert wait_for(lambda: gw.http.connections >= 100 and gw.grpc.in_flight >= 20)
        # while they are attached: every processing slot is free (a slot is taken once a body is in) ...
        assert gw.http.slots.in_use == 0
        # ... and every normal export succeeds, on both receivers
        for _ in range(20):
            assert http_export(gw) == 200
            assert grpc_export(channel).partial_success.rejected_spans == 0
        assert gw.http.connections >= 100 and gw.grpc.in_flight >= 20  # still attached throughout
        # then their deadlines cut them, counted by reason (read_timeout: 15 s here)
        assert wait_for(lambda: bad(gw, "http", "read_timeout") == 100 and bad(gw, "grpc", "read_timeout") == 20,
                        timeout=90)
        for f in slow_grpc:
            assert f.exception(timeout=60).code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert http_export(gw) == 200 and grpc_export(channel) is not None
    finally:
        release.set()
        for s in slow_http:
            s.close()
        channel.close()


def test_header_slowloris_is_cut_at_read_header_timeout(gw: Gateway) -> None:
    s = socket.create_connection(("127.0.0.1", gw.http.port), timeout=30)
    try:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nX-Slow: ")
        cut = False
        for i in range(300):  # one byte every 0.2 s for up to 60 s: a per-read timeout would never fire
            try:
                s.sendall(b"a")
            except OSError:
                cut = True
                break
            time.sleep(0.2)
            if i % 10 == 0:
                assert http_export(gw) == 200
        # cut while still trickling: the 4 s deadline covers the whole header, however busy the client looks
        assert cut
        assert s.recv(100) == b""  # closed by the gateway
        assert wait_for(lambda: bad(gw, "http", "header_timeout") == 1)
    finally:
        s.close()


def test_connections_are_capped_and_the_excess_refused_with_503() -> None:
    cfg = loopback_config(receivers={"otlp": {"protocols": {"grpc": None, "http": {
        "endpoint": "127.0.0.1:0", "max_connections": 5}}}}, processors={"tail_sampling": None})
    # a frozen clock: the held connections never count as idle long enough to be taken for the sixth
    with Gateway(cfg, clock=FakeClock(), manual_ticks=True) as g:
        held = [socket.create_connection(("127.0.0.1", g.http.port), timeout=10) for _ in range(5)]
        try:
            assert wait_for(lambda: g.http.connections == 5)
            extra = socket.create_connection(("127.0.0.1", g.http.port), timeout=10)
            reply = extra.recv(200)
            extra.close()
            assert reply.startswith(b"HTTP/1.1 503") and b"Retry-After" in reply
            assert bad(g, "http", "too_many_connections") == 1
        finally:
            for s in held:
                s.close()
        assert wait_for(lambda: g.http.connections == 0)
        assert http_export(g) == 200  # capacity is back once they leave


def test_header_bytes_are_capped_with_431(gw: Gateway) -> None:
    conns = []
    try:
        for _ in range(20):  # 20 clients, each with 200 KB of headers: each refused after 64 KiB
            s = socket.create_connection(("127.0.0.1", gw.http.port), timeout=10)
            conns.append(s)
            s.sendall(b"POST /v1/traces HTTP/1.1\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 2000)
                                                                 for i in range(100)) + b"\r\n")
        for s in conns:
            assert b" 431 " in s.recv(200).split(b"\r\n", 1)[0]
        assert wait_for(lambda: bad(gw, "http", "headers_too_large") == 20)
        assert http_export(gw) == 200
    finally:
        for s in conns:
            s.close()


def test_disconnecting_clients_are_counted_not_logged_with_a_traceback(gw: Gateway, capfd) -> None:
    for i in range(10):  # half reset in the middle of their headers, half in the middle of their body
        s = socket.create_connection(("127.0.0.1", gw.http.port), timeout=10)
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n"
                  + (b"\r\nab" if i % 2 else b"X-Half: "))
        time.sleep(0.05)  # let the gateway start reading it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        s.close()
    assert wait_for(lambda: bad(gw, "http", "disconnected") + bad(gw, "http", "truncated") == 10)
    assert http_export(gw) == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err


def test_a_pause_inside_the_body_within_read_timeout_is_not_cut(monkeypatch) -> None:
    """The socket's per-read backstop (here 0.3 s) must not cut a client that pauses between two chunks of
    its body for longer than that but stays well inside ``read_timeout`` (60 s): the deadline is the
    watchdog's. Before the fix the pause ended the connection, counted as `disconnected`."""
    from otel_llm_collector.receivers import http_receiver

    monkeypatch.setattr(http_receiver._Handler, "timeout", 0.3)
    g = gateway(read_timeout="60s")
    try:
        s = socket.create_connection(("127.0.0.1", g.http.port), timeout=30)
        try:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(GOOD) + GOOD[:10])
            time.sleep(1.0)  # the client's pause: more than the backstop, far less than read_timeout
            s.sendall(GOOD[10:])
            reply = s.recv(200)
        finally:
            s.close()
        assert reply.startswith(b"HTTP/1.1 200"), reply
        assert bad(g, "http", "disconnected") == 0
        assert g.telemetry.value("receiver_accepted_spans", transport="http") == 1
    finally:
        g.shutdown()
