"""The OpenTelemetry metrics SDK's recording path, without the per-call machinery (one fenced module).

A request's metrics are about fifteen ``record``/``add`` calls, and the SDK's public call does
per call what could be done once per label set (a ``Measurement`` whose attributes are
cleaned, the current context, the exemplar filter, an attribute hash per reader): together
more than vLLM's own frontend spends on a short request (benchmarks/core_costs.py, section
``metrics``, compares the two paths). And the inter-token latency
histogram has one value per output token, while the API has no call that adds counts. So:

* ``bind_value(instrument, attributes)``: a recorder for one label set that hands the value
  to the SDK's own aggregation objects (the ones ``record`` reaches, found once per label set
  and again when readers change) through their own ``aggregate``. With a context (a kept
  request's exemplar) it asks the SDK's own exemplar filter, as ``record`` does, and hands the
  aggregation a measurement carrying the value, time, context and the label set (cleaned once,
  by the SDK's own ``Measurement``), so its exemplar reservoir keeps what it would have kept. A
  value the SDK would refuse, or an exemplar filter other than the trace-based default or off,
  takes the public API instead.
* ``bind_counts(instrument, attributes, boundaries)``: adds a whole request's bucket counts
  to an explicit-bucket histogram, under the same locks the SDK's ``aggregate`` takes.
  A backend with its own ``bind_counts`` (an aggregation of ours) is used as is; elsewhere
  (another SDK, a view that changes the aggregation) the public API, one ``record`` per
  counted value at its bucket's midpoint (bucket counts exact, sum and min/max approximate).

This is the only module that touches the metrics SDK's private internals;
``tests/core/test_sdk_metrics.py`` checks both recorders against the SDK's own calls and fails
loudly when the internals move (``fast_path`` says which path a recorder took).
"""

from __future__ import annotations

import logging
from time import time_ns as _time_ns
from typing import Any, Callable, Sequence

logger = logging.getLogger("otel_llm")

# counts per bucket (len(boundaries) + 1), the sum of the counted values, their minimum and maximum
CountsRecorder = Callable[[Sequence[int], float, float, float], None]


def bind_counts(instrument: Any, attributes: dict[str, Any], boundaries: Sequence[float]) -> CountsRecorder:
    """A recorder of bucket counts for ``instrument`` (a histogram with ``boundaries``) and one label set."""
    own = getattr(instrument, "bind_counts", None)
    if own is not None:
        return own(attributes)
    fast = _SDKCounts.bind(instrument, attributes, tuple(boundaries))
    if fast is not None:
        return fast
    return _Representatives(instrument, dict(attributes), tuple(boundaries))


def fast_path(recorder: Any) -> bool:
    """Whether ``recorder`` bypasses the public API's per-call machinery."""
    return isinstance(recorder, (_SDKCounts, _SDKValue))


ValueRecorder = Callable[[float, Any], None]  # (amount, context or None)


def bind_value(instrument: Any, attributes: dict[str, Any]) -> ValueRecorder:
    """A recorder of single values (a histogram's ``record``, a counter's ``add``) for one label set."""
    if _SDK is not None and isinstance(instrument, (_SDK.histogram, _SDK.counter)):
        try:
            bound = _SDKValue(instrument, attributes)
            if bound.usable():
                return bound
        except (AttributeError, TypeError, KeyError) as exc:
            _moved(exc)
    call = instrument.record if hasattr(instrument, "record") else instrument.add
    attrs = dict(attributes)

    def record(amount: float, context: Any = None) -> None:
        call(amount, attrs, context=context)
    return record


class _Value:
    """What an aggregation's ``aggregate`` reads of a ``Measurement`` when no exemplar is offered."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


class _Measured:
    """What an aggregation's ``aggregate`` (and its exemplar reservoir's ``offer``) reads of a ``Measurement``
    when an exemplar may be offered: the SDK's ``Measurement`` less its per-call attribute cleaning."""

    __slots__ = ("value", "time_unix_nano", "instrument", "context", "attributes")

    def __init__(self, value: float, time_unix_nano: int, instrument: Any, context: Any,
                 attributes: dict[str, Any]) -> None:
        self.value = value
        self.time_unix_nano = time_unix_nano
        self.instrument = instrument
        self.context = context
        self.attributes = attributes


class _SDKValue:
    """One instrument and label set: each value goes to the SDK's aggregations through their ``aggregate``."""

    __slots__ = ("_instrument", "_public", "_consumer", "_attributes", "_storages", "_matches", "_measured",
                 "_filter")

    def __init__(self, instrument: Any, attributes: dict[str, Any]) -> None:
        self._instrument = instrument
        self._public = instrument.record if isinstance(instrument, _SDK.histogram) else instrument.add
        self._consumer = instrument._measurement_consumer
        self._attributes = dict(attributes)
        self._storages: Any = None
        self._matches: list[tuple[Any, Any, dict[str, Any]]] = []
        # the label set as the SDK's Measurement cleans it (what an exemplar keeps), once: it never changes
        self._measured = _SDK.measurement(0, 0, instrument, None, self._attributes).attributes
        self._filter = self._consumer._sdk_config.exemplar_filter

    def usable(self) -> bool:
        # the default filter offers exemplars only for a sampled span in the context: none without one
        if not isinstance(self._filter, _SDK.no_exemplar_without_context):
            return False
        self._resolve()
        return True

    def _resolve(self) -> None:
        storages = self._consumer._reader_storages
        matches = []
        for storage in list(storages.values()):
            for match in storage._get_or_init_view_instrument_match(self._instrument):
                keys = match._view._attribute_keys
                attrs = dict(self._attributes) if keys is None else {
                    k: v for k, v in self._attributes.items() if k in keys}
                matches.append((match, _SDK.hash(attrs), attrs))
        self._storages, self._matches = storages, matches

    def __call__(self, amount: float, context: Any = None) -> None:
        # NaN, infinities and negative values: the SDK warns and ignores (its public call says so)
        if not 0 <= amount < _INF:
            self._public(amount, self._attributes, context=context)
            return
        if not self._instrument._is_enabled():
            return
        if self._consumer._reader_storages is not self._storages:
            self._resolve()
        if context is None:  # no exemplar: the filters usable() allows offer none without a context
            value, sample = _Value(amount), False
        else:  # as Histogram.record / Counter.add, then consume_measurement: the time, then the filter's say
            now = _time_ns()
            sample = self._filter.should_sample(amount, now, self._measured, context)
            value = _Measured(amount, now, self._instrument, context, self._measured)
        for match, key, attrs in self._matches:
            if match._reset_on_collect:  # as consume_measurement: collect() discards aggregations meanwhile
                with match._lock:
                    match._get_or_create_aggregation(key, attrs).aggregate(value, sample)
                continue
            agg = match._attributes_aggregation.get(key)
            if agg is None:
                with match._lock:
                    agg = match._get_or_create_aggregation(key, attrs)
            agg.aggregate(value, sample)


_INF = float("inf")


class _Representatives:
    """The public API's way: one ``record`` per counted value, at its bucket's midpoint."""

    __slots__ = ("_record", "_attributes", "_points")

    def __init__(self, instrument: Any, attributes: dict[str, Any], boundaries: tuple[float, ...]) -> None:
        self._record = instrument.record
        self._attributes = attributes
        edges = (0.0, *boundaries)
        # clamped into [lo, hi] below, a bucket's point stays in its bucket (the last one's becomes hi)
        self._points = [(a + b) / 2 for a, b in zip(edges, edges[1:])] + [float("inf")]

    def __call__(self, counts: Sequence[int], total: float, lo: float, hi: float) -> None:
        record, attrs = self._record, self._attributes
        for point, count in zip(self._points, counts):
            value = min(max(point, lo), hi)  # inside what was seen
            for _ in range(count):
                record(value, attrs)


class _SDKCounts:
    """The SDK's explicit-bucket aggregations for one instrument and label set, updated as ``aggregate`` does."""

    __slots__ = ("_instrument", "_consumer", "_attributes", "_boundaries", "_storages", "_matches", "_width")

    def __init__(self, instrument: Any, attributes: dict[str, Any], boundaries: tuple[float, ...]) -> None:
        self._instrument = instrument
        self._consumer = instrument._measurement_consumer
        self._attributes = dict(attributes)
        self._boundaries = boundaries
        self._width = len(boundaries) + 1
        self._storages: Any = None  # the consumer's reader storages the matches were resolved from
        self._matches: list[tuple[Any, Any, dict[str, Any]]] = []  # (view match, hashed key, attributes)

    @classmethod
    def bind(cls, instrument: Any, attributes: dict[str, Any], boundaries: tuple[float, ...]) -> "_SDKCounts | None":
        if _SDK is None or not isinstance(instrument, _SDK.histogram):
            return None
        try:
            bound = cls(instrument, attributes, boundaries)
            return bound if bound._resolve() else None
        except (AttributeError, TypeError, KeyError) as exc:
            _moved(exc)
            return None

    def _resolve(self) -> bool:
        """The view matches of every reader (readers may come and go: resolved again when they do)."""
        storages = self._consumer._reader_storages
        matches = []
        for storage in list(storages.values()):
            for match in storage._get_or_init_view_instrument_match(self._instrument):
                template = match._aggregation  # the view's aggregation, built without attributes
                if isinstance(template, _SDK.drop):
                    continue
                if type(template) is not _SDK.explicit or tuple(template._boundaries) != self._boundaries:
                    return False  # a view changed the aggregation: the public API knows how
                keys = match._view._attribute_keys
                attrs = dict(self._attributes) if keys is None else {
                    k: v for k, v in self._attributes.items() if k in keys}
                matches.append((match, _SDK.hash(attrs), attrs))
        self._storages, self._matches = storages, matches
        return True

    def __call__(self, counts: Sequence[int], total: float, lo: float, hi: float) -> None:
        if len(counts) != self._width:
            raise ValueError(f"{len(counts)} bucket counts for {self._width} buckets")
        if not self._instrument._is_enabled():
            return
        if self._consumer._reader_storages is not self._storages and not self._resolve():
            _Representatives(self._instrument, self._attributes, self._boundaries)(counts, total, lo, hi)
            return
        nonzero = [(i, c) for i, c in enumerate(counts) if c]
        for match, key, attrs in self._matches:
            with match._lock:  # as the SDK's own consume_measurement (held when aggregations reset on collect)
                agg = match._get_or_create_aggregation(key, attrs)
                with agg._lock:  # as the aggregation's own aggregate()
                    value = agg._value
                    if value is None:
                        value = agg._value = agg._get_empty_bucket_counts()
                    for i, count in nonzero:
                        value[i] += count
                    agg._sum += total
                    if agg._record_min_max:
                        if lo < agg._min:
                            agg._min = lo
                        if hi > agg._max:
                            agg._max = hi


class _SDKNames:
    """The metrics SDK's private names this module reads, imported once."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, TraceBasedExemplarFilter
        from opentelemetry.sdk.metrics._internal import _view_instrument_match as vim
        from opentelemetry.sdk.metrics._internal import aggregation, instrument, measurement

        self.histogram = instrument._Histogram
        self.counter = instrument._Counter
        self.no_exemplar_without_context = (TraceBasedExemplarFilter, AlwaysOffExemplarFilter)
        self.explicit = aggregation._ExplicitBucketHistogramAggregation
        self.drop = aggregation._DropAggregation
        self.hash = vim._hash_attributes
        self.measurement = measurement.Measurement


def _load() -> "_SDKNames | None":
    try:
        return _SDKNames()
    except (ImportError, AttributeError) as exc:
        _moved(exc)
        return None


def _moved(exc: BaseException) -> None:
    logger.info("otel-llm: the OpenTelemetry SDK's metrics internals moved (%r): metrics go through the "
                "public API (inter-token counts: one Histogram.record per counted token)", exc)


_SDK = _load()
