"""A lightweight cumulative aggregation backend behind the OpenTelemetry ``Meter`` calls the core makes.

The core's ``ServerMetrics`` builds its instruments from its table (names, units, bucket
boundaries) with ``meter.create_histogram`` / ``meter.create_counter`` and records into
them; it does not care who aggregates. The OpenTelemetry SDK's instruments do much on every
call (attribute cleaning, hashing, a ``Measurement`` object, exemplar filters, locks),
which at one request span per trace was most of the gateway's receive path
(benchmarks/collector_throughput.py, ingest). These do the
same arithmetic - explicit-bucket histograms (``bisect_left``: a value equal to a bound
falls in that bound's bucket; count, sum, min, max), monotonic sums, negative and
non-finite values ignored, the SDK's cardinality limit with its overflow series - without that
per-call work, and hand out the SDK's own point types, so ``get_metrics_data()``
reads like an ``InMemoryMetricReader`` with cumulative temporality and the Prometheus
bridge renders both identically (tested against the SDK on the same inputs).

Attribute sets are looked up by identity first: the core pre-binds one dict per label set
and passes the same object on every call, so the common case is one ``id()`` lookup. A
mapping passed here must not be mutated afterwards (a copy is what the series keeps).
No exemplars, no views, no delta temporality: the collector's derived metrics need none.

Label sets come from clients, so series are bounded twice per instrument: ``max_series`` in all (then
one overflow series, ``otel.metric.overflow=true``, as the SDK's cardinality limit) and
``max_series_per_service`` per value of ``partition_key`` (``service.name``): a service beyond its
share records into its own overflow series (``service.name=<it>, otel.metric.overflow=true``), so
one tenant's junk label values cannot take the series another service's new model needs. A value
that would make a histogram's sum infinite (1e308 twice) is refused and counted (``on_refused``),
so one client cannot turn a series' sum into +Inf for good.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from functools import partial
from operator import add as add_int
from typing import Any, Callable, Mapping, Sequence

from opentelemetry.sdk.metrics.export import (AggregationTemporality, Histogram, HistogramDataPoint, Metric,
                                              MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_llm import semconv as sc

# the SDK's defaults, so an instrument without advice buckets like the SDK's
DEFAULT_BOUNDARIES = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0,
                      7500.0, 10000.0)
CARDINALITY_LIMIT = 2000  # the SDK's default per instrument; later label sets share one overflow series
OVERFLOW: dict[str, Any] = {"otel.metric.overflow": True}
_IDENTITY_CACHE = 8192  # attribute dicts remembered by id() per instrument
_INF = math.inf


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return ("seq", tuple(_hashable(x) for x in v))
    return (type(v).__name__, v)  # True, 1 and 1.0 are different label values, as in the SDK


def attributes_key(attributes: Mapping[str, Any] | None) -> tuple:
    return tuple(sorted((str(k), _hashable(v)) for k, v in (attributes or {}).items()))


@dataclass(frozen=True)
class SeriesLimits:
    max_series: int = CARDINALITY_LIMIT  # per instrument
    max_series_per_service: int | None = None  # per instrument and partition value; None: no partition
    partition_key: str = sc.SERVICE_NAME


class _Instrument:
    __slots__ = ("name", "unit", "description", "_lock", "_by_id", "_by_key", "_limits",
                 "_per_part", "on_refused")

    def __init__(self, name: str, unit: str, description: str, lock: threading.RLock,
                 limits: SeriesLimits | None = None,
                 on_refused: Callable[[str, int], None] | None = None) -> None:
        self.name, self.unit, self.description = name, unit, description
        self._lock = lock
        self._by_id: dict[int, tuple[Mapping[str, Any] | None, Any]] = {}  # id(attrs) -> (attrs, series)
        self._by_key: dict[tuple, Any] = {}  # attributes_key -> series
        self._limits = limits or SeriesLimits()
        self._per_part: dict[Any, int] = {}  # partition value -> its own (non-overflow) series
        self.on_refused = on_refused  # (reason, values) for values not recorded

    def _series(self, attributes: Mapping[str, Any] | None, remember: bool = True) -> Any:
        """Must be called with the lock held. ``remember``: cache by the mapping's id (for ``record``/``add``
        callers that pass the same dict each time; bound recorders resolve once and need no cache)."""
        key = attributes_key(attributes)
        series = self._by_key.get(key)
        if series is None:
            limits, bound, part = self._limits, attributes, None
            if limits.max_series_per_service is not None and attributes:
                part = attributes.get(limits.partition_key)
            if len(self._by_key) >= limits.max_series:
                bound, part = OVERFLOW, None
            elif part is not None and self._per_part.get(part, 0) >= limits.max_series_per_service:  # type: ignore[operator]
                bound, part = {limits.partition_key: part, **OVERFLOW}, None  # this service's overflow series
            if bound is not attributes:
                key = attributes_key(bound)
                series = self._by_key.get(key)
                if series is None and len(self._by_key) >= limits.max_series:  # no room for a service overflow
                    key, bound = attributes_key(OVERFLOW), OVERFLOW
                    series = self._by_key.get(key)
            if series is None:
                series = self._by_key[key] = self._new_series(dict(bound or {}))
                if part is not None:
                    self._per_part[part] = self._per_part.get(part, 0) + 1
        if remember and attributes is not None and len(self._by_id) < _IDENTITY_CACHE:
            self._by_id[id(attributes)] = (attributes, series)  # holds a reference: the id cannot be reused
        return series

    def _refused(self, reason: str, n: int = 1) -> None:
        if self.on_refused is not None:
            self.on_refused(reason, n)

    def _new_series(self, attributes: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _points(self, now: int) -> list:
        raise NotImplementedError


class _HistogramSeries:
    __slots__ = ("attributes", "start", "counts", "sum", "min", "max")

    def __init__(self, attributes: dict[str, Any], buckets: int) -> None:
        self.attributes = attributes
        self.start = time.time_ns()
        self.counts = [0] * buckets
        self.sum: float = 0
        self.min = _INF
        self.max = -_INF


class FastHistogram(_Instrument):
    """An explicit-bucket histogram; ``record`` matches the SDK's ``Histogram.record``."""

    __slots__ = ("boundaries",)

    def __init__(self, name: str, unit: str, description: str, lock: threading.RLock,
                 boundaries: Sequence[float], limits: SeriesLimits | None = None,
                 on_refused: Callable[[str, int], None] | None = None) -> None:
        super().__init__(name, unit, description, lock, limits, on_refused)
        self.boundaries = tuple(float(b) for b in boundaries)

    def _new_series(self, attributes: dict[str, Any]) -> _HistogramSeries:
        return _HistogramSeries(attributes, len(self.boundaries) + 1)

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None, context: Any = None) -> None:
        if not 0 <= amount < _INF:  # negative, NaN, inf: the SDK ignores them (with a warning)
            return
        with self._lock:
            hit = self._by_id.get(id(attributes))
            s = hit[1] if hit is not None and hit[0] is attributes else self._series(attributes)
            if s.sum + amount == _INF:  # the sum would be +Inf for good: refuse this value
                self._refused("sum_overflow")
                return
            s.counts[bisect_left(self.boundaries, amount)] += 1
            s.sum += amount
            if amount < s.min:
                s.min = amount
            if amount > s.max:
                s.max = amount

    def bind_many(self, attributes: Mapping[str, Any] | None, caller_holds_lock: bool = False) -> Any:
        """A recorder of lists of values for one label set (the collector's ``fast.metrics`` binds each label
        set once): the series ``record`` would use, the same arithmetic, values in order, without the lookup.
        ``caller_holds_lock``: whoever binds promises to call the recorder only while holding the backend's
        ``lock`` (taking it is a large share of a record); ``fast.metrics.BatchMetrics`` binds so and keeps it."""
        return _bound_histogram_many(self, attributes, not caller_holds_lock)

    def bind_counts(self, attributes: Mapping[str, Any] | None, caller_holds_lock: bool = False) -> Any:
        """A recorder of whole bucket counts for one label set, ``(counts, total, lo, hi)`` as the core's
        ``sdk_metrics.CountsRecorder``: a request's inter-token latencies added in one call. Counts that do
        not fit the boundaries, or a total that would make the sum +Inf, are refused and counted."""
        return _bound_histogram_counts(self, attributes, not caller_holds_lock)

    def _points(self, now: int) -> list[HistogramDataPoint]:
        return [HistogramDataPoint(attributes=dict(s.attributes), start_time_unix_nano=s.start, time_unix_nano=now,
                                   count=sum(s.counts), sum=s.sum, bucket_counts=tuple(s.counts),
                                   explicit_bounds=self.boundaries, min=s.min, max=s.max)
                for s in self._by_key.values()]

    def _data(self, points: list) -> Histogram:
        return Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)


class _SumSeries:
    __slots__ = ("attributes", "start", "value")

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes
        self.start = time.time_ns()
        self.value: float = 0


class FastCounter(_Instrument):
    """A monotonic sum; ``add`` matches the SDK's ``Counter.add``."""

    __slots__ = ()

    def _new_series(self, attributes: dict[str, Any]) -> _SumSeries:
        return _SumSeries(attributes)

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None, context: Any = None) -> None:
        if not 0 <= amount < _INF:
            return
        with self._lock:
            hit = self._by_id.get(id(attributes))
            s = hit[1] if hit is not None and hit[0] is attributes else self._series(attributes)
            s.value += amount

    def bind(self, attributes: Mapping[str, Any] | None, caller_holds_lock: bool = False) -> Any:
        """An ``add`` for one label set, bound once (as ``FastHistogram.bind_many``)."""
        return _bound_counter(self, attributes, not caller_holds_lock)

    def _points(self, now: int) -> list[NumberDataPoint]:
        return [NumberDataPoint(attributes=dict(s.attributes), start_time_unix_nano=s.start, time_unix_nano=now,
                                value=s.value) for s in self._by_key.values()]

    def _data(self, points: list) -> Sum:
        return Sum(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=True)


_COUNT_IN_C = 16  # values per batch from which counting per bucket with a Counter beats a loop per value


def _bound_histogram_many(inst: FastHistogram, attributes: Mapping[str, Any] | None, locked: bool) -> Any:
    """``FastHistogram.bind_many``: record a list of values for one label set, as a closure (cheaper to
    call than a method). The series is looked up on the first value recorded, not at binding: a label
    set never recorded has no series, and the cardinality limit counts first use, as with ``record``.
    ``locked=False``: the caller holds the backend's lock (``bind_many(caller_holds_lock=True)``)."""
    lock = inst._lock
    locate = partial(bisect_left, inst.boundaries)  # value -> its bucket, as in record
    series: list[_HistogramSeries] = []

    def add(values: list) -> None:
        if not values:
            return
        # negative, NaN, inf: ignored, as by record. The common case (none of them) is checked in C: the
        # smallest value is >= 0 (a NaN first makes min NaN, which fails too), and the plain sum is finite
        # (any NaN or inf makes it NaN or inf, where x - x is not 0); otherwise filtered one by one
        low, plain = min(values), sum(values)
        if low >= 0 and plain - plain == 0:
            kept = values
        else:
            kept = [v for v in values if 0 <= v < _INF]
            if not kept:
                return  # and no series for a label set with nothing recorded, as with record
            low, plain = min(kept), sum(kept)
        s = series[0] if series else _first(inst, attributes, series)
        total = s.sum
        if total + plain == _INF:  # some value would make the sum +Inf: take them one by one
            kept = _finite_prefix_sums(inst, total, kept)
            if not kept:
                return
            low = min(kept)
        counts = s.counts
        if len(kept) < _COUNT_IN_C:
            for i in map(locate, kept):  # the bucket search in C; one increment per value here
                counts[i] += 1
        else:  # a batch: the values counted per bucket in C, one increment per bucket used here
            for i, n in Counter(map(locate, kept)).items():
                counts[i] += n
        s.sum = sum(kept, total)  # left to right from the running sum (Python >= 3.12 compensates rounding)
        high = max(kept)
        if low < s.min:
            s.min = low
        if high > s.max:
            s.max = high

    def record_many(values: list) -> None:
        with lock:
            add(values)

    return record_many if locked else add


def _bound_histogram_counts(inst: FastHistogram, attributes: Mapping[str, Any] | None, locked: bool) -> Any:
    """``FastHistogram.bind_counts`` (see ``_bound_histogram_many``)."""
    lock = inst._lock
    width = len(inst.boundaries) + 1
    series: list[_HistogramSeries] = []

    def add(counts: Sequence[int], total: float, lo: float, hi: float) -> None:
        if len(counts) != width or not 0 <= total < _INF or not 0 <= lo <= hi:
            inst._refused("bad_counts", 1)
            return
        n = sum(counts)
        if not n:
            return
        s = series[0] if series else _first(inst, attributes, series)
        if s.sum + total == _INF:
            inst._refused("sum_overflow", n)
            return
        s.counts[:] = map(add_int, s.counts, counts)
        s.sum += total
        if lo < s.min:
            s.min = lo
        if hi > s.max:
            s.max = hi

    def record_counts(counts: Sequence[int], total: float, lo: float, hi: float) -> None:
        with lock:
            add(counts, total, lo, hi)

    return record_counts if locked else add


def _bound_counter(inst: FastCounter, attributes: Mapping[str, Any] | None, locked: bool) -> Any:
    """``FastCounter.add`` for one label set (see ``_bound_histogram_many``)."""
    lock = inst._lock
    series: list[_SumSeries] = []

    def add(amount: float, context: Any = None) -> None:
        if 0 <= amount < _INF:
            with lock:
                (series[0] if series else _first(inst, attributes, series)).value += amount

    def add_unlocked(amount: float, context: Any = None) -> None:
        if 0 <= amount < _INF:
            (series[0] if series else _first(inst, attributes, series)).value += amount

    return add if locked else add_unlocked


def _finite_prefix_sums(inst: _Instrument, total: float, values: list) -> list:
    """The values that keep ``total`` finite, added in order; the others refused and counted."""
    out = []
    for v in values:
        if total + v == _INF:
            inst._refused("sum_overflow")
            continue
        total += v
        out.append(v)
    return out


def _first(inst: _Instrument, attributes: Mapping[str, Any] | None, cell: list) -> Any:
    with inst._lock:
        if not cell:
            cell.append(inst._series(attributes, remember=False))
        return cell[0]


class AggregatingMeter:
    """The part of ``opentelemetry.metrics.Meter`` the core uses; same name -> same instrument."""

    def __init__(self, name: str, version: str | None, lock: threading.RLock,
                 limits: SeriesLimits | None = None, on_refused: Callable[[str, int], None] | None = None) -> None:
        self.scope = InstrumentationScope(name, version)
        self.lock = self._lock = lock  # the backend's: bound recorders' callers may hold it (``bind_many``)
        self._limits = limits
        self._on_refused = on_refused
        self.instruments: dict[str, _Instrument] = {}

    def _get(self, cls: type, name: str, unit: str, description: str, *extra: Any) -> Any:
        with self._lock:
            inst = self.instruments.get(name)
            if inst is None:
                inst = self.instruments[name] = cls(name, unit, description, self._lock, *extra,
                                                    limits=self._limits,
                                                    on_refused=self._on_refused)
            elif not isinstance(inst, cls):
                raise ValueError(f"instrument {name!r} already exists as {type(inst).__name__}")
            return inst

    def create_histogram(self, name: str, unit: str = "", description: str = "",
                         explicit_bucket_boundaries_advisory: Sequence[float] | None = None) -> FastHistogram:
        return self._get(FastHistogram, name, unit, description,
                         explicit_bucket_boundaries_advisory or DEFAULT_BOUNDARIES)

    def create_counter(self, name: str, unit: str = "", description: str = "") -> FastCounter:
        return self._get(FastCounter, name, unit, description)


class AggregationBackend:
    """A ``MeterProvider`` stand-in (``get_meter``) and its reader (``get_metrics_data``), cumulative."""

    def __init__(self, resource: Resource | None = None,
                 limits: SeriesLimits | None = None, on_refused: Callable[[str, int], None] | None = None) -> None:
        """``record``/``add`` always take ``lock``; recorders bound with ``caller_holds_lock`` leave it to
        their caller (one hold per batch instead of one per record)."""
        self.resource = resource or Resource.create({})
        self._lock = threading.RLock()  # one for all instruments: a record is a few increments
        self.lock = self._lock  # hold it around a batch of records: each record then re-enters it cheaply
        self._limits = limits
        self._on_refused = on_refused
        self._meters: dict[tuple[str, str | None], AggregatingMeter] = {}

    def get_meter(self, name: str, version: str | None = None, *args: Any, **kwargs: Any) -> AggregatingMeter:
        with self._lock:
            meter = self._meters.get((name, version))
            if meter is None:
                meter = self._meters[(name, version)] = AggregatingMeter(name, version, self._lock, self._limits,
                                                                         self._on_refused)
            return meter

    def get_metrics_data(self) -> MetricsData | None:
        """A consistent snapshot, shaped like the SDK reader's (instruments without points are left out)."""
        now = time.time_ns()
        scopes = []
        with self._lock:
            for meter in self._meters.values():
                metrics = []
                for inst in meter.instruments.values():
                    points = inst._points(now)
                    if points:
                        metrics.append(Metric(name=inst.name, description=inst.description, unit=inst.unit,
                                              data=inst._data(points)))
                if metrics:
                    scopes.append(ScopeMetrics(scope=meter.scope, metrics=metrics, schema_url=""))
        if not scopes:
            return None
        return MetricsData(resource_metrics=[ResourceMetrics(resource=self.resource, scope_metrics=scopes,
                                                             schema_url="")])

    def shutdown(self) -> None:
        """Nothing to flush: the data is read on scrape."""
