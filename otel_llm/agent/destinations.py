"""Whether an agent can export for these providers, and the same providers rebuilt in the agent.

The agent builds its exporters from the ``OTEL_*`` variables it inherits (endpoint, headers, TLS,
compression, timeout: the exporters read them themselves), so it is used only where the frontend's
providers are what those variables build:

* the tracer provider is the SDK's, its sampler the default (``ParentBased(ALWAYS_ON)``), with at least one
  span processor (one added after the engine was built would never reach the agent), each the SDK's batch
  or simple processor around the SDK's OTLP exporter (HTTP or gRPC) whose endpoint is the one a new
  exporter of that kind gets from the variables now;
* the meter provider is the SDK's, with no views, each reader a ``PeriodicExportingMetricReader`` around
  the SDK's OTLP metric exporter, on the same terms (none at all is fine: metrics recorded, not exported).

That covers providers otel-llm builds from ``OTEL_*`` and those ``opentelemetry-instrument`` installs.
Anything else (another processor, an in-memory exporter, an endpoint given in code) keeps the work in
the frontend (``describe`` answers None, and says why in ``reason``). The resource's attributes travel.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from ..otlp import sdk_bridge
from ..otlp.sdk_bridge import Moved, _attr

_SPAN_EXPORTERS = {"http": ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
                   "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter")}
_METRIC_EXPORTERS = {"http": ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
                     "grpc": ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter")}


@dataclass
class Destinations:
    """The providers an agent builds: per span processor its transport and schedule (None: at once), per
    metric reader its transport and interval, and the resource."""

    spans: list[tuple[str, float | None]] = field(default_factory=list)
    metrics: list[tuple[str, float]] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)
    schema_url: str = ""


def _kind(exporter: Any, table: dict[str, tuple[str, str]]) -> str | None:
    """``http`` or ``grpc`` if ``exporter`` is the SDK's OTLP exporter whose endpoint the variables give."""
    for transport, (module, name) in table.items():
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:
            continue
        if type(exporter) is cls:
            fresh = cls()  # what the OTEL_* variables make of it now
            try:
                same = _attr(exporter, "_endpoint") == _attr(fresh, "_endpoint")
            finally:
                fresh.shutdown()
            return transport if same else None
    return None


class Verdict:
    def __init__(self) -> None:
        self.reason = ""


def describe(tracer_provider: Any, meter_provider: Any, verdict: Verdict | None = None) -> Destinations | None:
    """The agent's providers for these, or None (``verdict.reason`` says why) where it cannot stand in."""
    verdict = verdict if verdict is not None else Verdict()
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        verdict.reason = "no opentelemetry-sdk"
        return None
    if type(tracer_provider) is not TracerProvider or type(meter_provider) is not MeterProvider:
        verdict.reason = "not the SDK's providers"
        return None
    try:
        if not sdk_bridge.samples_local_children(_attr(tracer_provider, "sampler")):
            verdict.reason = "a sampler other than the default"
            return None
        out = Destinations()
        processors = _attr(_attr(tracer_provider, "_active_span_processor"), "_span_processors")
        if not processors:  # nothing to export to yet: a processor added later would never reach an agent
            verdict.reason = "no span processor"
            return None
        for processor in processors:
            dest = sdk_bridge.destination(processor)
            kind = _kind(dest.exporter, _SPAN_EXPORTERS) if dest is not None else None
            if kind is None:
                verdict.reason = f"span processor {type(processor).__name__} is not OTLP as OTEL_* configures it"
                return None
            out.spans.append((kind, dest.schedule_delay))
        sdk_config = _attr(meter_provider, "_sdk_config")
        if sdk_config.views:
            verdict.reason = "metric views"
            return None
        for reader in _attr(meter_provider, "_metric_readers"):
            exporter = _attr(reader, "_exporter") if type(reader) is PeriodicExportingMetricReader else None
            kind = _kind(exporter, _METRIC_EXPORTERS) if exporter is not None else None
            if kind is None:
                verdict.reason = f"metric reader {type(reader).__name__} is not OTLP as OTEL_* configures it"
                return None
            out.metrics.append((kind, float(_attr(reader, "_export_interval_millis"))))
        resource = tracer_provider.resource
        out.resource = dict(resource.attributes)
        out.schema_url = resource.schema_url or ""
        return out
    except Moved as moved:
        verdict.reason = f"{moved} moved in this opentelemetry-sdk release"
        return None


def build(d: Destinations) -> tuple[Any, Any]:
    """The agent's tracer and meter providers (its own: never the global ones)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource(d.resource, d.schema_url or None)
    tp = TracerProvider(resource=resource, shutdown_on_exit=False)
    for transport, delay in d.spans:
        module, name = _SPAN_EXPORTERS[transport]
        exporter = getattr(importlib.import_module(module), name)()
        tp.add_span_processor(SimpleSpanProcessor(exporter) if delay is None
                              else BatchSpanProcessor(exporter, schedule_delay_millis=delay * 1e3))
    readers = []
    for transport, interval in d.metrics:
        module, name = _METRIC_EXPORTERS[transport]
        readers.append(PeriodicExportingMetricReader(getattr(importlib.import_module(module), name)(),
                                                     export_interval_millis=interval))
    return tp, MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
