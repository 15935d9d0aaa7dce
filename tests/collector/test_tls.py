"""TLS on the gateway's receivers and exporters, over real loopback sockets.

A throwaway PKI is generated per session (nothing committed): a CA, a server certificate for
127.0.0.1/localhost, a client certificate, a second CA with its own client (signed by the wrong
CA for our receivers), and a server certificate valid only for ``gateway.internal`` (for
``server_name_override``). What is checked: the SDK's own OTLP exporters reach a TLS gateway;
our exporters reach a mutual-TLS gateway and never fall back to plaintext; receivers refuse
clients without (or with a foreign) certificate and plaintext clients, and keep serving; config
mistakes fail at load naming the key.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from collector_testkit import export_request, loopback_config, span
from otel_llm_collector.config import ConfigError, TLSClientConfig
from otel_llm_collector.gateway import Gateway

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# -- a throwaway PKI -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    foreign_client_cert: str  # signed by other_ca: our receivers must refuse it
    foreign_client_key: str
    named_cert: str  # valid only for gateway.internal
    named_key: str

    def read(self, name: str) -> bytes:
        return Path(getattr(self, name)).read_bytes()


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Certificate, Any] | None,
           sans: list[x509.GeneralName] = (), client: bool = False) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    ca = issuer is None
    b = (x509.CertificateBuilder().subject_name(name)
         .issuer_name(name if ca else issuer[0].subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False),
                            critical=True)
    else:
        b = (b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()),
                             critical=False)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                   else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(key if ca else issuer[1], hashes.SHA256())


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    paths: dict[str, str] = {}

    def save(name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None) -> None:
        (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[name.replace("-", "_") + ("_cert" if key is not None else "")] = str(d / f"{name}.crt")
        if key is not None:
            (d / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                              serialization.PrivateFormat.PKCS8,
                                                              serialization.NoEncryption()))
            paths[name.replace("-", "_") + "_key"] = str(d / f"{name}.key")

    def new_key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    ca_key, other_key = new_key(), new_key()
    ca, other = _issue("test CA", ca_key, None), _issue("other CA", other_key, None)
    save("ca", ca)
    save("other-ca", other)
    local = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for name, issuer, sans, client in (("server", (ca, ca_key), local, False),
                                       ("client", (ca, ca_key), [], True),
                                       ("foreign-client", (other, other_key), [], True),
                                       ("named", (ca, ca_key), [x509.DNSName("gateway.internal")], False)):
        key = new_key()
        save(name, _issue(name, key, issuer, sans, client), key)
    return Pki(**paths)


# -- helpers ------------------------------------------------------------------------------------------

def server_tls(pki: Pki, mtls: bool = False, cert: str = "server") -> dict[str, str]:
    t = {"cert_file": getattr(pki, f"{cert}_cert"), "key_file": getattr(pki, f"{cert}_key")}
    return {**t, "client_ca_file": pki.ca} if mtls else t


def tls_gateway(tls: dict[str, str], out: Path | None = None) -> Gateway:
    """A gateway whose receivers both speak TLS; with ``out``, it writes what it gets there (no sampling)."""
    protocols = {p: {"endpoint": "127.0.0.1:0", "tls": tls} for p in ("grpc", "http")}
    exporters: dict[str, Any] = {"prometheus": None}
    if out is not None:
        exporters["file"] = {"path": str(out)}
    return Gateway(loopback_config(receivers={"otlp": {"protocols": protocols}},
                                   processors={"tail_sampling": None}, exporters=exporters),
                   manual_ticks=True).start()


def https_url(g: Gateway) -> str:
    assert g.http is not None
    return f"https://127.0.0.1:{g.http.port}/v1/traces"


def span_ids(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {int(s["spanId"], 16) for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}


def grpc_export(target: str, credentials: grpc.ChannelCredentials | None,
                timeout: float = 30) -> ExportTraceServiceResponse:
    """One Export call with a fresh channel (TLS when ``credentials``); raises grpc.RpcError on failure."""
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with channel:
        call = channel.unary_unary(EXPORT, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        return call(export_request(span(7, 7)).SerializeToString(), timeout=timeout)


def http_export(url: str, timeout: float = 30, **kw: Any) -> requests.Response:
    # a generous deadline: a TLS handshake on a loaded 2-core machine can take seconds
    return requests.post(url, data=export_request(span(8, 8)).SerializeToString(), timeout=timeout,
                         headers={"Content-Type": "application/x-protobuf"}, **kw)


def tls_failures(g: Gateway) -> float:
    return g.telemetry.value("receiver_bad_requests", transport="http", reason="tls")


def tls_failures_settle(g: Gateway, expected: float, timeout: float = 30.0) -> float:
    """The count once it reaches ``expected`` (or the bound passes): the server's handshake sends its alert
    before its thread counts the failure, so the client can see the refusal first."""
    deadline = time.monotonic() + timeout
    while tls_failures(g) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return tls_failures(g)


# -- the SDK's exporters -> a TLS gateway -----------------------------------------------------------

@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_exporters_deliver_to_a_tls_gateway(transport: str, pki: Pki, tmp_path: Path) -> None:
    out = tmp_path / "got.jsonl"
    g = tls_gateway(server_tls(pki), out)
    try:
        if transport == "grpc":
            exporter = GrpcExporter(endpoint=g.grpc_endpoint, timeout=30,
                                    credentials=grpc.ssl_channel_credentials(root_certificates=pki.read("ca")))
        else:
            # the SDK sets certificate_file as its session's verify, which requests replaces with
            # REQUESTS_CA_BUNDLE when that is set (it is on many hosts): a session that ignores the environment
            session = requests.Session()
            session.trust_env = False
            exporter = HttpExporter(endpoint=https_url(g), certificate_file=pki.ca, timeout=30, session=session)
        provider = TracerProvider(resource=Resource.create({"service.name": "tls-app"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        ids = set()
        for i in range(3):
            with provider.get_tracer("tls").start_as_current_span(f"request {i}") as s:
                ids.add(s.get_span_context().span_id)
        provider.shutdown()
        assert g.flush(10)
        assert span_ids(out) == ids
        assert g.telemetry.value("receiver_accepted_spans", transport=transport) == 3
    finally:
        g.shutdown()


# -- our exporters -> a mutual-TLS gateway ----------------------------------------------------------

def sender_gateway(exporter: str, endpoint: str, tls: dict[str, Any] | None, timeout: str = "2s",
                   retry_budget: str = "200ms") -> Gateway:
    """A receiver-less gateway forwarding everything it ingests to ``endpoint``; by default a short retry
    budget (for the sends that must fail); a delivery that must succeed passes a generous one."""
    cfg: dict[str, Any] = {"endpoint": endpoint, "timeout": timeout,
                           "retry_on_failure": {"initial_interval": "10ms", "max_elapsed_time": retry_budget}}
    if tls is not None:
        cfg["tls"] = tls
    # no receivers: an empty ``protocols`` would merge over the defaults and bind 4317/4318 (fixed ports:
    # taken by anything else on the machine, another test run included)
    g = Gateway(loopback_config(receivers={"otlp": {"protocols": {"grpc": None, "http": None}}},
                                processors={"tail_sampling": None},
                                exporters={exporter: cfg, "prometheus": None}),
                manual_ticks=True).start()
    assert g.grpc is None and g.http is None and g.prometheus is None
    return g


# for a send that must succeed: a loaded machine's TLS handshake can take seconds
PATIENT = {"timeout": "30s", "retry_budget": "60s"}


def endpoint_of(g: Gateway, exporter: str) -> str:
    assert g.grpc is not None and g.http is not None
    return f"127.0.0.1:{g.grpc.port}" if exporter == "otlp" else f"127.0.0.1:{g.http.port}"


def forward(sender: Gateway, exporter: str, n: int = 3) -> None:
    sender.ingest(export_request(*(span(100 + i, 100 + i) for i in range(n))))
    assert sender.flush(90)


@pytest.mark.parametrize("exporter", ["otlp", "otlphttp"])
def test_exporter_delivers_over_mutual_tls_to_a_second_gateway(exporter: str, pki: Pki, tmp_path: Path) -> None:
    out = tmp_path / "downstream.jsonl"
    downstream = tls_gateway(server_tls(pki, mtls=True), out)
    sender = sender_gateway(exporter, endpoint_of(downstream, exporter),
                            {"ca_file": pki.ca, "cert_file": pki.client_cert, "key_file": pki.client_key}, **PATIENT)
    try:
        forward(sender, exporter)
        assert downstream.flush(60)
        assert span_ids(out) == {100, 101, 102}
        assert sender.telemetry.value("exporter_sent_spans", exporter=exporter) == 3
    finally:
        sender.shutdown()
        downstream.shutdown()


@pytest.mark.parametrize("exporter", ["otlp", "otlphttp"])
def test_exporter_with_tls_never_falls_back_to_plaintext(exporter: str, pki: Pki, tmp_path: Path) -> None:
    """The original bug: ``tls`` was accepted and ignored. Against a plaintext gateway a TLS exporter must fail."""
    out = tmp_path / "plaintext.jsonl"
    plain = Gateway(loopback_config(processors={"tail_sampling": None},
                                    exporters={"file": {"path": str(out)}, "prometheus": None}),
                    manual_ticks=True).start()
    sender = sender_gateway(exporter, endpoint_of(plain, exporter), {"ca_file": pki.ca})
    try:
        forward(sender, exporter)
        assert plain.flush(10)
        assert span_ids(out) == set()
        t = sender.telemetry
        assert t.value("exporter_sent_spans", exporter=exporter) == 0
        assert t.value("exporter_dropped_spans", exporter=exporter, reason="retries_exhausted") == 3
    finally:
        sender.shutdown()
        plain.shutdown()


@pytest.mark.parametrize("exporter", ["otlp", "otlphttp"])
@pytest.mark.parametrize("override", [True, False])
def test_server_name_override_is_what_the_certificate_is_checked_against(exporter: str, override: bool, pki: Pki,
                                                                         tmp_path: Path) -> None:
    """The downstream certificate names only gateway.internal; we dial 127.0.0.1."""
    out = tmp_path / "named.jsonl"
    downstream = tls_gateway(server_tls(pki, cert="named"), out)
    tls = {"ca_file": pki.ca, **({"server_name_override": "gateway.internal"} if override else {})}
    sender = sender_gateway(exporter, endpoint_of(downstream, exporter), tls, **(PATIENT if override else {}))
    try:
        forward(sender, exporter)
        assert downstream.flush(60)
        assert span_ids(out) == ({100, 101, 102} if override else set())
        assert sender.telemetry.value("exporter_sent_spans", exporter=exporter) == (3 if override else 0)
    finally:
        sender.shutdown()
        downstream.shutdown()


@pytest.mark.parametrize("skip", [True, False])
def test_otlphttp_insecure_skip_verify_accepts_an_unknown_ca(skip: bool, pki: Pki, tmp_path: Path) -> None:
    out = tmp_path / "skip.jsonl"
    downstream = tls_gateway(server_tls(pki), out)
    # no ca_file: verified against the system roots, which do not know our test CA
    tls = {"insecure_skip_verify": True} if skip else {}
    sender = sender_gateway("otlphttp", endpoint_of(downstream, "otlphttp"), tls, **(PATIENT if skip else {}))
    try:
        forward(sender, "otlphttp")
        assert downstream.flush(60)
        assert span_ids(out) == ({100, 101, 102} if skip else set())
    finally:
        sender.shutdown()
        downstream.shutdown()


# -- receivers refuse what they must, and keep serving --------------------------------------------

@pytest.fixture
def mtls_gateway(pki: Pki) -> Iterator[Gateway]:
    g = tls_gateway(server_tls(pki, mtls=True))
    yield g
    g.shutdown()


def test_grpc_receiver_with_client_ca_requires_a_client_certificate_from_that_ca(pki: Pki,
                                                                                 mtls_gateway: Gateway) -> None:
    target = mtls_gateway.grpc_endpoint
    for credentials in (grpc.ssl_channel_credentials(pki.read("ca")),  # no client certificate
                        grpc.ssl_channel_credentials(pki.read("ca"), pki.read("foreign_client_key"),
                                                     pki.read("foreign_client_cert")),  # signed by another CA
                        None):  # plaintext
        with pytest.raises(grpc.RpcError) as err:
            grpc_export(target, credentials)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert mtls_gateway.telemetry.value("receiver_accepted_spans", transport="grpc") == 0
    good = grpc.ssl_channel_credentials(pki.read("ca"), pki.read("client_key"), pki.read("client_cert"))
    assert isinstance(grpc_export(target, good), ExportTraceServiceResponse)
    assert mtls_gateway.telemetry.value("receiver_accepted_spans", transport="grpc") == 1


def test_http_receiver_with_client_ca_requires_a_client_certificate_from_that_ca(pki: Pki,
                                                                                 mtls_gateway: Gateway) -> None:
    url = https_url(mtls_gateway)
    for cert in (None, (pki.foreign_client_cert, pki.foreign_client_key)):
        with pytest.raises(requests.exceptions.ConnectionError):  # SSLError is one
            http_export(url, verify=pki.ca, cert=cert)
    assert tls_failures_settle(mtls_gateway, 2) == 2
    assert mtls_gateway.telemetry.value("receiver_accepted_spans", transport="http") == 0
    r = http_export(url, verify=pki.ca, cert=(pki.client_cert, pki.client_key))
    assert r.status_code == 200
    assert mtls_gateway.telemetry.value("receiver_accepted_spans", transport="http") == 1


def test_plaintext_clients_fail_fast_and_the_tls_receivers_keep_serving(pki: Pki) -> None:
    g = tls_gateway(server_tls(pki))
    try:
        assert g.http is not None
        # refused, not left hanging: the error is the gateway's refusal, never the client's (long) deadline
        with pytest.raises(requests.exceptions.ConnectionError) as refused:
            http_export(f"http://127.0.0.1:{g.http.port}/v1/traces", timeout=60)
        assert not isinstance(refused.value, requests.exceptions.Timeout), refused.value
        with pytest.raises(grpc.RpcError) as failed:
            grpc_export(g.grpc_endpoint, None, timeout=60)
        assert failed.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, failed.value
        assert tls_failures_settle(g, 1) == 1
        # a client that connects and never starts a handshake must not stall the accept loop: the exports
        # succeed while it is still waiting (its handshake times out after 10 s, counted as a TLS failure; a
        # stalled loop would serve them only after that). Generous client deadlines: a loaded machine is slow.
        with socket.create_connection(("127.0.0.1", g.http.port)):
            assert http_export(https_url(g), verify=pki.ca, timeout=60).status_code == 200
            assert isinstance(grpc_export(g.grpc_endpoint, grpc.ssl_channel_credentials(pki.read("ca")), timeout=60),
                              ExportTraceServiceResponse)
            assert tls_failures(g) == 1  # the idle client has not timed out yet: nobody waited for it
        assert g.telemetry.value("receiver_accepted_spans", transport="http") == 1
        assert g.telemetry.value("receiver_accepted_spans", transport="grpc") == 1
    finally:
        g.shutdown()


# -- config -------------------------------------------------------------------------------------------

def exporter_config(tls: Any, endpoint: str = "127.0.0.1:4317", kind: str = "otlp") -> Any:
    e = {"endpoint": endpoint, **({} if tls is ... else {"tls": tls})}
    return loopback_config(exporters={kind: e}).exporters[0]


def receiver_config(tls: Any, protocol: str = "grpc") -> Any:
    cfg = loopback_config(receivers={"otlp": {"protocols": {protocol: {"endpoint": "127.0.0.1:0", "tls": tls}}}})
    return getattr(cfg, protocol)


def test_tls_config_maps_to_the_dataclasses(pki: Pki) -> None:
    assert exporter_config(...).tls is None  # no tls: plaintext, as before
    assert exporter_config({"insecure": True}).tls is None
    assert exporter_config({}).tls == TLSClientConfig()  # TLS, system roots
    assert exporter_config(..., endpoint="https://collector:4318", kind="otlphttp").tls == TLSClientConfig()
    full = exporter_config({"ca_file": pki.ca, "cert_file": pki.client_cert, "key_file": pki.client_key,
                            "server_name_override": "gateway.internal"}, endpoint="https://127.0.0.1:4317")
    assert full.tls == TLSClientConfig(pki.ca, pki.client_cert, pki.client_key, False, "gateway.internal")
    r = receiver_config(server_tls(pki, mtls=True), "http")
    assert r.tls is not None and (r.tls.cert_file, r.tls.key_file, r.tls.client_ca_file) == (
        pki.server_cert, pki.server_key, pki.ca)
    assert receiver_config(server_tls(pki)).tls.client_ca_file is None


@pytest.mark.parametrize("tls, endpoint, kind, message", [
    ({"ca_file": "/nonexistent/ca.crt"}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls.ca_file: cannot read"),
    ({"cert_file": "{client_cert}"}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls.key_file: missing"),
    ({"key_file": "{client_key}"}, "127.0.0.1:4318", "otlphttp", "exporters.otlphttp.tls.cert_file: missing"),
    ({"cert_file": "{client_cert}", "key_file": "{server_key}"}, "127.0.0.1:4317", "otlp",
     "exporters.otlp.tls.key_file: "),  # not the key of that certificate
    ({"ca_file": "{ca}", "min_version": "1.3"}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls.min_version: this upstream"),
    ({"ca_pem": "-----BEGIN CERTIFICATE-----"}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls.ca_pem: this upstream"),
    ({"verify": False}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls: unknown key(s) ['verify']"),
    ({"insecure_skip_verify": True}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls.insecure_skip_verify: this upstream"),
    ({"insecure": True, "ca_file": "{ca}"}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls: insecure: true turns TLS off"),
    ({"insecure": "yes"}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls.insecure: expected true or false"),
    ({"ca_file": "{ca}"}, "http://127.0.0.1:4318", "otlphttp", "exporters.otlphttp.endpoint: http:// means plaintext"),
    ({"insecure": True}, "https://127.0.0.1:4318", "otlphttp", "exporters.otlphttp.endpoint: https:// asks for TLS"),
    ({"insecure_skip_verify": True, "ca_file": "{ca}"}, "127.0.0.1:4318", "otlphttp",
     "exporters.otlphttp.tls: insecure_skip_verify: true verifies nothing"),
    ({"ca_file": "{client_key}"}, "127.0.0.1:4317", "otlp", "exporters.otlp.tls.ca_file: "),  # a key, not a CA
    (None, "127.0.0.1:4317", "otlp", "exporters.otlp.tls: expected a mapping"),
    ({"ca_file": "{ca}"}, "", "file", "exporters.file.tls: the file exporter has no TLS"),
])
def test_bad_exporter_tls_config_fails_at_load_naming_the_key(tls: Any, endpoint: str, kind: str, message: str,
                                                              pki: Pki) -> None:
    if isinstance(tls, dict):
        tls = {k: v.format(**vars(pki)) if isinstance(v, str) else v for k, v in tls.items()}
    section = {"path": "/tmp/x.jsonl"} if kind == "file" else {"endpoint": endpoint}
    with pytest.raises(ConfigError) as err:
        loopback_config(exporters={kind: {**section, "tls": tls}})
    assert message in str(err.value)


@pytest.mark.parametrize("tls, message", [
    ({"cert_file": "{server_cert}"}, "tls.key_file: missing"),
    ({"key_file": "{server_key}"}, "tls.cert_file: missing"),
    ({}, "tls: a TLS receiver needs cert_file and key_file"),
    ({"cert_file": "{server_cert}", "key_file": "/nonexistent/server.key"}, "tls.key_file: cannot read"),
    ({"cert_file": "{server_cert}", "key_file": "{server_key}", "client_ca_file": "/nonexistent/ca.crt"},
     "tls.client_ca_file: cannot read"),
    ({"cert_file": "{server_cert}", "key_file": "{server_key}", "ca_file": "{ca}"}, "tls.ca_file: this upstream"),
    ({"cert_file": "{server_cert}", "key_file": "{server_key}", "reload_interval": "1h"},
     "tls.reload_interval: this upstream"),
    ({"cert_file": "{server_cert}", "key_file": "{server_key}", "insecure": True}, "tls: unknown key(s) ['insecure']"),
])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bad_receiver_tls_config_fails_at_load_naming_the_key(tls: dict[str, Any], message: str, protocol: str,
                                                              pki: Pki) -> None:
    tls = {k: v.format(**vars(pki)) if isinstance(v, str) else v for k, v in tls.items()}
    with pytest.raises(ConfigError) as err:
        receiver_config(tls, protocol)
    assert f"receivers.otlp.protocols.{protocol}.{message}" in str(err.value)
