"""Processor ``llm_metrics``: derive the core's server metrics from request spans, for 100% of traffic.

Runs on every received span before sampling. The derivation is the core's
(``RequestSummary.from_attributes`` + ``ServerMetrics``), so the collector's histograms
are the SDK's, bucket for bucket; here they are labelled by ``service.name`` as well.
"""

from __future__ import annotations

import threading
from typing import Iterable

from opentelemetry.metrics import MeterProvider

from otel_llm.core.metrics import ServerMetrics
from otel_llm.core.slo import SLOTable

from .spans import SpanFacts
from .telemetry import SelfTelemetry

MAX_SERVICES = 1024  # service names come from clients: bound the per-service instrument sets


class LLMMetricsProcessor:
    def __init__(self, meter_provider: MeterProvider, slos: SLOTable, telemetry: SelfTelemetry) -> None:
        self._meter = meter_provider.get_meter("otel_llm_collector.llm_metrics")
        self._slos = slos
        self._telemetry = telemetry
        self._by_service: dict[str, ServerMetrics] = {}
        self._lock = threading.Lock()

    def _metrics(self, service: str) -> ServerMetrics:
        m = self._by_service.get(service)
        if m is None:
            with self._lock:
                m = self._by_service.get(service)
                if m is None:
                    key = service if len(self._by_service) < MAX_SERVICES else "_other"
                    m = self._by_service.get(key) or ServerMetrics(self._meter, self._slos, {"service.name": key})
                    self._by_service[service if key == service else key] = m
        return m

    def process(self, facts: Iterable[SpanFacts]) -> None:
        counts: dict[str, int] = {}
        for f in facts:
            if f.summary is None:
                continue  # not a request span: passes through untouched
            self._metrics(f.service).record(f.summary)
            counts[f.source or "?"] = counts.get(f.source or "?", 0) + 1
        for source, n in counts.items():
            self._telemetry.inc("llm_metrics_requests", n, source=source)
