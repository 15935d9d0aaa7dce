"""The gateway's inter-token latency histogram, derived from request spans' compact bucket counts
(``llm.latency.inter_token.bucket_counts``), equals what the SDK records in-process for the same requests."""

from __future__ import annotations

import random

import pytest
from collector_testkit import export_request, loopback_config, request_attrs, span
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.inter_token import ITL_BUCKETS, from_counts, gap_summary
from otel_llm.core.metrics import INTER_TOKEN_LATENCY
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import RequestTimeline
from otel_llm_collector.gateway import Gateway
from support.metrics import points_by_name

WIDTH = len(ITL_BUCKETS) + 1


def _requests(n: int, seed: int = 5) -> list[list[float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t, stamps = rng.uniform(0, 100), []
        for _ in range(rng.randint(1, 80)):  # one stamp: no gap, nothing counted
            stamps.append(t)
            t += rng.choice([rng.uniform(0.004, 0.06)] * 9 + [rng.uniform(0.2, 12)])
        out.append(stamps)
    return out


def _sdk_side(requests: list[list[float]]):
    """The requests through the core's pipeline: its own histogram, and its request spans as OTLP."""
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Pipeline(Config(sample_rate=1.0, tail_quantile=0), tracer_provider.get_tracer("t"),
                         MeterProvider(metric_readers=[reader]).get_meter("t"), "test")
    try:
        for i, stamps in enumerate(requests):
            t = RequestTimeline(str(i), stamps[0] - 0.05, model="m")
            t.token_ts.extend(stamps)
            telemetry.start(t)
            telemetry.finish(str(i), RequestSummary(model="m", output_tokens=len(stamps), ttft=0.05,
                                                    e2e=stamps[-1] - stamps[0] + 0.05,
                                                    decode=stamps[-1] - stamps[0]))
        assert telemetry.flush(10)
    finally:
        telemetry.close()
    (point,) = points_by_name(reader.get_metrics_data())[INTER_TOKEN_LATENCY.name]
    return point, encode_spans(spans.get_finished_spans())


def _gateway_point(request) -> object | None:
    g = Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True).start()
    try:
        g.ingest(request)
        points = points_by_name(g.metric_reader.get_metrics_data()).get(INTER_TOKEN_LATENCY.name, [])
    finally:
        g.shutdown()
    assert len(points) <= 1
    return points[0] if points else None


def test_the_gateway_adds_up_the_spans_counts_as_the_sdk_recorded_them() -> None:
    requests = _requests(120)
    sdk, otlp = _sdk_side(requests)
    assert sdk.count == sum(len(s) - 1 for s in requests) > 0
    got = _gateway_point(otlp)
    assert got is not None
    assert got.count == sdk.count
    assert list(got.bucket_counts) == list(sdk.bucket_counts)
    assert got.sum == pytest.approx(sdk.sum, rel=1e-9)  # the spans' decode times: the same first-to-last spans
    # min and max are bounds from the buckets (and the longest gap), never tighter than the truth
    assert got.min <= sdk.min and got.max == pytest.approx(sdk.max)


def test_counts_the_histogram_cannot_hold_are_ignored_not_recorded() -> None:
    good = [0] * WIDTH
    good[3] = 4
    bad = {"short": good[:-1], "negative": [-1] + good[1:], "a float": [0.5] + good[1:],
           "a bool": [True] + good[1:], "huge": [2**40] + good[1:], "strings": ["1"] * WIDTH, "scalar": 7}
    attrs = [request_attrs(**{sc.LATENCY_DECODE: 1.0, sc.LATENCY_ITL_COUNTS: v}) for v in bad.values()]
    request = export_request(*(span(10 + i, 1, attrs=a) for i, a in enumerate(attrs)),
                             span(99, 1, attrs=request_attrs(**{sc.LATENCY_DECODE: 0.08, sc.LATENCY_ITL_COUNTS: good})))
    got = _gateway_point(request)
    assert got is not None and got.count == 4 and list(got.bucket_counts) == good
    assert got.sum == pytest.approx(0.08)
    for name, value in bad.items():
        assert RequestSummary.from_attributes(request_attrs(**{sc.LATENCY_ITL_COUNTS: value})).gaps is None, name


def test_from_counts_bounds() -> None:
    g = gap_summary([0.0, 0.01, 0.02, 0.5])
    assert g is not None
    back = from_counts(g.counts, g.total, g.max_gap)
    assert back is not None and back.counts == g.counts and back.total == g.total
    assert back.lo <= g.lo and back.hi == pytest.approx(g.hi) and back.max_gap == pytest.approx(g.max_gap)
    # no decode time on the span: each bucket's midpoint stands for its values
    mid = from_counts(g.counts, None, None)
    assert mid is not None and 0 < mid.total and mid.hi >= g.hi
    assert from_counts([0] * WIDTH, 1.0, None) is None
