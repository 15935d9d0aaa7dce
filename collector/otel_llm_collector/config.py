"""The collector's YAML config: embedded defaults, upstream key names, clear errors.

Shape (keys follow the upstream Collector where the concept is the same)::

    receivers:
      otlp:
        protocols:
          grpc: {endpoint: 127.0.0.1:4317, max_recv_msg_size_mib: 4}
          http: {endpoint: 127.0.0.1:4318, max_request_body_size: 4194304}
    processors:
      llm_metrics: {slo: "ttft=0.5,tpot=0.05; big-model: ttft=2"}
      tail_sampling:
        decision_wait: 30s
        decision_wait_after_root_received: 1s
        num_traces: 50000
        max_buffer_bytes: 64MiB
        decision_cache: {sampled_cache_size: 100000, non_sampled_cache_size: 100000}
        policies: [{name: errors, type: status_code, status_code: {status_codes: [ERROR]}}, ...]
    exporters:
      otlp_grpc: {endpoint: 127.0.0.1:14317}       # gRPC (``otlp``: the same, older name); also otlphttp, file
      prometheus: {endpoint: 127.0.0.1:8889, enable_open_metrics: false}
    service:                                       # service_config.py: upstream's telemetry and pipelines
      telemetry: {metrics: {level: normal, address: 127.0.0.1:8888}}
      pipelines: {traces: {receivers: [otlp], processors: [llm_metrics, tail_sampling], exporters: [otlp_grpc]}}

A receiver or exporter is on when its section is present; ``null`` turns a default one off.

Hardening keys (docs/collector-limits.md says what each guarantees): the receivers'
``read_header_timeout``/``read_timeout``/``max_connections``/``max_header_bytes``/``max_json_body_size``/
``max_unauthenticated_connections``/``json_workers``/``json_bytes_per_peer_per_second`` (HTTP),
``read_timeout``/``max_concurrent_requests``/``keepalive.server_parameters``/``workers`` (gRPC), and on both
``min_data_rate`` (under contention, a body or waiting call below it may yield its slot to a peer holding
fewer) and ``trusted_peers`` (addresses or CIDR blocks exempt from the shares: the load-balancing tier); ``auth: {authenticator: <bearertokenauth extension>}`` on both
receivers and ``exporters.prometheus`` (the extension's ``tenants: {name: token}`` names tenants);
``processors.llm_metrics.{max_label_length, max_series, max_series_per_service, max_series_per_tenant,
max_series_per_source, label_cache_size}``; ``service.shutdown_timeout``.

Durability (memory-only by default): ``extensions: {file_storage[/name]: {directory, fsync, create_directory,
max_size}}``, named by exporters' ``sending_queue: {storage: ...}`` (upstream's key) and by
``processors.tail_sampling.storage`` (a write-ahead log of undecided batches; it needs every exporter's queue
durable too). Read by ``_storage`` into ``CollectorConfig.storage``.

TLS uses the upstream ``configtls`` key names::

    receivers:
      otlp:
        protocols:
          grpc:
            endpoint: 0.0.0.0:4317
            tls: {cert_file: server.crt, key_file: server.key, client_ca_file: clients-ca.crt}  # last: mTLS
    exporters:
      otlp:     {endpoint: backend:4317, tls: {ca_file: ca.crt, cert_file: client.crt, key_file: client.key}}
      otlphttp: {endpoint: https://backend:4318, tls: {ca_file: ca.crt}}

Receivers: ``cert_file`` + ``key_file`` turn TLS on (>= 1.2); ``client_ca_file`` makes a client certificate
signed by that CA mandatory. Exporters: ``ca_file`` (else the system roots), ``cert_file`` + ``key_file``
(a client certificate), ``server_name_override``, ``insecure_skip_verify`` (otlphttp only: Python gRPC cannot
skip verification), ``insecure: true`` (explicit plaintext). Other upstream keys (``*_pem``, ``min_version``,
``cipher_suites``, ``reload_interval``, ...) are refused with a ConfigError rather than ignored, so a config
written for the upstream Collector never gets weaker TLS than it asked for. Files are checked at load
(readable, PEM, cert and key a pair) so a typo fails at start, naming the key.

Default: without a ``tls`` section a receiver or exporter is plaintext, as before. This differs from the
upstream ``otlp`` exporter, which defaults to TLS: our gateway is usually a loopback or in-cluster hop (an
SDK or the upstream load-balancing tier in front, ``scale-config`` emits ``tls: {insecure: true}`` for
that tier), so plaintext stays the default and ``tls:`` turns TLS on. An ``https://`` endpoint also means
TLS (with the system roots unless ``tls`` says otherwise); an ``http://`` endpoint together with ``tls``
settings is a contradiction and refused.
"""

from __future__ import annotations

import copy
import os
import re
import ssl
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from otel_llm.core.sampling.registry import PolicyConfigError, PolicySpec, parse_policies
from otel_llm.core.slo import SLOTable

from .service_config import Pipelines, ServiceConfigError, TelemetryConfig, parse_pipelines, parse_telemetry

DEFAULTS_YAML = """
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: "127.0.0.1:4317"
        max_recv_msg_size_mib: 4
        max_concurrent_requests: 256
        read_timeout: 30s
        keepalive: {server_parameters: {max_connection_age: 10m, max_connection_age_grace: 30s}}
      http:
        endpoint: "127.0.0.1:4318"
        max_request_body_size: 4194304
        max_json_body_size: 1048576
        max_concurrent_requests: 64
        max_connections: 256
        max_header_bytes: 65536
        read_header_timeout: 10s
        read_timeout: 30s
processors:
  llm_metrics:
    slo: ""
    max_label_length: 256
    label_cache_size: 16MiB
    max_series: 500
    max_series_per_service: 100
  tail_sampling:
    decision_wait: 30s
    decision_wait_after_root_received: 1s
    num_traces: 50000
    max_buffer_bytes: 64MiB
    expected_new_traces_per_sec: 0
    tick_interval: 200ms
    decision_cache: {sampled_cache_size: 100000, non_sampled_cache_size: 100000}
    policies:
      - {name: errors, type: error}
      - {name: sdk_decision, type: sdk_decision}
      - {name: slo_breach, type: slo}
      - {name: slow_p99, type: latency_percentile, latency_percentile: {quantile: 0.99, measure: e2e}}
      - {name: baseline, type: probabilistic, probabilistic: {sampling_percentage: 5}}
exporters:
  prometheus: {endpoint: "127.0.0.1:8889"}
"""

EXPORTER_TYPES = ("otlp", "otlp_grpc", "otlphttp", "file", "prometheus")  # otlp_grpc: upstream's newer name of otlp
GRPC_EXPORTERS = ("otlp", "otlp_grpc")


class ConfigError(ValueError):
    """A config problem, with the path of the offending key in the message."""


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def duration(value: Any, where: str) -> float:
    """``30s``, ``500ms``, ``2m``, ``1h`` or a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = _DURATION.match(str(value)) if isinstance(value, str) else None
    if not m:
        raise ConfigError(f"{where}: expected a duration like 30s or 500ms, got {value!r}")
    return float(m.group(1)) * {None: 1, "s": 1, "ms": 1e-3, "m": 60, "h": 3600}[m.group(2)]


def size(value: Any, where: str) -> int:
    """``64MiB``, ``4MB``, ``1024`` (bytes) -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _SIZE.match(str(value)) if isinstance(value, str) else None
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{where}: expected a positive size like 64MiB or 4194304, got {value!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def positive_int(value: Any, where: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{where}: expected a {'non-negative' if allow_zero else 'positive'} integer, got {value!r}")
    return value


def endpoint(value: Any, where: str) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{where}: expected host:port, got {value!r}")
    host, _, port = value.rpartition(":")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"{where}: bad port in {value!r}") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"{where}: port out of range in {value!r}")
    return host.strip("[]") or "127.0.0.1", p


@dataclass(frozen=True)
class TLSServerConfig:
    """A receiver's ``tls`` (upstream ``configtls.ServerConfig``): present = the receiver speaks TLS only."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None  # set: mutual TLS, a client certificate signed by this CA is required


@dataclass(frozen=True)
class TLSClientConfig:
    """An exporter's ``tls`` (upstream ``configtls.ClientConfig``); the exporter holds None for plaintext."""

    ca_file: str | None = None  # None: the system's roots (gRPC: its bundled roots)
    cert_file: str | None = None  # with key_file: a client certificate, for mutual TLS
    key_file: str | None = None
    insecure_skip_verify: bool = False  # otlphttp only
    server_name_override: str = ""  # the name sent as SNI and checked against the server's certificate


def read_pem(path: str | None) -> bytes | None:
    """The bytes of a PEM file named in a TLS setting (validated at load), None when not set."""
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class BearerTokenConfig:
    """An authenticator (upstream ``bearertokenauth`` extension): the tokens a request may present."""

    tokens: tuple[bytes, ...]
    scheme: str = "Bearer"
    header: str = "authorization"
    # the tenant each token names (same order): per-tenant shares, series budgets and refusal counts
    tenants: tuple[str, ...] = ()

    def tenant(self, i: int) -> str:
        return self.tenants[i] if i < len(self.tenants) else f"token-{i + 1}"


@dataclass(frozen=True)
class GrpcReceiverConfig:
    host: str = "127.0.0.1"
    port: int = 4317
    max_message_bytes: int = 4 << 20
    tls: TLSServerConfig | None = None
    max_concurrent_requests: int = 256  # calls in flight (waiting for their message included); beyond: refused
    read_timeout: float = 30.0  # from the call's start until its request message is in
    max_connection_age: float = 600.0  # 0: unlimited
    max_connection_age_grace: float = 30.0
    # threads that parse and ingest received messages (none waits for a client); 0: the event loop's own
    # thread does it (no hand-off: the fastest in benchmarks/collector_throughput.py; parallel parsing
    # contends for the GIL, -40% at 2 workers)
    workers: int = 0
    auth: BearerTokenConfig | None = None
    # under contention, a call still waiting for its message below this rate (bytes/s) may be taken for a
    # newcomer of a peer holding fewer calls (fairness.py; 0: only the cap)
    min_data_rate: int = 1024
    trusted_peers: tuple[str, ...] = ()  # addresses / CIDR blocks exempt from per-peer shares (the LB tier)


@dataclass(frozen=True)
class HttpReceiverConfig:
    host: str = "127.0.0.1"
    port: int = 4318
    max_body_bytes: int = 4 << 20
    max_concurrent_requests: int = 64  # bodies being processed at once (taken once a body is in)
    tls: TLSServerConfig | None = None
    max_json_body_bytes: int = 1 << 20  # OTLP/JSON costs many times protobuf to parse: a smaller cap
    max_connections: int = 256
    max_header_bytes: int = 64 << 10
    read_header_timeout: float = 10.0  # from connection (or previous response) to the end of the headers
    read_timeout: float = 30.0  # from the end of the headers to the end of the body
    auth: BearerTokenConfig | None = None
    # under contention, a body arriving below this rate (bytes/s) may be taken for a newcomer (fairness.py)
    min_data_rate: int = 1024
    trusted_peers: tuple[str, ...] = ()  # addresses / CIDR blocks exempt from per-peer shares (the LB tier)
    # with auth: connections whose token is not checked yet (shared by source address like the connections)
    max_unauthenticated_connections: int = 64
    # OTLP/JSON bodies are parsed in this many worker processes (0: on the handler thread, holding the GIL)
    json_workers: int = 1
    json_bytes_per_peer_per_second: int = 4 << 20  # each peer's OTLP/JSON byte budget (0: unmetered)


@dataclass(frozen=True)
class TailSamplingConfig:
    decision_wait: float = 30.0
    decision_wait_after_root_received: float = 1.0
    num_traces: int = 50_000
    max_buffer_bytes: int = 64 << 20
    expected_new_traces_per_sec: int = 0
    tick_interval: float = 0.2
    sampled_cache_size: int = 100_000
    non_sampled_cache_size: int = 100_000
    policies: tuple[PolicySpec, ...] = ()  # validated at load; the gateway builds them (once)


@dataclass(frozen=True)
class RetryConfig:
    enabled: bool = True
    initial_interval: float = 0.1
    max_interval: float = 5.0
    max_elapsed_time: float = 30.0


@dataclass(frozen=True)
class ExporterConfig:
    name: str  # "otlp", "otlp/tempo", "file", ...
    type: str
    endpoint: str = ""
    path: str = ""
    timeout: float = 5.0
    headers: Mapping[str, str] = field(default_factory=dict)
    compression: str = "none"
    queue_size: int = 1000
    retry: RetryConfig = RetryConfig()
    tls: TLSClientConfig | None = None  # None: plaintext


@dataclass(frozen=True)
class LabelLimits:
    """Bounds on what client-chosen label values can cost (``processors.llm_metrics``)."""

    max_label_length: int = 256  # characters kept of a model, service, operation, provider, error type
    label_cache_bytes: int = 16 << 20  # the one cache of bound label sets, all services together
    max_series: int = 500  # label sets in all (each a series per instrument); then the global overflow one
    max_series_per_service: int = 100  # label sets per service; then that service's overflow label set
    max_series_per_tenant: int = 200  # label sets per tenant (bearer token), whatever its service names
    max_series_per_source: int = 200  # label sets per source address (trusted peers exempt)


@dataclass(frozen=True)
class CollectorConfig:
    grpc: GrpcReceiverConfig | None = GrpcReceiverConfig()
    http: HttpReceiverConfig | None = HttpReceiverConfig()
    llm_metrics: bool = True
    slo: SLOTable = SLOTable()
    tail_sampling: TailSamplingConfig | None = TailSamplingConfig()
    exporters: tuple[ExporterConfig, ...] = ()
    prometheus: tuple[str, int] | None = ("127.0.0.1", 8889)
    labels: LabelLimits = LabelLimits()
    prometheus_auth: BearerTokenConfig | None = None
    shutdown_timeout: float = 5.0  # how long shutdown waits for exporters to deliver what is queued
    storage: "StorageConfig" = field(default_factory=lambda: StorageConfig())  # durable logs (off by default)
    telemetry: TelemetryConfig = TelemetryConfig()  # service.telemetry (service_config.py)
    # exporters.prometheus.enable_open_metrics (upstream's key): OpenMetrics, with exemplars, to scrapers asking
    prometheus_openmetrics: bool = False
    pipelines: Pipelines = Pipelines()  # service.pipelines: where received metrics and logs go
    signal_exporters: tuple[ExporterConfig, ...] = ()  # OTLP exporters the metrics or logs pipeline names

    @classmethod
    def from_yaml(cls, text: str) -> "CollectorConfig":
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config is not valid YAML: {exc}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config must be a mapping at the top level, got {type(raw).__name__}")
        return cls.from_mapping(raw)

    @classmethod
    def from_file(cls, path: str) -> "CollectorConfig":
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_yaml(f.read())
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> "CollectorConfig":
        """Merge ``raw`` over the embedded defaults and validate every key."""
        merged = _merge(yaml.safe_load(DEFAULTS_YAML), raw)
        _only(merged, ("receivers", "processors", "exporters", "extensions", "service"), "")
        auths = _extensions(merged.get("extensions"))
        service = merged.get("service") or {}
        _only(service, ("shutdown_timeout", "telemetry", "pipelines", "extensions"), "service")
        protocols = ((merged.get("receivers") or {}).get("otlp") or {}).get("protocols") or {}
        _only(protocols, ("grpc", "http"), "receivers.otlp.protocols")
        procs = merged.get("processors") or {}
        _only(procs, ("llm_metrics", "tail_sampling"), "processors")
        exps = merged.get("exporters") or {}
        _service_extensions(service.get("extensions"), merged.get("extensions") or {})
        try:
            telemetry = parse_telemetry(service.get("telemetry"))
            pipelines = parse_pipelines(service.get("pipelines"),
                                        tuple(k for k, v in procs.items() if v is not None),
                                        {k: k.split("/")[0] for k, v in exps.items() if v is not None})
        except ServiceConfigError as exc:
            raise ConfigError(str(exc)) from None
        built = {k: _exporter(k, v) for k, v in exps.items() if v is not None and k.split("/")[0] != "prometheus"}
        span_exporters = tuple(built.values())
        signal_exporters: tuple[ExporterConfig, ...] = ()
        if pipelines.given:  # as upstream: a processor or exporter no pipeline names does not run
            procs = {k: v for k, v in procs.items() if k in pipelines.processors}
            span_exporters = tuple(built[k] for k in pipelines.span_exporters or ())
            signal_exporters = tuple(built[k] for k in dict.fromkeys((*(pipelines.metrics or ()),
                                                                      *(pipelines.logs or ()))) if k in built)
        return cls(
            grpc=_grpc(protocols.get("grpc"), auths),
            http=_http(protocols.get("http"), auths),
            llm_metrics=procs.get("llm_metrics") is not None,
            slo=_slo(procs.get("llm_metrics")),
            tail_sampling=_tail(procs.get("tail_sampling")),
            exporters=span_exporters,
            telemetry=telemetry,
            prometheus_openmetrics=bool((exps.get("prometheus") or {}).get("enable_open_metrics", False)),
            pipelines=pipelines,
            signal_exporters=signal_exporters,
            prometheus=_prometheus(exps),
            labels=_labels(procs.get("llm_metrics")),
            prometheus_auth=_auth(exps.get("prometheus"), auths, "exporters.prometheus"),
            shutdown_timeout=duration(service.get("shutdown_timeout", 5), "service.shutdown_timeout"),
            storage=_storage(merged, procs, tuple(e.name for e in span_exporters)),
        )


def _service_extensions(names: Any, configured: Mapping[str, Any]) -> None:
    """``service.extensions``: upstream lists the extensions to start there; each must be configured."""
    if names is None:
        return
    if not isinstance(names, list):
        raise ConfigError(f"service.extensions: expected a list of extension names, got {names!r}")
    for name in names:
        if name not in configured:
            raise ConfigError(f"service.extensions: {name!r} is not configured under extensions "
                              f"(configured: {', '.join(configured) or 'none'})")


def _merge(base: Any, over: Any) -> Any:
    """Deep-merge mappings; ``over`` wins; lists are replaced whole (as upstream does)."""
    if isinstance(base, dict) and isinstance(over, Mapping):
        out = copy.deepcopy(base)
        for k, v in over.items():
            out[k] = _merge(base.get(k), v) if k in base and v is not None else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def _only(m: Any, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(m, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {m!r}")
    unknown = [k for k in m if str(k).split("/")[0] not in allowed]
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")


def _grpc(m: Any, auths: Mapping[str, BearerTokenConfig]) -> GrpcReceiverConfig | None:
    if m is None:
        return None
    w = "receivers.otlp.protocols.grpc"
    _only(m, ("endpoint", "max_recv_msg_size_mib", "tls", "max_concurrent_requests", "read_timeout", "keepalive",
              "workers", "auth", "peer_share", "min_data_rate", "trusted_peers"), w)
    _no_peer_share(m, w)
    host, port = endpoint(m.get("endpoint"), f"{w}.endpoint")
    keepalive = m.get("keepalive") or {}
    _only(keepalive, ("server_parameters",), f"{w}.keepalive")
    server = keepalive.get("server_parameters") or {}
    _only(server, ("max_connection_age", "max_connection_age_grace"), f"{w}.keepalive.server_parameters")
    ka = f"{w}.keepalive.server_parameters"
    return GrpcReceiverConfig(host, port, positive_int(m.get("max_recv_msg_size_mib"), f"{w}.max_recv_msg_size_mib") << 20,
                              tls=_server_tls(m, f"{w}.tls"),
                              max_concurrent_requests=positive_int(m.get("max_concurrent_requests"),
                                                                   f"{w}.max_concurrent_requests"),
                              read_timeout=_positive_duration(m.get("read_timeout"), f"{w}.read_timeout"),
                              max_connection_age=duration(server.get("max_connection_age", 0),
                                                          f"{ka}.max_connection_age"),
                              max_connection_age_grace=duration(server.get("max_connection_age_grace", 0),
                                                                f"{ka}.max_connection_age_grace"),
                              workers=positive_int(m.get("workers", 0), f"{w}.workers", allow_zero=True),
                              auth=_auth(m, auths, w),
                              min_data_rate=_size_or_zero(m.get("min_data_rate", 1024), f"{w}.min_data_rate"),
                              trusted_peers=_trusted(m.get("trusted_peers"), f"{w}.trusted_peers"))


def _http(m: Any, auths: Mapping[str, BearerTokenConfig]) -> HttpReceiverConfig | None:
    if m is None:
        return None
    w = "receivers.otlp.protocols.http"
    _only(m, ("endpoint", "max_request_body_size", "max_concurrent_requests", "tls", "max_json_body_size",
              "max_connections", "max_header_bytes", "read_header_timeout", "read_timeout", "auth", "peer_share",
              "min_data_rate", "trusted_peers", "max_unauthenticated_connections", "json_workers",
              "json_bytes_per_peer_per_second"), w)
    _no_peer_share(m, w)
    host, port = endpoint(m.get("endpoint"), f"{w}.endpoint")
    return HttpReceiverConfig(host, port, size(m.get("max_request_body_size"), f"{w}.max_request_body_size"),
                              positive_int(m.get("max_concurrent_requests"), f"{w}.max_concurrent_requests"),
                              tls=_server_tls(m, f"{w}.tls"),
                              max_json_body_bytes=size(m.get("max_json_body_size"), f"{w}.max_json_body_size"),
                              max_connections=positive_int(m.get("max_connections"), f"{w}.max_connections"),
                              max_header_bytes=size(m.get("max_header_bytes"), f"{w}.max_header_bytes"),
                              read_header_timeout=_positive_duration(m.get("read_header_timeout"),
                                                                     f"{w}.read_header_timeout"),
                              read_timeout=_positive_duration(m.get("read_timeout"), f"{w}.read_timeout"),
                              auth=_auth(m, auths, w),
                              min_data_rate=_size_or_zero(m.get("min_data_rate", 1024), f"{w}.min_data_rate"),
                              trusted_peers=_trusted(m.get("trusted_peers"), f"{w}.trusted_peers"),
                              max_unauthenticated_connections=positive_int(
                                  m.get("max_unauthenticated_connections", 64), f"{w}.max_unauthenticated_connections"),
                              json_workers=positive_int(m.get("json_workers", 1), f"{w}.json_workers", allow_zero=True),
                              json_bytes_per_peer_per_second=_size_or_zero(
                                  m.get("json_bytes_per_peer_per_second", 4 << 20),
                                  f"{w}.json_bytes_per_peer_per_second"))


def _size_or_zero(value: Any, where: str) -> int:
    return 0 if value == 0 and not isinstance(value, bool) else size(value, where)


def _no_peer_share(m: Mapping, where: str) -> None:
    """``peer_share`` capped a peer even when nothing was contended; shares are now computed (max-min)."""
    if "peer_share" in m:
        raise ConfigError(f"{where}.peer_share: removed - a peer may use free capacity and, when the receiver is "
                          "full, yields idle and slow slots to peers holding fewer (docs/collector-limits.md); "
                          "delete the key (min_data_rate sets what counts as slow)")


def _trusted(value: Any, where: str) -> tuple[str, ...]:
    """``trusted_peers``: a list of addresses or CIDR blocks (checked at load)."""
    from .fairness import parse_network

    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of addresses or CIDR blocks, got {value!r}")
    for i, entry in enumerate(value):
        try:
            parse_network(entry)
        except ValueError as exc:
            raise ConfigError(f"{where}[{i}]: {exc}") from None
    return tuple(e.strip() for e in value)


def _positive_duration(value: Any, where: str) -> float:
    d = duration(value, where)
    if d <= 0:
        raise ConfigError(f"{where}: must be positive, got {value!r}")
    return d


def _labels(m: Any) -> LabelLimits:
    if not m:
        return LabelLimits()
    w = "processors.llm_metrics"
    d = LabelLimits()
    limits = LabelLimits(
        max_label_length=positive_int(m.get("max_label_length", d.max_label_length), f"{w}.max_label_length"),
        label_cache_bytes=size(m.get("label_cache_size", d.label_cache_bytes), f"{w}.label_cache_size"),
        max_series=positive_int(m.get("max_series", d.max_series), f"{w}.max_series"),
        max_series_per_service=positive_int(m.get("max_series_per_service", d.max_series_per_service),
                                            f"{w}.max_series_per_service"),
        max_series_per_tenant=positive_int(m.get("max_series_per_tenant", d.max_series_per_tenant),
                                           f"{w}.max_series_per_tenant"),
        max_series_per_source=positive_int(m.get("max_series_per_source", d.max_series_per_source),
                                           f"{w}.max_series_per_source"))
    if limits.max_series_per_service > limits.max_series:
        raise ConfigError(f"{w}.max_series_per_service ({limits.max_series_per_service}) exceeds "
                          f"{w}.max_series ({limits.max_series})")
    return limits


# -- authentication (upstream bearertokenauth vocabulary) ------------------------------------------

_ENV = re.compile(r"^\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}$")


def _token_text(value: Any, where: str) -> str:
    """A token, or ``${env:NAME}`` (upstream's confmap syntax) read from the environment."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty token string, got {type(value).__name__}")
    m = _ENV.match(value)
    if m:
        import os

        got = os.environ.get(m.group(1))
        if not got:
            raise ConfigError(f"{where}: environment variable {m.group(1)} is not set or empty")
        return got
    return value


def _extensions(m: Any) -> dict[str, BearerTokenConfig]:
    """``extensions: {bearertokenauth[/name]: {scheme, token | tokens | filename, header}}`` -> authenticators."""
    if not m:
        return {}
    _only(m, ("bearertokenauth", "file_storage"), "extensions")
    out = {}
    for name, spec in m.items():
        if name.split("/")[0] == "file_storage":  # read by _storage
            continue
        w = f"extensions.{name}"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{w}: expected a mapping with token, tokens or filename")
        _only(spec, ("scheme", "token", "tokens", "filename", "header", "tenants"), w)
        sources = [k for k in ("token", "tokens", "filename", "tenants") if k in spec]
        if len(sources) != 1:
            raise ConfigError(f"{w}: set exactly one of token, tokens, filename, tenants (got {sources or 'none'})")
        tenants: list[str] = []
        if "tenants" in spec:  # {tenant name: token}: a tenant per token, named in counters
            if not isinstance(spec["tenants"], Mapping) or not spec["tenants"]:
                raise ConfigError(f"{w}.tenants: expected a non-empty mapping of tenant name to token")
            tenants = [str(k) for k in spec["tenants"]]
            tokens = [_token_text(t, f"{w}.tenants.{k}") for k, t in spec["tenants"].items()]
        elif "token" in spec:
            tokens = [_token_text(spec["token"], f"{w}.token")]
        elif "tokens" in spec:
            if not isinstance(spec["tokens"], list) or not spec["tokens"]:
                raise ConfigError(f"{w}.tokens: expected a non-empty list")
            tokens = [_token_text(t, f"{w}.tokens[{i}]") for i, t in enumerate(spec["tokens"])]
        else:
            path = spec["filename"]
            try:
                with open(path, encoding="utf-8") as f:
                    tokens = [line.strip() for line in f if line.strip()]
            except (OSError, TypeError) as exc:
                raise ConfigError(f"{w}.filename: cannot read {path!r}: {exc}") from None
            if not tokens:
                raise ConfigError(f"{w}.filename: {path} holds no token")
        scheme = spec.get("scheme", "Bearer")
        header = spec.get("header", "authorization")
        if not isinstance(scheme, str) or not isinstance(header, str) or not header:
            raise ConfigError(f"{w}: scheme and header must be strings")
        out[name] = BearerTokenConfig(tuple(t.encode() for t in tokens), scheme, header.lower(), tuple(tenants))
    return out


def _auth(m: Any, auths: Mapping[str, BearerTokenConfig], where: str) -> BearerTokenConfig | None:
    """A section's ``auth: {authenticator: <extension name>}``."""
    if not isinstance(m, Mapping) or m.get("auth") is None:
        return None
    a = m["auth"]
    if not isinstance(a, Mapping):
        raise ConfigError(f"{where}.auth: expected {{authenticator: bearertokenauth}}")
    _only(a, ("authenticator",), f"{where}.auth")
    name = a.get("authenticator")
    if name not in auths:
        raise ConfigError(f"{where}.auth.authenticator: no extension {name!r} is configured "
                          f"(configured: {', '.join(auths) or 'none'})")
    return auths[name]


def _slo(m: Any) -> SLOTable:
    if not m:
        return SLOTable()
    _only(m, ("slo", "max_label_length", "label_cache_size", "max_series", "max_series_per_service",
              "max_series_per_tenant", "max_series_per_source"),
          "processors.llm_metrics")
    try:
        return SLOTable.coerce(m.get("slo") or None)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"processors.llm_metrics.slo: {exc}") from None


def _tail(m: Any) -> TailSamplingConfig | None:
    if m is None:
        return None
    w = "processors.tail_sampling"
    _only(m, ("decision_wait", "decision_wait_after_root_received", "num_traces", "max_buffer_bytes",
              "expected_new_traces_per_sec", "tick_interval", "decision_cache", "policies", "storage"), w)
    cache = m.get("decision_cache") or {}
    _only(cache, ("sampled_cache_size", "non_sampled_cache_size"), f"{w}.decision_cache")
    policies = m.get("policies")
    if not isinstance(policies, list) or not policies:
        raise ConfigError(f"{w}.policies: expected a non-empty list of policies")
    try:  # checked now, so a bad policy fails at load with its name; built when a gateway starts
        specs = parse_policies(policies)
    except PolicyConfigError as exc:
        raise ConfigError(f"{w}.policies: {exc}") from None
    cfg = TailSamplingConfig(
        decision_wait=duration(m.get("decision_wait"), f"{w}.decision_wait"),
        decision_wait_after_root_received=duration(m.get("decision_wait_after_root_received"),
                                                   f"{w}.decision_wait_after_root_received"),
        num_traces=positive_int(m.get("num_traces"), f"{w}.num_traces"),
        max_buffer_bytes=size(m.get("max_buffer_bytes"), f"{w}.max_buffer_bytes"),
        expected_new_traces_per_sec=positive_int(m.get("expected_new_traces_per_sec"),
                                                 f"{w}.expected_new_traces_per_sec", allow_zero=True),
        tick_interval=duration(m.get("tick_interval"), f"{w}.tick_interval"),
        sampled_cache_size=positive_int(cache.get("sampled_cache_size"), f"{w}.decision_cache.sampled_cache_size",
                                        allow_zero=True),
        non_sampled_cache_size=positive_int(cache.get("non_sampled_cache_size"),
                                            f"{w}.decision_cache.non_sampled_cache_size", allow_zero=True),
        policies=specs,
    )
    if cfg.tick_interval <= 0:
        raise ConfigError(f"{w}.tick_interval must be positive")
    return cfg


def _exporter(key: str, m: Any) -> ExporterConfig:
    kind = key.split("/")[0]
    w = f"exporters.{key}"
    if kind not in EXPORTER_TYPES:
        raise ConfigError(f"{w}: unknown exporter type {kind!r}; known: {', '.join(EXPORTER_TYPES)}")
    if not isinstance(m, Mapping):
        raise ConfigError(f"{w}: expected a mapping")
    _only(m, ("endpoint", "path", "timeout", "headers", "compression", "sending_queue", "retry_on_failure",
              "tls"), w)
    if kind == "file":
        if not isinstance(m.get("path"), str) or not m.get("path"):
            raise ConfigError(f"{w}.path: the file exporter needs a path")
    elif not isinstance(m.get("endpoint"), str) or not m.get("endpoint"):
        raise ConfigError(f"{w}.endpoint: the {kind} exporter needs an endpoint")
    if kind in GRPC_EXPORTERS:
        endpoint(m["endpoint"].removeprefix("http://").removeprefix("https://"), f"{w}.endpoint")
    if kind == "file" and "tls" in m:
        raise ConfigError(f"{w}.tls: the file exporter has no TLS")
    queue = m.get("sending_queue") or {}
    retry = m.get("retry_on_failure") or {}
    _only(queue, ("enabled", "queue_size", "storage"), f"{w}.sending_queue")
    _only(retry, ("enabled", "initial_interval", "max_interval", "max_elapsed_time"), f"{w}.retry_on_failure")
    compression = m.get("compression", "none")
    if compression not in ("none", "gzip"):
        raise ConfigError(f"{w}.compression: expected none or gzip, got {compression!r}")
    headers = m.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise ConfigError(f"{w}.headers: expected a mapping")
    return ExporterConfig(
        name=key, type=kind, endpoint=str(m.get("endpoint") or ""), path=str(m.get("path") or ""),
        timeout=duration(m.get("timeout", 5), f"{w}.timeout"),
        headers={str(k): str(v) for k, v in headers.items()}, compression=compression,
        queue_size=positive_int(queue.get("queue_size", 1000), f"{w}.sending_queue.queue_size"),
        retry=RetryConfig(
            enabled=bool(retry.get("enabled", True)),
            initial_interval=duration(retry.get("initial_interval", 0.1), f"{w}.retry_on_failure.initial_interval"),
            max_interval=duration(retry.get("max_interval", 5), f"{w}.retry_on_failure.max_interval"),
            max_elapsed_time=duration(retry.get("max_elapsed_time", 30), f"{w}.retry_on_failure.max_elapsed_time"),
        ),
        tls=_client_tls(kind, m, w) if kind != "file" else None,
    )


def _prometheus(exps: Mapping[str, Any]) -> tuple[str, int] | None:
    m = exps.get("prometheus")
    if m is None:
        return None
    _only(m, ("endpoint", "auth", "enable_open_metrics"), "exporters.prometheus")
    if not isinstance(m.get("enable_open_metrics", False), bool):
        raise ConfigError(f"exporters.prometheus.enable_open_metrics: expected true or false, "
                          f"got {m['enable_open_metrics']!r}")
    return endpoint(m.get("endpoint"), "exporters.prometheus.endpoint")


# -- TLS ------------------------------------------------------------------------------------------

# Upstream configtls keys we do not implement, with why: refused by name, never ignored.
_TLS_UNSUPPORTED = {
    "ca_pem": "use ca_file", "cert_pem": "use cert_file", "key_pem": "use key_file",
    "include_system_ca_certs_pool": "ca_file replaces the system roots; put both in one bundle",
    "min_version": "the gateway always requires TLS >= 1.2", "max_version": "not configurable here",
    "cipher_suites": "the TLS library's defaults are used", "include_insecure_cipher_suites": "never enabled",
    "curve_preferences": "the TLS library's defaults are used",
    "reload_interval": "certificates are read once at start; restart to rotate them",
    "client_ca_file_reload": "certificates are read once at start; restart to rotate them",
    "tpm": "keys are read from key_file",
}
_TLS_CLIENT_KEYS = ("insecure", "insecure_skip_verify", "ca_file", "cert_file", "key_file", "server_name_override")
_TLS_SERVER_KEYS = ("cert_file", "key_file", "client_ca_file")


def _no_password() -> bytes:
    return b""  # an encrypted key fails to load, instead of OpenSSL prompting for its password on a tty


def _tls_mapping(m: Any, where: str, allowed: tuple[str, ...], extra_refused: Mapping[str, str]) -> Mapping:
    if not isinstance(m, Mapping):
        raise ConfigError(f"{where}: expected a mapping of TLS settings, got {m!r} "
                          "(exporters: {} for TLS with the system roots, {insecure: true} for plaintext)")
    refused = {**_TLS_UNSUPPORTED, **extra_refused}
    for k in m:
        if k in refused:
            raise ConfigError(f"{where}.{k}: this upstream TLS setting is not supported by the gateway "
                              f"({refused[k]}); supported: {', '.join(allowed)}")
    _only(m, allowed, where)
    return m


def _pem_file(m: Mapping, key: str, where: str) -> str | None:
    """The path in ``m[key]``, checked to be a readable PEM file; None when absent."""
    if key not in m:
        return None
    path, w = m[key], f"{where}.{key}"
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{w}: expected a file path, got {path!r}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"{w}: cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{w}: {path} is not a PEM file")
    return path


def _key_pair(m: Mapping, where: str, required: bool) -> tuple[str | None, str | None]:
    """cert_file and key_file: both or neither (both when ``required``), and a matching pair."""
    cert, key = _pem_file(m, "cert_file", where), _pem_file(m, "key_file", where)
    if required and cert is None and key is None:
        raise ConfigError(f"{where}: a TLS receiver needs cert_file and key_file")
    if (cert is None) != (key is None):
        missing, present = ("key_file", "cert_file") if key is None else ("cert_file", "key_file")
        raise ConfigError(f"{where}.{missing}: missing; {present} is set and the two go together")
    if cert is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=_no_password)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{where}.key_file: {key} is not the (unencrypted) key of {where}.cert_file "
                              f"{cert}: {exc}") from None
    return cert, key


def _ca_file(m: Mapping, key: str, where: str) -> str | None:
    path = _pem_file(m, key, where)
    if path is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{where}.{key}: {path} holds no usable CA certificate: {exc}") from None
    return path


def _server_tls(m: Mapping, where: str) -> TLSServerConfig | None:
    if "tls" not in m:
        return None
    t = _tls_mapping(m["tls"], where, _TLS_SERVER_KEYS,
                     {"ca_file": "on a receiver, client_ca_file is the CA that verifies clients"})
    cert, key = _key_pair(t, where, required=True)
    assert cert is not None and key is not None
    return TLSServerConfig(cert, key, _ca_file(t, "client_ca_file", where))


def _client_tls(kind: str, m: Mapping, w: str) -> TLSClientConfig | None:
    """An exporter's TLS, or None for plaintext; the endpoint's scheme must agree with ``tls``."""
    scheme = m["endpoint"].split("://", 1)[0].lower() if "://" in m["endpoint"] else ""
    if "tls" not in m:
        return TLSClientConfig() if scheme == "https" else None  # https:// alone: TLS, system roots
    where = f"{w}.tls"
    extra = {"insecure_skip_verify": "Python gRPC cannot skip verification; set ca_file to the server's CA"} \
        if kind in GRPC_EXPORTERS else {}
    t = _tls_mapping(m["tls"], where, _TLS_CLIENT_KEYS, extra)
    flags = {k: t.get(k, False) for k in ("insecure", "insecure_skip_verify")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise ConfigError(f"{where}.{k}: expected true or false, got {v!r}")
    if flags["insecure"]:
        others = [k for k in t if k != "insecure"]
        if others:
            raise ConfigError(f"{where}: insecure: true turns TLS off, so {others} would be ignored; "
                              "remove them or drop insecure")
        if scheme == "https":
            raise ConfigError(f"{w}.endpoint: https:// asks for TLS but {where}.insecure is true")
        return None
    if scheme == "http":
        raise ConfigError(f"{w}.endpoint: http:// means plaintext but {where} asks for TLS; "
                          "use https:// (or no scheme), or tls: {insecure: true}")
    name = t.get("server_name_override", "")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.server_name_override: expected a host name, got {name!r}")
    ca = _ca_file(t, "ca_file", where)
    if flags["insecure_skip_verify"] and ca is not None:
        raise ConfigError(f"{where}: insecure_skip_verify: true verifies nothing, so ca_file would be ignored; "
                          "remove one of them")
    cert, key = _key_pair(t, where, required=False)
    return TLSClientConfig(ca_file=ca, cert_file=cert, key_file=key,
                           insecure_skip_verify=flags["insecure_skip_verify"], server_name_override=name)


# -- durable logs: the file_storage extension and what uses it ----------------------------------------

@dataclass(frozen=True)
class FileStorageConfig:
    """``extensions: {file_storage[/name]: {directory, fsync, create_directory, max_size}}``: where durable logs
    live (one directory per log under ``directory``). ``max_size`` (ours, not upstream's) is each log's disk
    budget."""

    name: str
    directory: str
    fsync: bool = False  # upstream's default: a killed process loses nothing; a power loss may
    max_bytes: int = 1 << 30


@dataclass(frozen=True)
class StorageConfig:
    """Which logs are durable: ``exporters.<name>.sending_queue.storage`` and ``processors.tail_sampling.storage``
    name a ``file_storage`` extension. Nothing is durable by default."""

    extensions: Mapping[str, FileStorageConfig] = field(default_factory=dict)
    exporters: Mapping[str, str] = field(default_factory=dict)  # exporter name -> extension name
    tail_sampling: str | None = None  # extension name for the write-ahead log of undecided batches

    def for_exporter(self, name: str) -> FileStorageConfig | None:
        ext = self.exporters.get(name)
        return self.extensions[ext] if ext is not None else None

    @property
    def received(self) -> FileStorageConfig | None:
        return self.extensions[self.tail_sampling] if self.tail_sampling is not None else None


def _storage(merged: Mapping[str, Any], procs: Mapping[str, Any], span_exporters: tuple[str, ...]) -> StorageConfig:
    """The ``file_storage`` extensions, and the exporters' and the tail sampler's ``storage`` references.
    ``procs``/``span_exporters``: the processors and trace exporters that run (``service.pipelines``); only
    traces are durable, so only the trace exporters must keep their queue on disk."""
    extensions: dict[str, FileStorageConfig] = {}
    for name, spec in (merged.get("extensions") or {}).items():
        if name.split("/")[0] != "file_storage":
            continue
        w = f"extensions.{name}"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{w}: expected a mapping with a directory")
        _only(spec, ("directory", "fsync", "create_directory", "max_size"), w)
        directory = spec.get("directory")
        if not isinstance(directory, str) or not directory:
            raise ConfigError(f"{w}.directory: the directory the logs live in is required")
        for key in ("fsync", "create_directory"):
            if not isinstance(spec.get(key, False), bool):
                raise ConfigError(f"{w}.{key}: expected true or false, got {spec[key]!r}")
        if spec.get("create_directory", False):
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"{w}.directory: cannot create {directory}: {exc}") from None
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"{w}.directory: {directory} is not a writable directory (create_directory: true "
                              "creates it)")
        extensions[name] = FileStorageConfig(name, directory, spec.get("fsync", False),
                                             size(spec.get("max_size", 1 << 30), f"{w}.max_size"))

    def ref(value: Any, where: str) -> str:
        if value not in extensions:
            raise ConfigError(f"{where}: {value!r} is not a file_storage extension; defined: "
                              f"{', '.join(extensions) or 'none'}")
        return value

    exporters: dict[str, str] = {}
    for key, m in (merged.get("exporters") or {}).items():
        if isinstance(m, Mapping) and isinstance(m.get("sending_queue"), Mapping) \
                and m["sending_queue"].get("storage") is not None:
            exporters[key] = ref(m["sending_queue"]["storage"], f"exporters.{key}.sending_queue.storage")
    tail = procs.get("tail_sampling")
    received = None
    if isinstance(tail, Mapping) and tail.get("storage") is not None:
        received = ref(tail["storage"], "processors.tail_sampling.storage")
        volatile = [k for k in span_exporters if k not in exporters]
        if volatile:  # a decided trace would leave the log for a queue a crash empties
            raise ConfigError(f"processors.tail_sampling.storage: exporters {volatile} keep their queue in memory; "
                              "give each `sending_queue: {storage: ...}` too, or nothing kept is durable")
    return StorageConfig(extensions, exporters, received)
