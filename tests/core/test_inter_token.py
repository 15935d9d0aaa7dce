"""Inter-token latencies: a request's token stamps bucketed once, and the metrics they end up in."""

from __future__ import annotations

from bisect import bisect_left

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.inter_token import ITL_BUCKETS, gap_summary
from otel_llm.core.metrics import INTER_TOKEN_LATENCY
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import RequestTimeline
from support.metrics import points_by_name

STAMPS = [10.0, 10.012, 10.031, 10.032, 10.5, 10.51, 13.2]


def _naive(stamps: list[float]) -> list[int]:
    counts = [0] * (len(ITL_BUCKETS) + 1)
    for a, b in zip(stamps, stamps[1:]):
        counts[bisect_left(ITL_BUCKETS, b - a)] += 1
    return counts


def test_one_token_a_step_counts_every_gap_in_its_bucket() -> None:
    g = gap_summary(STAMPS)
    assert g is not None
    assert g.counts == _naive(STAMPS) and g.count == len(STAMPS) - 1
    assert g.total == pytest.approx(STAMPS[-1] - STAMPS[0])
    assert g.max_gap == g.hi == pytest.approx(2.69) and g.lo == pytest.approx(0.001)
    assert gap_summary([]) is None and gap_summary([1.0]) is None


def test_a_step_with_several_tokens_counts_them_at_the_gap_over_their_number() -> None:
    # the 3rd stamp brought 4 tokens after 0.2 s: 4 tokens of 0.05 s; the longest gap stays 0.2 s
    g = gap_summary([0.0, 0.02, 0.22, 0.24], {2: 4})
    assert g is not None
    assert g.count == 1 + 4 + 1  # output tokens after the first step's
    expected = [0] * (len(ITL_BUCKETS) + 1)
    for value, n in ((0.02, 1), (0.05, 4), (0.02, 1)):
        expected[bisect_left(ITL_BUCKETS, value)] += n
    assert g.counts == expected
    assert g.max_gap == pytest.approx(0.2) and g.hi == pytest.approx(0.05)
    assert g.total == pytest.approx(0.24)  # the sum of the counted values: the decode time


def test_every_request_gets_its_gaps_in_the_histogram_and_the_max_gap_metric() -> None:
    reader = InMemoryMetricReader()
    telemetry = Pipeline(Config(sample_rate=0.0, tail_quantile=0), TracerProvider().get_tracer("t"),
                          MeterProvider(metric_readers=[reader]).get_meter("t"), "test")
    try:
        requests = [STAMPS, [1.0, 1.1], [5.0]]  # the last has no gap
        for i, stamps in enumerate(requests):
            t = RequestTimeline(str(i), 0.0, model="m")
            t.token_ts.extend(stamps)
            telemetry.start(t)
            telemetry.finish(str(i), RequestSummary(model="m", output_tokens=len(stamps), e2e=1.0))
        assert telemetry.flush(10)
        points = points_by_name(reader.get_metrics_data())
        (itl,) = points[INTER_TOKEN_LATENCY.name]
        assert itl.count == sum(len(s) - 1 for s in requests)
        assert list(itl.bucket_counts) == [a + b for a, b in zip(_naive(STAMPS), _naive([1.0, 1.1]))]
        assert itl.max == pytest.approx(2.69) and itl.min == pytest.approx(0.001)
        (max_gap,) = points["llm.server.inter_token.max_gap"]
        assert max_gap.count == 2 and max_gap.max == pytest.approx(2.69) and max_gap.min == pytest.approx(0.1)
    finally:
        telemetry.close()


def test_the_request_span_carries_the_counts_and_the_collector_reads_the_max_gap() -> None:
    from otel_llm.core.spans import request_attributes

    t = RequestTimeline("r", 0.0, model="m")
    s = RequestSummary(model="m", e2e=3.0)
    s.gaps = gap_summary(STAMPS)
    s.max_gap = s.gaps.max_gap
    a = request_attributes(t, s, "baseline", True, (), False)
    assert a[sc.LATENCY_ITL_COUNTS] == tuple(_naive(STAMPS))
    assert RequestSummary.from_attributes(a).max_gap == pytest.approx(2.69)


def test_a_gap_on_a_boundary_goes_where_the_sdk_puts_it() -> None:
    # (b[i-1], b[i]]: a value equal to a boundary belongs to the bucket that boundary closes
    stamps = [0.0, 0.025, 0.05, 0.1, 2.6, 12.6]  # gaps 0.025, 0.025, 0.05, 2.5, 10 (above the last boundary)
    g = gap_summary(stamps)
    assert g is not None and g.counts == _naive(stamps)
    assert g.counts[-1] == 1 and g.counts[ITL_BUCKETS.index(2.5)] == 1
