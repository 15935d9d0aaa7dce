"""OTLP metrics the gateway receives (an SDK pointed at it whole), exposed on its Prometheus endpoint.

What upstream's ``prometheus`` exporter does with a metrics pipeline, for the data an SDK sends: the
latest cumulative value of each series (delta points are added up), named as upstream names them
(dots to underscores, the unit as a suffix, ``_total`` on monotonic sums), ``job`` and ``instance``
from the resource's ``service.namespace``/``service.name`` and ``service.instance.id``, the data point's
attributes as labels. Sums, gauges, explicit-bucket histograms and summaries are taken; an exponential
histogram is refused (counted, and said in the response's ``partial_success``).

Memory is bounded: at most ``max_series`` series (a point of a new series beyond it is refused), label
values cut to ``max_label_length``, and a series not updated for ``expiration`` (upstream's
``metric_expiration``, 5 minutes) is forgotten. A family whose name is the gateway's own (a derived
metric, its self-telemetry) or whose type differs from the one already held is refused, so a scrape
never shows a name twice.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
                                    SummaryMetricFamily)
from prometheus_client.utils import floatToGoString

from otel_llm import semconv as sc
from otel_llm.otlp.signals import parse_metrics_request

_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds", "min": "minutes",
          "h": "hours", "d": "days", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
          "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "%": "percent", "Hz": "hertz", "W": "watts",
          "V": "volts", "A": "amperes", "J": "joules", "Cel": "celsius", "m": "meters"}
DELTA = 1  # AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
NO_RECORDED_VALUE = 1  # DataPointFlags.FLAG_NO_RECORDED_VALUE
REFUSED_MESSAGE = ("metric points refused (exponential histograms, names the gateway derives itself, a type "
                   "change, or past the series limit); see otelcol_llm_received_refused_total")
Clock = Callable[[], float]


def metric_name(name: str, unit: str, kind: str) -> str:
    """An OTLP metric's Prometheus name, as upstream's exporter writes it (``kind``: counter, gauge, ...)."""
    base = _BAD.sub("_", name)
    if base[:1].isdigit():
        base = "_" + base
    unit = re.sub(r"\{[^}]*\}", "", unit or "")
    suffix = ""
    if unit == "1":
        suffix = "ratio" if kind == "gauge" else ""
    elif "/" in unit:
        num, _, den = unit.partition("/")
        num = _UNITS.get(num, _BAD.sub("_", num))
        suffix = f"{num}_per_{_UNITS.get(den, {'s': 'second', 'm': 'minute', 'h': 'hour'}.get(den, _BAD.sub('_', den)))}" \
            if num else f"per_{_BAD.sub('_', den)}"
    elif unit:
        suffix = _UNITS.get(unit, _BAD.sub("_", unit))
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if kind == "counter" and not base.endswith("_total"):
        base += "_total"
    return base


def _label_value(v) -> str:  # noqa: ANN001 - an OTLP AnyValue
    which = v.WhichOneof("value")
    if which is None:
        return ""
    if which == "bool_value":
        return "true" if v.bool_value else "false"
    if which == "array_value":
        return "[" + ",".join(_label_value(x) for x in v.array_value.values) + "]"
    if which == "kvlist_value":
        return "{" + ",".join(f"{kv.key}:{_label_value(kv.value)}" for kv in v.kvlist_value.values) + "}"
    if which == "bytes_value":
        return v.bytes_value.hex()
    return str(getattr(v, which))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass(slots=True)
class _Series:
    labels: tuple[tuple[str, str], ...]
    updated: float
    value: float = 0.0  # sums and gauges
    bounds: tuple[float, ...] = ()  # histograms
    counts: list[int] = field(default_factory=list)  # histograms: per bucket (not cumulative)
    quantiles: tuple[tuple[float, float], ...] = ()  # summaries
    count: int = 0
    total: float = 0.0


@dataclass(slots=True)
class _Family:
    kind: str  # counter | gauge | histogram | summary
    doc: str
    series: dict[tuple, _Series] = field(default_factory=dict)


class ReceivedMetrics:
    def __init__(self, on_refused: Callable[[str, int], None], reserved: Callable[[], Iterable[str]] = frozenset,
                 max_series: int = 10_000, max_label_length: int = 256, expiration: float = 300.0,
                 clock: Clock = time.monotonic) -> None:
        """``on_refused(reason, points)`` counts refusals; ``reserved()``: the names the gateway exposes itself."""
        self._on_refused = on_refused
        self._reserved = reserved
        self.max_series = max_series
        self._max_label = max_label_length
        self.expiration = expiration
        self._clock = clock
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._n = 0  # series held, all families together

    @property
    def series(self) -> int:
        return self._n

    def ingest(self, raw: bytes) -> tuple[int, int]:
        """An encoded ``ExportMetricsServiceRequest`` -> (points accepted, points refused);
        ``MalformedRequest`` when the bytes are not one."""
        request = parse_metrics_request(raw)
        reserved = set(self._reserved())
        refused: dict[str, int] = {}
        accepted = 0
        now = self._clock()
        with self._lock:
            self._expire(now)
            for rm in request.resource_metrics:
                base = self._resource_labels(rm.resource.attributes)
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        a, why = self._metric(metric, base, reserved, now)
                        accepted += a
                        for reason, n in why.items():
                            refused[reason] = refused.get(reason, 0) + n
        for reason, n in refused.items():
            self._on_refused(reason, n)
        return accepted, sum(refused.values())

    def _resource_labels(self, attributes) -> tuple[tuple[str, str], ...]:
        attrs = {kv.key: _label_value(kv.value) for kv in attributes}
        out = []
        name, namespace = attrs.get(sc.SERVICE_NAME), attrs.get("service.namespace")
        if name:
            out.append(("job", self._cut(f"{namespace}/{name}" if namespace else name)))
        if attrs.get(sc.SERVICE_INSTANCE_ID):
            out.append(("instance", self._cut(attrs[sc.SERVICE_INSTANCE_ID])))
        return tuple(out)

    def _cut(self, v: str) -> str:
        return v[:self._max_label]

    def _labels(self, base: tuple, attributes) -> tuple[tuple[str, str], ...]:
        labels = dict(base)
        for kv in attributes:
            key = _BAD.sub("_", kv.key)
            if key[:1].isdigit():
                key = "key_" + key
            if key not in ("le", "quantile", "job", "instance") and not key.startswith("__"):
                labels[key] = self._cut(_label_value(kv.value))
        return tuple(sorted(labels.items()))

    def _metric(self, metric, base: tuple, reserved: set[str], now: float) -> tuple[int, dict[str, int]]:
        which = metric.WhichOneof("data")
        if which == "sum":
            data = metric.sum
            kind = "counter" if data.is_monotonic else "gauge"
            points = data.data_points
        elif which == "gauge":
            data, kind, points = metric.gauge, "gauge", metric.gauge.data_points
        elif which == "histogram":
            data, kind, points = metric.histogram, "histogram", metric.histogram.data_points
        elif which == "summary":
            data, kind, points = metric.summary, "summary", metric.summary.data_points
        elif which == "exponential_histogram":
            return 0, {"exponential_histogram": len(metric.exponential_histogram.data_points)}
        else:
            return 0, {}
        points = [p for p in points if not p.flags & NO_RECORDED_VALUE]
        if not points:
            return 0, {}
        name = metric_name(metric.name, metric.unit, kind)
        if name in reserved:
            return 0, {"reserved_name": len(points)}
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(kind, (metric.description or metric.name).replace("\n", " "))
        elif family.kind != kind:
            return 0, {"type_conflict": len(points)}
        delta = getattr(data, "aggregation_temporality", 0) == DELTA
        accepted, refused = 0, 0
        for p in points:
            labels = self._labels(base, p.attributes)
            s = family.series.get(labels)
            if s is None:
                if self._n >= self.max_series:
                    refused += 1
                    continue
                s = family.series[labels] = _Series(labels, now)
                self._n += 1
            s.updated = now
            if kind in ("counter", "gauge"):
                v = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                s.value = s.value + v if delta else v
            elif kind == "histogram":
                bounds = tuple(p.explicit_bounds)
                counts = list(p.bucket_counts)
                if len(counts) != len(bounds) + 1:
                    refused += 1
                    continue
                if delta and s.bounds == bounds and s.counts:
                    s.counts = [a + b for a, b in zip(s.counts, counts)]
                    s.count += p.count
                    s.total += p.sum
                else:
                    s.bounds, s.counts, s.count, s.total = bounds, counts, p.count, p.sum
            else:
                s.quantiles = tuple((q.quantile, q.value) for q in p.quantile_values)
                s.count, s.total = p.count, p.sum
            accepted += 1
        return accepted, ({"series_limit": refused} if refused else {})

    def _expire(self, now: float) -> None:
        horizon = now - self.expiration
        for name in list(self._families):
            family = self._families[name]
            stale = [k for k, s in family.series.items() if s.updated < horizon]
            for k in stale:
                del family.series[k]
            self._n -= len(stale)
            if not family.series:
                del self._families[name]

    def collect(self) -> Iterable[Metric]:
        """The held series as prometheus_client families (the OpenMetrics exposition renders these)."""
        out: list[Metric] = []
        with self._lock:
            self._expire(self._clock())
            for name, family in sorted(self._families.items()):
                kind = family.kind
                cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily,
                       "summary": SummaryMetricFamily}[kind]
                by_labels: dict[tuple[str, ...], list[_Series]] = {}
                for s in family.series.values():
                    by_labels.setdefault(tuple(k for k, _ in s.labels), []).append(s)
                for names, series in by_labels.items():  # a family per label-name set (one in practice)
                    fam = cls(name, family.doc, labels=names)
                    for s in series:
                        values = [v for _, v in s.labels]
                        if kind in ("counter", "gauge"):
                            fam.add_metric(values, s.value)
                        elif kind == "histogram":
                            cumulative, buckets = 0, []
                            for bound, n in zip(list(s.bounds) + [math.inf], s.counts):
                                cumulative += n
                                buckets.append(("+Inf" if bound == math.inf else floatToGoString(bound), cumulative))
                            fam.add_metric(values, buckets, s.total)
                        else:
                            fam.add_metric(values, s.count, s.total)
                    out.append(fam)
        return out

    def text(self, skip: frozenset[str] = frozenset()) -> str:
        """Prometheus text format 0.0.4 of the held series (families named in ``skip`` left out)."""
        out: list[str] = []
        with self._lock:
            self._expire(self._clock())
            for name, family in sorted(self._families.items()):
                if name in skip:
                    continue
                kind = family.kind
                out.append(f"# HELP {name} {family.doc.replace(chr(92), chr(92) * 2)}\n# TYPE {name} {kind}\n")
                for s in family.series.values():
                    lt = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels)
                    if kind in ("counter", "gauge"):
                        out.append(f"{name}{{{lt}}} {floatToGoString(s.value)}\n" if lt
                                   else f"{name} {floatToGoString(s.value)}\n")
                        continue
                    sep = "," if lt else ""
                    braces = f"{{{lt}}}" if lt else ""
                    if kind == "histogram":
                        cumulative = 0
                        for bound, n in zip(list(s.bounds) + [math.inf], s.counts):
                            cumulative += n
                            le = "+Inf" if bound == math.inf else floatToGoString(bound)
                            out.append(f'{name}_bucket{{{lt}{sep}le="{le}"}} {cumulative}\n')
                    else:
                        for q, v in s.quantiles:
                            out.append(f'{name}{{{lt}{sep}quantile="{floatToGoString(q)}"}} {floatToGoString(v)}\n')
                    out.append(f"{name}_sum{braces} {floatToGoString(s.total)}\n{name}_count{braces} {s.count}\n")
        return "".join(out)
