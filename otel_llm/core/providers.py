"""Which tracer and meter providers we use: the caller's, else the global ones, else our own from ``OTEL_*``.

Our own providers are never installed as the global ones: vLLM and TensorRT-LLM call
``set_tracer_provider`` themselves when their native tracing is on, and OpenTelemetry
allows that once per process. We do not take that slot from them.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

logger = logging.getLogger("otel_llm")


def tracer_provider_from(given: TracerProvider | None) -> TracerProvider:
    if given is not None:
        return given
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):
        return current
    return _sdk_tracer_provider()


def meter_provider_from(given: MeterProvider | None) -> MeterProvider:
    if given is not None:
        return given
    current = metrics.get_meter_provider()
    if not type(current).__name__.startswith("_Proxy"):
        return current
    return _sdk_meter_provider()


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


def _sdk_tracer_provider() -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = SDKTracerProvider(resource=Resource.create())
    for exporter in _exporters("OTEL_TRACES_EXPORTER", "TRACES", ConsoleSpanExporter):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    atexit.register(provider.shutdown)
    return provider


def _sdk_meter_provider() -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    readers = [PeriodicExportingMetricReader(e)
               for e in _exporters("OTEL_METRICS_EXPORTER", "METRICS", ConsoleMetricExporter)]
    provider = SDKMeterProvider(resource=Resource.create(), metric_readers=readers)
    atexit.register(provider.shutdown)
    return provider
