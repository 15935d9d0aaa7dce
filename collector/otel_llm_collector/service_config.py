"""The config's ``service`` section in the upstream Collector's terms: ``telemetry`` and ``pipelines``.

``service.telemetry`` configures the gateway's own telemetry as upstream's does::

    service:
      telemetry:
        metrics:
          level: normal            # none | basic (upstream names only) | normal | detailed
          address: 0.0.0.0:8888    # own telemetry on its own endpoint (else: on the Prometheus exporter's)
          # or upstream's newer form, one pull reader:
          # readers: [{pull: {exporter: {prometheus: {host: 0.0.0.0, port: 8888}}}}]
        logs: {level: info}        # debug | info | warn | error

``service.pipelines`` is accepted where it describes what the gateway does - one ``traces`` pipeline
(receiver ``otlp``; processors ``llm_metrics`` and ``tail_sampling``, in that order, each optional;
span exporters), a ``metrics`` pipeline for OTLP metrics it receives (exporters: ``prometheus`` and/or
OTLP exporters) and a ``logs`` pipeline (OTLP exporters) - and honoured as upstream honours it: a
processor or exporter that no pipeline names is not run, and a signal without a pipeline is refused
(HTTP 404, gRPC UNIMPLEMENTED). What the gateway cannot do (other receivers, processors or pipelines,
a second pipeline of a signal, ``connectors``) is refused with an error naming it.

Without ``service.pipelines``: traces go through both processors to every span exporter, received
metrics to the Prometheus endpoint, received logs are accepted and counted as dropped (one warning
says how to route them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

PROCESSORS = ("llm_metrics", "tail_sampling")  # the gateway's one processing order
SPAN_EXPORTERS = ("otlp", "otlp_grpc", "otlphttp", "file")
OTLP_EXPORTERS = ("otlp", "otlp_grpc", "otlphttp")  # the exporters that carry metrics and logs too
LEVELS = ("none", "basic", "normal", "detailed")
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
              "error": logging.ERROR}


class ServiceConfigError(ValueError):
    """Raised with the offending key's path; config.py turns it into its ConfigError."""


@dataclass(frozen=True)
class TelemetryConfig:
    level: str = "normal"
    address: tuple[str, int] | None = None  # own telemetry on its own endpoint; None: on the Prometheus exporter's
    log_level: int | None = None  # the gateway's logger level; None: as the process configured it


@dataclass(frozen=True)
class Pipelines:
    """What ``service.pipelines`` selected (``given`` False: the gateway's defaults)."""

    given: bool = False
    processors: tuple[str, ...] = PROCESSORS  # the traces pipeline's processors (in order)
    span_exporters: tuple[str, ...] | None = None  # None: every configured span exporter
    metrics: tuple[str, ...] | None = ("prometheus",)  # where received metrics go; None: metrics refused
    logs: tuple[str, ...] | None = ()  # where received logs go (OTLP exporters); None: logs refused


def _mapping(m: Any, where: str) -> Mapping:
    if not isinstance(m, Mapping):
        raise ServiceConfigError(f"{where}: expected a mapping, got {m!r}")
    return m


def _only(m: Mapping, allowed: tuple[str, ...], where: str, why: str = "") -> None:
    unknown = [k for k in m if k not in allowed]
    if unknown:
        raise ServiceConfigError(f"{where}: unknown or unsupported key(s) {unknown}; allowed: {', '.join(allowed)}"
                                 + (f" ({why})" if why else ""))


def _endpoint(value: Any, where: str) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise ServiceConfigError(f"{where}: expected host:port, got {value!r}")
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ServiceConfigError(f"{where}: bad port in {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_telemetry(m: Any) -> TelemetryConfig:
    if m is None:
        return TelemetryConfig()
    w = "service.telemetry"
    m = _mapping(m, w)
    _only(m, ("metrics", "logs"), w, "the gateway exports no traces of its own")
    metrics = _mapping(m.get("metrics") or {}, f"{w}.metrics")
    _only(metrics, ("level", "address", "readers"), f"{w}.metrics")
    level = str(metrics.get("level", "normal")).lower()
    if level not in LEVELS:
        raise ServiceConfigError(f"{w}.metrics.level: expected one of {', '.join(LEVELS)}, got {metrics['level']!r}")
    address = None
    if "address" in metrics and "readers" in metrics:
        raise ServiceConfigError(f"{w}.metrics: set address or readers, not both")
    if metrics.get("address") is not None:
        address = _endpoint(metrics["address"], f"{w}.metrics.address")
    elif metrics.get("readers") is not None:
        address = _reader(metrics["readers"], f"{w}.metrics.readers")
    logs = _mapping(m.get("logs") or {}, f"{w}.logs")
    _only(logs, ("level",), f"{w}.logs", "the gateway logs to stderr")
    log_level = None
    if "level" in logs:
        name = str(logs["level"]).lower()
        if name not in LOG_LEVELS:
            raise ServiceConfigError(f"{w}.logs.level: expected debug, info, warn or error, got {logs['level']!r}")
        log_level = LOG_LEVELS[name]
    return TelemetryConfig(level, address, log_level)


def _reader(readers: Any, where: str) -> tuple[str, int]:
    """Upstream's ``readers`` list: the gateway serves one Prometheus pull endpoint, nothing else."""
    if not isinstance(readers, list) or len(readers) != 1:
        raise ServiceConfigError(f"{where}: the gateway serves one pull reader (its Prometheus endpoint); got "
                                 f"{readers!r}")
    r = _mapping(readers[0], f"{where}[0]")
    if "periodic" in r:
        raise ServiceConfigError(f"{where}[0].periodic: the gateway does not push its own metrics; use "
                                 "pull: {exporter: {prometheus: {host, port}}}")
    _only(r, ("pull",), f"{where}[0]")
    pull = _mapping(r["pull"], f"{where}[0].pull")
    _only(pull, ("exporter",), f"{where}[0].pull")
    exporter = _mapping(pull.get("exporter"), f"{where}[0].pull.exporter")
    _only(exporter, ("prometheus",), f"{where}[0].pull.exporter")
    prom = _mapping(exporter["prometheus"], f"{where}[0].pull.exporter.prometheus")
    _only(prom, ("host", "port"), f"{where}[0].pull.exporter.prometheus")
    port = prom.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServiceConfigError(f"{where}[0].pull.exporter.prometheus.port: expected a port, got {port!r}")
    return str(prom.get("host") or "0.0.0.0"), port


def parse_pipelines(m: Any, processors: tuple[str, ...], exporters: Mapping[str, str],
                    extensions: tuple[str, ...] = ()) -> Pipelines:
    """``processors``: the configured processors; ``exporters``: configured exporter name -> type."""
    if m is None:
        return Pipelines()
    w = "service.pipelines"
    m = _mapping(m, w)
    signals = {}
    for key, spec in m.items():
        signal = str(key).split("/", 1)[0]
        if signal not in ("traces", "metrics", "logs"):
            raise ServiceConfigError(f"{w}.{key}: the gateway has traces, metrics and logs pipelines only")
        if signal != key:
            raise ServiceConfigError(f"{w}.{key}: the gateway runs one {signal} pipeline; name it {signal!r}")
        signals[signal] = _pipeline(spec, f"{w}.{key}", signal, processors, exporters)
    traces = signals.get("traces")
    if traces is None:
        raise ServiceConfigError(f"{w}: a traces pipeline is required (the gateway's reason to run)")
    procs, span_exporters = traces
    return Pipelines(True, procs, span_exporters,
                     signals["metrics"][1] if "metrics" in signals else None,
                     signals["logs"][1] if "logs" in signals else None)


def _pipeline(spec: Any, where: str, signal: str, processors: tuple[str, ...],
              exporters: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    spec = _mapping(spec, where)
    _only(spec, ("receivers", "processors", "exporters"), where)
    receivers = spec.get("receivers")
    if receivers != ["otlp"]:
        raise ServiceConfigError(f"{where}.receivers: the gateway has one receiver, otlp; got {receivers!r}")
    procs = spec.get("processors") or []
    if not isinstance(procs, list):
        raise ServiceConfigError(f"{where}.processors: expected a list, got {procs!r}")
    if signal != "traces" and procs:
        raise ServiceConfigError(f"{where}.processors: the gateway passes {signal} on unprocessed; "
                                 f"remove {procs}")
    for p in procs:
        if p not in PROCESSORS:
            raise ServiceConfigError(f"{where}.processors: the gateway has no processor {p!r} (it runs "
                                     f"{' and '.join(PROCESSORS)}, in that order)")
        if p not in processors:
            raise ServiceConfigError(f"{where}.processors: {p!r} is not configured under processors")
    if len(set(procs)) != len(procs) or list(procs) != [p for p in PROCESSORS if p in procs]:
        raise ServiceConfigError(f"{where}.processors: {procs} - the gateway derives metrics before it samples: "
                                 f"list {' then '.join(PROCESSORS)} (each at most once)")
    exps = spec.get("exporters")
    if not isinstance(exps, list) or not exps:
        raise ServiceConfigError(f"{where}.exporters: expected a non-empty list of configured exporters")
    allowed = {"traces": SPAN_EXPORTERS, "metrics": ("prometheus",) + OTLP_EXPORTERS, "logs": OTLP_EXPORTERS}[signal]
    for e in exps:
        if e not in exporters:
            raise ServiceConfigError(f"{where}.exporters: {e!r} is not configured under exporters "
                                     f"(configured: {', '.join(exporters) or 'none'})")
        if exporters[e] not in allowed:
            raise ServiceConfigError(f"{where}.exporters: the {exporters[e]} exporter {e!r} cannot take {signal}; "
                                     f"{signal} go to {', '.join(allowed)} exporters")
    return tuple(procs), tuple(exps)
