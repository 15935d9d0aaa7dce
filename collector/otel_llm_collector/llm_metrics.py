"""Processor ``llm_metrics``: derive the core's server metrics from request spans, for 100% of traffic.

Runs on every received request span before sampling. The derivation is the core's
(``RequestSummary.from_attributes`` + ``ServerMetrics``), so the collector's histograms
are the SDK's, bucket for bucket; here they are labelled by ``service.name`` as well. The
instruments are the core's too; the gateway hands them a light aggregation backend
(``aggregation.py``) instead of the OpenTelemetry SDK, which would cost ~80% of the receive path.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterable

from otel_llm.core.metrics import ServerMetrics
from otel_llm.core.slo import SLOTable

from .spans import RequestFacts
from .telemetry import SelfTelemetry

MAX_SERVICES = 1024  # service names come from clients: bound the per-service instrument sets


class LLMMetricsProcessor:
    def __init__(self, meter_provider: Any, slos: SLOTable, telemetry: SelfTelemetry) -> None:
        """``meter_provider``: an OpenTelemetry ``MeterProvider`` or the collector's ``AggregationBackend``."""
        self._meter = meter_provider.get_meter("otel_llm_collector.llm_metrics")
        self._batch_lock = getattr(meter_provider, "lock", None) or contextlib.nullcontext()
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

    def process(self, requests: Iterable[RequestFacts]) -> None:
        counts: dict[str, int] = {}
        by_service: dict[str, list] = {}
        for r in requests:
            group = by_service.get(r.service)
            if group is None:
                by_service[r.service] = [r.summary]
            else:
                group.append(r.summary)
            counts[r.source] = counts.get(r.source, 0) + 1
        with self._batch_lock:  # the backend's lock, held once per batch (instruments re-enter it cheaply)
            for service, summaries in by_service.items():
                self._metrics(service).record_many(summaries)
        for source, n in counts.items():
            self._telemetry.inc("llm_metrics_requests", n, source=source)
