"""A downstream's partial_success is counted as rejected; shutdown with the downstream down logs, counts
and reports the loss (non-zero exit); bearer tokens on both receivers and the Prometheus endpoint."""

from __future__ import annotations

import http.client
import logging
import signal
import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTracePartialSuccess,
                                                                     ExportTraceServiceRequest,
                                                                     ExportTraceServiceResponse)

from collector_testkit import export_request, loopback_config, request_attrs, span
from otel_llm_collector import auth as auth_module
from otel_llm_collector.auth import unprotected_listeners
from otel_llm_collector.config import CollectorConfig, ConfigError
from otel_llm_collector.gateway import Gateway

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METHOD = f"/{SERVICE}/Export"
ROOT = Path(__file__).resolve().parents[2]


class StrictBackend:
    """A gRPC downstream that accepts every request but refuses every span in it (partial_success)."""

    def __init__(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(2))

        def export(raw: bytes, context) -> bytes:
            req = ExportTraceServiceRequest.FromString(raw)
            n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            return ExportTraceServiceResponse(partial_success=ExportTracePartialSuccess(
                rejected_spans=n, error_message="strict: refused")).SerializeToString()

        handler = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_a_downstream_partial_success_is_counted_as_rejected_not_sent(caplog) -> None:
    backend = StrictBackend()
    try:
        cfg = loopback_config(processors={"tail_sampling": None},
                              exporters={"otlp": {"endpoint": f"127.0.0.1:{backend.port}"}})
        with caplog.at_level(logging.WARNING, "otel_llm_collector"), Gateway(cfg, manual_ticks=True) as g:
            g.ingest(export_request(span(1, 1, attrs=request_attrs()), span(1, 2, parent=1)))
            assert g.flush(10)
            t = g.telemetry
            assert t.value("exporter_dropped_spans", exporter="otlp", reason="rejected") == 2
            assert t.value("exporter_sent_spans", exporter="otlp") == 0
        assert any("partial_success" in r.message and "strict: refused" in r.message for r in caplog.records)
    finally:
        backend.server.stop(0)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_shutdown_with_the_downstream_down_counts_and_logs_the_loss(caplog) -> None:
    cfg = loopback_config(processors={"tail_sampling": None}, service={"shutdown_timeout": "1s"},
                          exporters={"otlp": {"endpoint": f"127.0.0.1:{_closed_port()}", "timeout": "1s",
                                              "retry_on_failure": {"max_elapsed_time": "60s"}}})
    g = Gateway(cfg, manual_ticks=True).start()
    for i in range(5):
        g.ingest(export_request(span(10 + i, 1), span(10 + i, 2, parent=1)))
    with caplog.at_level(logging.ERROR, "otel_llm_collector"):
        lost = g.shutdown()
    assert lost == 10
    assert g.telemetry.value("exporter_dropped_spans", exporter="otlp", reason="shutdown") == 10
    assert any("10 spans could not be delivered" in r.message for r in caplog.records)


def test_sigterm_with_the_downstream_down_exits_non_zero_and_says_what_was_lost(tmp_path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(f"""
receivers: {{otlp: {{protocols: {{grpc: {{endpoint: "127.0.0.1:0"}}, http: {{endpoint: "127.0.0.1:0"}}}}}}}}
processors: {{tail_sampling: null}}
exporters:
  prometheus: {{endpoint: "127.0.0.1:0"}}
  otlp: {{endpoint: "127.0.0.1:{_closed_port()}", timeout: 1s, retry_on_failure: {{max_elapsed_time: 60s}}}}
service: {{shutdown_timeout: 1s}}
""")
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'collector'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "otel_llm_collector.cli", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "listening" in line, proc.stderr.read()
        http_addr = line.split("OTLP/HTTP http://", 1)[1].split(",", 1)[0]
        host, port = http_addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/v1/traces", body=export_request(span(3, 1), span(3, 2, parent=1)).SerializeToString(),
                     headers={"Content-Type": "application/x-protobuf"})
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 3
        err = proc.stderr.read()
        assert "2 spans could not be delivered" in err and "otlp: 2" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_signal_delivered_to_another_thread_still_stops_the_gateway() -> None:
    """The kernel hands a process-directed SIGTERM to any thread; Python's handler then runs only when the
    main thread executes bytecode. ``wait_for_signal`` must wake for it; an untimed ``Event.wait`` never
    does (the gateway ignored SIGTERM under load). Aimed at a sleeping helper thread on purpose."""
    import threading

    from otel_llm_collector.cli import wait_for_signal

    stop = threading.Event()
    by_handler = threading.Event()
    helper_up = threading.Event()
    release = threading.Event()

    def handler(*_: object) -> None:
        by_handler.set()
        stop.set()

    def helper() -> None:
        helper_up.set()
        release.wait(60)

    previous = signal.signal(signal.SIGUSR1, handler)
    t = threading.Thread(target=helper, daemon=True)
    gave_up = threading.Event()

    def give_up() -> None:  # so a regression fails instead of hanging the suite
        gave_up.set()
        stop.set()

    fallback = threading.Timer(30, give_up)
    try:
        t.start()
        helper_up.wait(10)
        fallback.start()
        signal.pthread_kill(t.ident, signal.SIGUSR1)
        wait_for_signal(stop)
        assert by_handler.is_set() and not gave_up.is_set(), "the handler did not run while the main thread waited"
    finally:
        fallback.cancel()
        release.set()
        signal.signal(signal.SIGUSR1, previous)


# -- authentication --------------------------------------------------------------------------------

def _auth_config(tmp_path: Path, monkeypatch) -> CollectorConfig:
    monkeypatch.setenv("GW_TOKEN", "s3cret-env")
    (tmp_path / "tokens").write_text("s3cret-file\n")
    return loopback_config(
        extensions={"bearertokenauth": {"token": "${env:GW_TOKEN}"},
                    "bearertokenauth/file": {"filename": str(tmp_path / "tokens")}},
        receivers={"otlp": {"protocols": {
            "grpc": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}},
            "http": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth/file"}}}}},
        exporters={"prometheus": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}},
        processors={"tail_sampling": None})


def _post(g: Gateway, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", g.http.port, timeout=10)
    try:
        conn.request("POST", "/v1/traces", body=export_request(span(1, 1)).SerializeToString(),
                     headers={"Content-Type": "application/x-protobuf", **headers})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def test_requests_without_the_right_bearer_token_get_401_and_unauthenticated(tmp_path, monkeypatch) -> None:
    with Gateway(_auth_config(tmp_path, monkeypatch), manual_ticks=True) as g:
        assert _post(g, {}) == 401
        assert _post(g, {"Authorization": "Bearer s3cret-fil"}) == 401
        assert _post(g, {"Authorization": "Bearer s3cret-env"}) == 401  # the gRPC receiver's token, not this one's
        assert _post(g, {"Authorization": "bearer s3cret-file"}) == 200
        assert g.telemetry.value("receiver_bad_requests", transport="http", reason="unauthenticated") == 3
        body = export_request(span(2, 1)).SerializeToString()
        with grpc.insecure_channel(g.grpc_endpoint) as ch:
            call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.RpcError) as err:
                    call(body, timeout=10, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert call(body, timeout=10, metadata=(("authorization", "Bearer s3cret-env"),)) is not None
        assert g.telemetry.value("receiver_bad_requests", transport="grpc", reason="unauthenticated") == 2
        assert g.telemetry.total("receiver_accepted_spans") == 2
        # the Prometheus endpoint
        conn = http.client.HTTPConnection("127.0.0.1", g.prometheus.port, timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 401
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", g.prometheus.port, timeout=10)
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer s3cret-env"})
        r = conn.getresponse()
        assert r.status == 200 and b"otelcol_llm_receiver_accepted_spans_total" in r.read()
        conn.close()


def test_tokens_are_compared_with_hmac_compare_digest(monkeypatch) -> None:
    calls = []
    real = auth_module.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    from otel_llm_collector.config import BearerTokenConfig

    a = auth_module.BearerAuth(BearerTokenConfig((b"one", b"two")))
    assert a.check("Bearer two") and not a.check("Bearer tw") and not a.check("Basic two")
    # every configured token is compared (no early exit), through compare_digest
    assert calls == [(b"two", b"one"), (b"two", b"two"), (b"tw", b"one"), (b"tw", b"two")]


def test_a_non_loopback_listener_without_tls_or_token_is_reported() -> None:
    # checked on the config (nothing binds beyond loopback in the tests); Gateway.start logs these
    open_cfg = CollectorConfig.from_mapping({"receivers": {"otlp": {"protocols": {
        "grpc": {"endpoint": "0.0.0.0:4317"}, "http": {"endpoint": "[::]:4318"}}}},
        "exporters": {"prometheus": {"endpoint": "0.0.0.0:8889"}}})
    found = unprotected_listeners(open_cfg)
    assert len(found) == 3 and "0.0.0.0:4317" in found[0]
    assert unprotected_listeners(CollectorConfig.from_yaml("")) == []  # loopback defaults


def test_auth_config_errors_name_the_key(monkeypatch) -> None:
    monkeypatch.delenv("NOPE_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="NOPE_TOKEN"):
        CollectorConfig.from_mapping({"extensions": {"bearertokenauth": {"token": "${env:NOPE_TOKEN}"}}})
    with pytest.raises(ConfigError, match="auth.authenticator"):
        CollectorConfig.from_mapping({"receivers": {"otlp": {"protocols": {"http": {
            "endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}}}}})
