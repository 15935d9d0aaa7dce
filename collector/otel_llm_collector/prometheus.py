"""The Prometheus pull endpoint: derived OpenTelemetry metrics plus the collector's own telemetry.

The derived metrics live in the gateway's ``AggregationBackend`` (the core records into
it; an OpenTelemetry ``InMemoryMetricReader`` reads the same way); a small bridge renders the
reader's cumulative data in Prometheus form on every scrape, with the usual name
translation (dots to underscores, ``s`` -> ``_seconds``).
"""

from __future__ import annotations

import re
import threading
from http.server import ThreadingHTTPServer
from typing import Iterator

from opentelemetry.sdk.metrics.export import (Histogram, InMemoryMetricReader, MetricsData, Sum)
from prometheus_client import CollectorRegistry, MetricsHandler, start_http_server

from .auth import BearerAuth
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

_BAD = re.compile(r"[^a-zA-Z0-9_:]")


def prom_name(name: str, unit: str) -> str:
    base = _BAD.sub("_", name)
    unit = re.sub(r"\{[^}]*\}", "", unit or "")
    if unit == "s":
        base += "_seconds"
    elif unit.endswith("/s"):
        base += ("_" + _BAD.sub("_", unit[:-2]) if unit[:-2] else "") + "_per_second"
    elif unit:
        base += "_" + _BAD.sub("_", unit)
    return base


def _label(key: str) -> str:
    return _BAD.sub("_", key)


def _le(v: float) -> str:
    return repr(float(v))


class OtelBridge:
    """A prometheus_client collector reading an OpenTelemetry in-memory reader on each scrape."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self._reader = reader

    def collect(self) -> Iterator[Metric]:
        data: MetricsData | None = self._reader.get_metrics_data()
        if data is None:
            return
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    yield from self._family(metric)

    def _family(self, metric) -> Iterator[Metric]:
        name = prom_name(metric.name, metric.unit)
        points = list(metric.data.data_points)
        if not points:
            return
        keys = sorted({k for p in points for k in p.attributes})
        labels = [_label(k) for k in keys]
        if isinstance(metric.data, Histogram):
            fam = HistogramMetricFamily(name, metric.description or metric.name, labels=labels)
            for p in points:
                cumulative, buckets = 0, []
                for bound, count in zip(list(p.explicit_bounds) + [float("inf")], p.bucket_counts):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else _le(bound), cumulative))
                fam.add_metric([str(p.attributes.get(k, "")) for k in keys], buckets, p.sum)
            yield fam
        elif isinstance(metric.data, Sum):
            cls = CounterMetricFamily if metric.data.is_monotonic else GaugeMetricFamily
            fam = cls(name, metric.description or metric.name, labels=labels)
            for p in points:
                fam.add_metric([str(p.attributes.get(k, "")) for k in keys], p.value)
            yield fam


class PrometheusEndpoint:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, auth: BearerAuth | None = None) -> None:
        """``auth``: scrapes must present the bearer token (Prometheus: ``authorization: {credentials: ...}``)."""
        if auth is None:
            self._server, self._thread = start_http_server(port, host, registry)
            return
        base = MetricsHandler.factory(registry)

        class Guarded(base):  # type: ignore[misc, valid-type]
            def do_GET(self) -> None:  # noqa: N802 - stdlib naming
                if not auth.check(self.headers.get(auth.header)):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", "Bearer")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self._server = Server((host, port), Guarded)
        self._thread = threading.Thread(target=self._server.serve_forever, name="prometheus", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
