"""Which tracer and meter providers we use: the caller's, else the global ones, else our own from ``OTEL_*``.

Our own providers are never installed as the global ones: vLLM and TensorRT-LLM call
``set_tracer_provider`` themselves when their native tracing is on, and OpenTelemetry
allows that once per process. We do not take that slot from them. One we build belongs to the
instrumentor that asked for it: it is handed to that instrumentor's ``Lifecycle``, which shuts it
down after the telemetry sending through it was flushed (at exit, or at uninstrument).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import uuid
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from .. import semconv as sc
from ..lifecycle import PROVIDERS, Lifecycle

logger = logging.getLogger("otel_llm")


TRACER_PROVIDER = "tracer provider"  # the names of the providers we build, in their owner's Lifecycle
METER_PROVIDER = "meter provider"


def tracer_provider_from(given: TracerProvider | None, owner: Lifecycle) -> TracerProvider:
    if given is not None:
        return given
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):
        return current
    provider = _sdk_tracer_provider()
    owner.add(TRACER_PROVIDER, provider.shutdown, PROVIDERS)
    return provider


def meter_provider_from(given: MeterProvider | None, owner: Lifecycle) -> MeterProvider:
    if given is not None:
        return given
    current = metrics.get_meter_provider()
    if not type(current).__name__.startswith("_Proxy"):
        return current
    provider = _sdk_meter_provider()
    owner.add(METER_PROVIDER, provider.shutdown, PROVIDERS)
    return provider


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


def _sdk_tracer_provider() -> TracerProvider:
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    # shut down by its owner's Lifecycle, after the telemetry that sends through it (not by its own exit hook)
    provider = SDKTracerProvider(resource=resource(), shutdown_on_exit=False)
    for exporter in _exporters("OTEL_TRACES_EXPORTER", "TRACES", ConsoleSpanExporter):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _sdk_meter_provider() -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    readers = [PeriodicExportingMetricReader(e)
               for e in _exporters("OTEL_METRICS_EXPORTER", "METRICS", ConsoleMetricExporter)]
    return SDKMeterProvider(resource=resource(), metric_readers=readers, shutdown_on_exit=False)

