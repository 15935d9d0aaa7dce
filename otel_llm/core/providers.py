"""Which tracer and meter providers we use: the caller's, else the global ones, else our own from ``OTEL_*``.

Our own providers are never installed as the global ones: vLLM and TensorRT-LLM call
``set_tracer_provider`` themselves when their native tracing is on, and OpenTelemetry
allows that once per process. We do not take that slot from them. One we build belongs to the
instrumentor that asked for it: it is handed to that instrumentor's ``Lifecycle``, which shuts it
down after the telemetry sending through it was flushed (at exit, or at uninstrument).

Building them says once, at INFO, where the telemetry goes. Their shutdown is bounded (``SHUTDOWN_S``): an
exporter that answers takes milliseconds, one with nothing listening would hold the exit for its retry
back-off (the SDK's 10 s export timeout per signal); past the bound its exporters are shut down, which
ends the back-off, and what was still unsent is dropped.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from .. import semconv as sc
from ..lifecycle import PROVIDERS, Lifecycle

logger = logging.getLogger("otel_llm")


TRACER_PROVIDER = "tracer provider"  # the names of the providers we build, in their owner's Lifecycle
METER_PROVIDER = "meter provider"
# What exit waits for the last exports of the providers one instrumentor built (both signals together)
# before their exporters are shut down.
SHUTDOWN_S = 1.0


def providers_from(tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None,
                   owner: Lifecycle) -> tuple[TracerProvider, MeterProvider]:
    """Both providers (``tracer_provider_from``, ``meter_provider_from``); where either is built here, one
    INFO line says where its telemetry goes."""
    built: list[str] = []
    budget = ExitBudget(SHUTDOWN_S)  # one for both: their shutdowns run one after the other
    tp = tracer_provider_from(tracer_provider, owner, built, budget)
    mp = meter_provider_from(meter_provider, owner, built, budget)
    if built:
        logger.info("otel-llm: no global %s provider; exporting %s", " or ".join(n.split()[0] for n in built),
                    "; ".join(built))
    return tp, mp


def tracer_provider_from(given: TracerProvider | None, owner: Lifecycle, built: list[str] | None = None,
                         budget: "ExitBudget | None" = None) -> TracerProvider:
    if given is not None:
        return given
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):
        return current
    exporters: list[Any] = []
    provider = _sdk_tracer_provider(exporters)
    owner.add(TRACER_PROVIDER, BoundedShutdown(provider, exporters, budget or ExitBudget(SHUTDOWN_S)), PROVIDERS)
    if built is not None:
        built.append(f"traces {destination('TRACES', exporters)}")
    return provider


def meter_provider_from(given: MeterProvider | None, owner: Lifecycle, built: list[str] | None = None,
                        budget: "ExitBudget | None" = None) -> MeterProvider:
    if given is not None:
        return given
    current = metrics.get_meter_provider()
    if not type(current).__name__.startswith("_Proxy"):
        return current
    exporters: list[Any] = []
    provider = _sdk_meter_provider(exporters)
    owner.add(METER_PROVIDER, BoundedShutdown(provider, exporters, budget or ExitBudget(SHUTDOWN_S)), PROVIDERS)
    if built is not None:
        built.append(f"metrics {destination('METRICS', exporters)}")
    return provider


class ExitBudget:
    """Seconds that shutdowns sharing it may take together, counted from the first one's start on ``clock``."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._until: float | None = None

    def left(self) -> float:
        now = self.clock()
        if self._until is None:
            self._until = now + self.seconds
        return max(self._until - now, 0.0)


class BoundedShutdown:
    """The closer of a provider we built: its ``shutdown()``, with its ``exporters`` shut down when the
    ``budget`` is spent if that has not returned (an OTLP exporter's shutdown ends its retry back-off).
    ``timer`` makes the daemon timer that cuts (``threading.Timer``'s signature: seconds, function)."""

    def __init__(self, provider: Any, exporters: list[Any], budget: ExitBudget,
                 timer: Callable[[float, Callable[[], None]], Any] = threading.Timer) -> None:
        self.provider = provider
        self.exporters = exporters
        self.budget = budget
        self.timer = timer

    def __call__(self) -> None:
        timer = self.timer(self.budget.left(), self._cut)
        timer.daemon = True
        timer.start()
        try:
            self.provider.shutdown()
        finally:
            timer.cancel()

    def _cut(self) -> None:
        for exporter in self.exporters:
            try:
                exporter.shutdown()
            except Exception:  # already shut down, or failing: the provider's own shutdown goes on
                pass


def destination(signal: str, exporters: list[Any]) -> str:
    """Where one signal's exporters send, from the ``OTEL_*`` settings they read: ``over OTLP/HTTP to
    http://localhost:4318/v1/traces (the default: ...)``, ``to the console``..."""
    if not exporters:
        return f"nowhere (OTEL_{signal}_EXPORTER=none)"
    out = []
    for exporter in exporters:
        if type(exporter).__name__.startswith("Console"):
            out.append("to the console")
            continue
        grpc = ".grpc." in type(exporter).__module__
        own = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if own:
            where = own
        elif grpc:
            where = base or "http://localhost:4317"
        else:
            where = (base or "http://localhost:4318").rstrip("/") + f"/v1/{signal.lower()}"
        out.append(f"over OTLP/{'gRPC' if grpc else 'HTTP'} to {where}"
                   + ("" if own or base else " (the default: OTEL_EXPORTER_OTLP_ENDPOINT unset)"))
    return " and ".join(out)


def _exporter_names(var: str) -> list[str]:
    return [n.strip().lower() for n in os.environ.get(var, "otlp").split(",") if n.strip()]


def _protocol(signal: str) -> str:
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()


def _exporters(var: str, signal: str, console: Any) -> list[Any]:
    """The exporters ``OTEL_{TRACES,METRICS}_EXPORTER`` names (default otlp), OTLP over the
    protocol ``OTEL_EXPORTER_OTLP[_SIGNAL]_PROTOCOL`` names (default http/protobuf)."""
    out = []
    for name in _exporter_names(var):
        if name == "none":
            continue
        if name == "console":
            out.append(console())
        elif name == "otlp":
            transport = "grpc" if _protocol(signal) == "grpc" else "http"
            kind = "trace_exporter" if signal == "TRACES" else "metric_exporter"
            cls = "OTLPSpanExporter" if signal == "TRACES" else "OTLPMetricExporter"
            module = importlib.import_module(f"opentelemetry.exporter.otlp.proto.{transport}.{kind}")
            out.append(getattr(module, cls)())
        else:
            logger.warning("otel-llm: %s=%s is not supported here; ignored", var, name)
    return out


@functools.lru_cache(maxsize=4)
def _instance_id(pid: int) -> str:
    """This process's ``service.instance.id`` (keyed by pid: a forked child is another instance)."""
    return str(uuid.uuid4())


def resource() -> Any:
    """The resource of the providers we build: the SDK's (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``),
    with a ``service.instance.id`` per process where neither the user nor the SDK set one (SDK releases before
    1.35 set none: ``vllm serve --api-server-count N`` would write N processes' points into one series)."""
    from opentelemetry.sdk.resources import Resource

    created = Resource.create()
    if created.attributes.get(sc.SERVICE_INSTANCE_ID):
        return created
    return created.merge(Resource({sc.SERVICE_INSTANCE_ID: _instance_id(os.getpid())}))


def _sdk_tracer_provider(exporters: list[Any] | None = None) -> TracerProvider:
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    # shut down by its owner's Lifecycle, after the telemetry that sends through it (not by its own exit hook)
    provider = SDKTracerProvider(resource=resource(), shutdown_on_exit=False)
    for exporter in _exporters("OTEL_TRACES_EXPORTER", "TRACES", ConsoleSpanExporter):
        provider.add_span_processor(BatchSpanProcessor(exporter))
        if exporters is not None:
            exporters.append(exporter)
    return provider


def _sdk_meter_provider(exporters: list[Any] | None = None) -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    made = _exporters("OTEL_METRICS_EXPORTER", "METRICS", ConsoleMetricExporter)
    if exporters is not None:
        exporters.extend(made)
    readers = [PeriodicExportingMetricReader(e) for e in made]
    return SDKMeterProvider(resource=resource(), metric_readers=readers, shutdown_on_exit=False)

