"""Bucket counts added in one call land exactly where the SDK's own per-value ``record`` puts them.

Also the fence: with the installed OpenTelemetry SDK the one-step path must be the one in use
(``fast_path``); if the SDK's private internals move, this fails loudly instead of the
inter-token histogram silently becoming a record call per token.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

from otel_llm.core.sdk_metrics import bind_counts, bind_value, fast_path

BOUNDS = (0.01, 0.025, 0.05, 0.1)
ATTRS = {"gen_ai.request.model": "m", "gen_ai.operation.name": "chat"}


def _counts(values: list[float]) -> list[int]:
    counts = [0] * (len(BOUNDS) + 1)
    for v in values:
        counts[bisect_left(BOUNDS, v)] += 1
    return counts


def _points(reader) -> dict[str, list]:
    data = reader.get_metrics_data() if isinstance(reader, InMemoryMetricReader) else reader
    out: dict[str, list] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if not hasattr(m.data.data_points[0], "bucket_counts"):
                    continue
                # the sum to 12 digits: a request's values are summed before they are added
                out[m.name] = [(dict(p.attributes), p.count, p.bucket_counts, round(p.sum, 12), p.min, p.max)
                               for p in m.data.data_points]
    return out


def _pair(temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE, views=()):
    from opentelemetry.sdk.metrics import Histogram

    reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
    meter = MeterProvider(metric_readers=[reader], views=list(views)).get_meter("t")
    ours = meter.create_histogram("ours", unit="s", explicit_bucket_boundaries_advisory=list(BOUNDS))
    sdk = meter.create_histogram("sdk", unit="s", explicit_bucket_boundaries_advisory=list(BOUNDS))
    return reader, ours, sdk


REQUESTS = [[0.012, 0.013, 0.2, 0.012], [0.001], [0.03, 0.03, 0.07, 0.5, 0.004]]


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_counts_match_the_sdks_own_records(temporality: AggregationTemporality) -> None:
    reader, ours, sdk = _pair(temporality)
    add = bind_counts(ours, ATTRS, BOUNDS)
    assert fast_path(add), "the SDK's histogram internals moved: see otel_llm.core.sdk_metrics.py"
    for round_ in range(2):  # a collection in between: delta aggregations are reset (and rebuilt)
        for values in REQUESTS:
            add(_counts(values), sum(values), min(values), max(values))
            for v in values:
                sdk.record(v, ATTRS)
        points = _points(reader)
        assert points["ours"] == points["sdk"], round_
        per_round = sum(map(len, REQUESTS))
        cumulative = temporality is AggregationTemporality.CUMULATIVE
        assert points["ours"][0][1] == per_round * (round_ + 1 if cumulative else 1)


def test_a_view_that_changes_the_aggregation_gets_the_public_api() -> None:
    view = View(instrument_name="ours", aggregation=ExponentialBucketHistogramAggregation())
    reader, ours, _ = _pair(views=[view])
    add = bind_counts(ours, ATTRS, BOUNDS)
    assert not fast_path(add)
    add(_counts(REQUESTS[0]), sum(REQUESTS[0]), min(REQUESTS[0]), max(REQUESTS[0]))
    data = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0]
    assert data.data.data_points[0].count == len(REQUESTS[0])


def test_a_view_that_keeps_some_attributes_lands_in_the_same_series() -> None:
    view = View(instrument_name="*", attribute_keys={"gen_ai.request.model"})
    reader, ours, sdk = _pair(views=[view])
    add = bind_counts(ours, ATTRS, BOUNDS)
    assert fast_path(add)
    values = REQUESTS[2]
    add(_counts(values), sum(values), min(values), max(values))
    for v in values:
        sdk.record(v, ATTRS)
    points = _points(reader)
    assert points["ours"] == points["sdk"]
    assert points["ours"][0][0] == {"gen_ai.request.model": "m"}


def test_a_reader_added_later_gets_the_counts_too() -> None:
    first = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[first])
    hist = provider.get_meter("t").create_histogram("h", explicit_bucket_boundaries_advisory=list(BOUNDS))
    add = bind_counts(hist, ATTRS, BOUNDS)
    add(_counts([0.02]), 0.02, 0.02, 0.02)
    second = InMemoryMetricReader()
    provider.add_metric_reader(second)
    add(_counts([0.3, 0.3]), 0.6, 0.3, 0.3)
    assert _points(first)["h"][0][1] == 3
    assert _points(second)["h"][0][1] == 2


def test_wrong_width_is_refused_and_representatives_keep_bucket_counts() -> None:
    reader, ours, _ = _pair()
    add = bind_counts(ours, ATTRS, BOUNDS)
    with pytest.raises(ValueError):
        add([1, 2], 0.1, 0.05, 0.05)

    class NotSDK:  # any other histogram: the public record, once per counted value
        def __init__(self) -> None:
            self.values: list[float] = []

        def record(self, value: float, attributes=None, context=None) -> None:
            self.values.append(value)

    other = NotSDK()
    slow = bind_counts(other, ATTRS, BOUNDS)
    assert not fast_path(slow)
    values = REQUESTS[2]
    slow(_counts(values), sum(values), min(values), max(values))
    assert _counts(other.values) == _counts(values)


def _sums(data) -> dict[str, list]:
    return {m.name: sorted((tuple(sorted(p.attributes.items())), p.value) for p in m.data.data_points)
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if hasattr(m.data.data_points[0], "value")}


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_values_match_the_sdks_own_record_and_add(temporality: AggregationTemporality) -> None:
    from opentelemetry.sdk.metrics import Counter, Histogram

    reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality, Counter: temporality})
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    pairs = [(meter.create_histogram(f"{side}_h", explicit_bucket_boundaries_advisory=list(BOUNDS)),
              meter.create_counter(f"{side}_c")) for side in ("ours", "sdk")]
    (hist, counter), (sdk_hist, sdk_counter) = pairs
    record, add = bind_value(hist, ATTRS), bind_value(counter, ATTRS)
    assert fast_path(record) and fast_path(add), "the SDK's metrics internals moved: see core/sdk_metrics.py"
    for round_ in range(2):
        for v in (0.02, 0.3, 0.0, -1.0, float("nan"), 7.5):  # the SDK ignores the negative and the NaN
            record(v, None)
            sdk_hist.record(v, ATTRS)
            add(v, None)
            sdk_counter.add(v, ATTRS)
        data = reader.get_metrics_data()  # once: a delta reader's collection resets
        points, sums = _points(data), _sums(data)
        assert points["ours_h"] == points["sdk_h"], round_
        assert sums["ours_c"] == sums["sdk_c"], round_


def test_a_value_with_a_sampled_span_context_keeps_its_exemplar() -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    reader = InMemoryMetricReader()
    hist = MeterProvider(metric_readers=[reader]).get_meter("t").create_histogram(
        "h", explicit_bucket_boundaries_advisory=list(BOUNDS))
    record = bind_value(hist, ATTRS)
    ctx = trace.set_span_in_context(NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(1))))
    record(0.02, ctx)
    record(0.03, None)
    (point,) = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert point.count == 2
    assert [e.trace_id for e in point.exemplars] == [1]


def test_an_always_on_exemplar_filter_gets_the_public_api() -> None:
    from opentelemetry.sdk.metrics import AlwaysOnExemplarFilter

    provider = MeterProvider(metric_readers=[InMemoryMetricReader()], exemplar_filter=AlwaysOnExemplarFilter())
    hist = provider.get_meter("t").create_histogram("h")
    assert not fast_path(bind_value(hist, ATTRS))


def _exemplars(data) -> dict[str, list]:
    """Per instrument: each point's series and its exemplars, less their timestamps (the SDK reads the clock
    once per record: the two paths' reads differ)."""
    return {m.name: [(tuple(sorted(p.attributes.items())),
                      [(e.value, e.trace_id, e.span_id, dict(e.filtered_attributes or {})) for e in p.exemplars])
                     for p in m.data.data_points]
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.mark.parametrize("keys", [None, {"gen_ai.request.model"}])
@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_values_with_contexts_keep_the_exemplars_the_sdks_own_record_and_add_keep(
        temporality: AggregationTemporality, keys: set[str] | None) -> None:
    """A kept request's values carry its span context: the fast path hands them to the SDK's aggregations
    with that context, so exemplars (which span, which value, the attributes a view dropped) are the
    ones the public calls make; an unsampled context or none offers no exemplar."""
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import Counter, Histogram
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality, Counter: temporality})
    views = [View(instrument_name="*", attribute_keys=keys)] if keys else []
    meter = MeterProvider(metric_readers=[reader], views=views).get_meter("t")
    (hist, counter), (sdk_hist, sdk_counter) = [
        (meter.create_histogram(f"{side}_h", explicit_bucket_boundaries_advisory=list(BOUNDS)),
         meter.create_counter(f"{side}_c")) for side in ("ours", "sdk")]
    record, add = bind_value(hist, ATTRS), bind_value(counter, ATTRS)
    assert fast_path(record) and fast_path(add), "the SDK's metrics internals moved: see core/sdk_metrics.py"

    def ctx(span_id: int, sampled: bool):
        return trace.set_span_in_context(NonRecordingSpan(SpanContext(7, span_id, False, TraceFlags(int(sampled)))))
    calls = [(0.02, ctx(1, True)), (0.3, ctx(2, True)), (0.03, ctx(3, False)), (0.001, None), (7.5, ctx(4, True)),
             (-1.0, ctx(5, True)), (float("nan"), ctx(6, True)), (0.0, ctx(7, True))]
    for round_ in range(2):
        # a counter's reservoir keeps a random one of the values offered: both sides draw the same numbers
        random.seed(round_)
        for v, c in calls:
            record(v, c)
            add(v, c)
        random.seed(round_)
        for v, c in calls:
            sdk_hist.record(v, ATTRS, context=c)
            sdk_counter.add(v, ATTRS, context=c)
        data = reader.get_metrics_data()  # once: a delta reader's collection resets
        points, sums, exemplars = _points(data), _sums(data), _exemplars(data)
        assert points["ours_h"] == points["sdk_h"], round_
        assert sums["ours_c"] == sums["sdk_c"], round_
        assert exemplars["ours_h"] == exemplars["sdk_h"], round_
        assert exemplars["ours_c"] == exemplars["sdk_c"], round_
        kept = {e[2] for _, es in exemplars["ours_h"] for e in es}
        assert kept and kept <= {1, 2, 4, 7}, round_  # sampled contexts only
        if keys:  # the dropped label is the exemplar's own attribute, as the SDK keeps it
            assert all(e[3] == {"gen_ai.operation.name": "chat"} for _, es in exemplars["ours_h"] for e in es)
