"""The collector's aggregation backend against the OpenTelemetry SDK on the same inputs.

The core's ``ServerMetrics`` records the same requests into both; the data points (counts,
sums, bucket counts, min/max, label sets) and the rendered Prometheus exposition must match.
"""

from __future__ import annotations

import math
import random
import threading

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from otel_llm.core.inter_token import gap_summary
from otel_llm.core.metrics import INTER_TOKEN_LATENCY, FirstN, ServerMetrics
from otel_llm.core.slo import SLOTable
from otel_llm.core.summary import RequestSummary
from otel_llm_collector.aggregation import CARDINALITY_LIMIT, AggregationBackend
from otel_llm_collector.fast.metrics import BatchMetrics
from otel_llm_collector.prometheus import OtelBridge

SLOS = SLOTable.parse("ttft=0.5,tpot=0.05; big: ttft=2")


def summaries(n: int, seed: int = 3) -> list[RequestSummary]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        e2e = rng.lognormvariate(0, 1)
        out.append(RequestSummary(
            model=rng.choice(["llama", "big", None]), provider=rng.choice(["vllm", None]),
            operation=rng.choice(["text_completion", "chat"]),
            ttft=rng.choice([rng.lognormvariate(-2.5, 1), 0.5, 0.0, None]),  # 0.5: exactly on a bound
            tpot=rng.choice([rng.uniform(0, 0.2), None]), e2e=e2e,
            queue=rng.choice([rng.uniform(0, 0.01), None]), prefill=rng.uniform(0, 0.1),
            decode=rng.uniform(0, 5), input_tokens=rng.randint(0, 5000),
            output_tokens=rng.choice([rng.randint(0, 2000), None]),
            output_characters=rng.choice([rng.randint(0, 9000), None]),
            error_type=rng.choice([None] * 9 + ["timeout"]),
            slow_cause=rng.choice([None, "queue_kv_cache", "preemption", "not-a-cause"]),
            gaps=rng.choice([None, gap_summary(_stamps(rng))])))
    return out


def _stamps(rng: random.Random) -> list[float]:
    """A request's token stamps: mostly steady decode, now and then a stall (above the last boundary too)."""
    t, out = 0.0, [0.0]
    for _ in range(rng.randint(1, 60)):
        t += rng.choice([rng.uniform(0.005, 0.05)] * 8 + [rng.uniform(0.1, 3), rng.uniform(3, 20)])
        out.append(t)
    return out


def record_both(items: list[RequestSummary], services=("a", "b"), batched: bool = False):
    """The SDK records one request at a time; the backend too, or (``batched``) in lists through the collector's
    ``BatchMetrics`` (what the gateway records with)."""
    reader = InMemoryMetricReader()
    sdk = MeterProvider(metric_readers=[reader])
    fast = AggregationBackend()
    good = {}
    for provider in (sdk, fast):
        meter = provider.get_meter("otel_llm_collector.llm_metrics")
        per_service = [ServerMetrics(meter, SLOS, {"service.name": s}) for s in services]
        if batched and provider is fast:
            good[provider] = 0
            batch = BatchMetrics(meter, SLOS, FirstN(4096))
            for start in range(0, len(items), 97):  # batches that split label sets and services unevenly
                chunk = list(enumerate(items))[start:start + 97]
                for k, service in enumerate(services):
                    good[provider] += batch.record([s for i, s in chunk if i % len(services) == k],
                                                   (("service.name", service),))
        else:
            good[provider] = sum(per_service[i % len(per_service)].record(s) for i, s in enumerate(items))
    assert good[sdk] == good[fast]
    return reader, fast


def points(reader) -> dict:
    """(metric, sorted labels) -> comparable point values."""
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    key = (m.name, m.unit, m.description, tuple(sorted(p.attributes.items())))
                    if hasattr(p, "bucket_counts"):
                        out[key] = (p.count, round(p.sum, 9), tuple(p.bucket_counts), tuple(p.explicit_bounds),
                                    p.min, p.max)
                    else:
                        out[key] = (p.value,)
    return out


def exposition(reader) -> str:
    reg = CollectorRegistry(auto_describe=True)
    reg.register(OtelBridge(reader))
    return generate_latest(reg).decode()


@pytest.mark.parametrize("batched", [False, True])
def test_same_points_as_the_sdk(batched: bool) -> None:
    # batched: lists of requests, as the gateway records (recorders bound to skip the lock, which the batch holds)
    odd = [RequestSummary(model="llama", ttft=-1.0, e2e=math.nan, tpot=math.inf, output_tokens=3),
           RequestSummary(model="llama", ttft=0.001, e2e=0.0, input_tokens=0, output_characters=0)]
    reader, fast = record_both(summaries(3000) + odd * 3, batched=batched)
    expected, got = points(reader), points(fast)
    assert got.keys() == expected.keys() and len(got) > 50
    assert any(key[0] == INTER_TOKEN_LATENCY.name for key in got)  # whole requests' bucket counts, added
    for key, value in expected.items():
        if len(value) == 1:  # a counter
            assert got[key] == value, key
        else:  # a histogram: sums added in the same order, compared with a tolerance anyway
            assert got[key][:1] + got[key][2:] == value[:1] + value[2:], key
            assert math.isclose(got[key][1], value[1], rel_tol=1e-9), key


def test_a_batch_whose_values_are_all_ignored_makes_no_series() -> None:
    # the SDK has no queue series for a label set whose only queue value was negative (nothing was recorded)
    items = [RequestSummary(model="solo", e2e=1.0, queue=-0.5), RequestSummary(model="solo", e2e=1.0)]
    reader, fast = record_both(items, services=("a",), batched=True)
    assert points(fast) == points(reader)


def test_a_negative_character_count_in_a_batch_is_ignored_not_subtracted() -> None:
    items = [RequestSummary(model="solo", e2e=1.0, output_characters=-5),
             RequestSummary(model="solo", e2e=1.0, output_characters=10)]
    reader, fast = record_both(items, services=("a",), batched=True)
    assert points(fast) == points(reader)


def test_same_prometheus_exposition_as_the_sdk() -> None:
    reader, fast = record_both(summaries(1000))
    lines = lambda text: sorted(line for line in text.splitlines() if "_created" not in line)  # noqa: E731
    sdk, ours = lines(exposition(reader)), lines(exposition(fast))
    assert len(ours) > 200
    if sdk != ours:  # sums may differ in the last digit (float addition order is the same, but be explicit)
        strip = lambda ls: [ln.rsplit(" ", 1)[0] if "_sum" in ln else ln for ln in ls]  # noqa: E731
        assert strip(sdk) == strip(ours)


def test_ignores_what_the_sdk_ignores() -> None:
    backend = AggregationBackend()
    meter = backend.get_meter("m")
    h = meter.create_histogram("h", explicit_bucket_boundaries_advisory=[1.0, 2.0])
    c = meter.create_counter("c")
    for v in (-1.0, math.nan, math.inf, -math.inf):
        h.record(v, {"k": "v"})
        c.add(v, {"k": "v"})
    assert backend.get_metrics_data() is None
    h.record(1.0, {"k": "v"})  # on the bound: its bucket (le=1.0), as bisect_left in the SDK
    h.record(2.5)
    point = {tuple(p.attributes.items()): p for p in
             backend.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points}
    assert point[(("k", "v"),)].bucket_counts == (1, 0, 0) and point[()].bucket_counts == (0, 0, 1)
    assert meter.create_histogram("h") is h  # same name, same instrument


def test_label_sets_by_value_not_identity_and_cardinality_overflow() -> None:
    reader = InMemoryMetricReader()
    sdk, fast = MeterProvider(metric_readers=[reader]), AggregationBackend()
    for provider in (sdk, fast):
        c = provider.get_meter("m").create_counter("c")
        c.add(1, {"a": "x"})
        c.add(2, {"a": "x"})  # a different dict with the same labels: the same series
        c.add(1, {"a": 1})  # int 1 and True are different label values
        c.add(1, {"a": True})
        for i in range(CARDINALITY_LIMIT + 10):
            c.add(1, {"i": i})

    def series(r) -> list:
        pts = r.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
        return sorted(repr(sorted((k, type(v).__name__, v) for k, v in p.attributes.items())) + f"={p.value}"
                      for p in pts)

    ours = series(fast)
    assert ours == series(reader)
    assert len(ours) == CARDINALITY_LIMIT + 1 and "[('otel.metric.overflow', 'bool', True)]=13" in ours


def test_concurrent_records_are_not_lost() -> None:
    backend = AggregationBackend()
    h = backend.get_meter("m").create_histogram("h", explicit_bucket_boundaries_advisory=[1.0])
    attrs = {"k": "v"}

    def work() -> None:
        for _ in range(20_000):
            h.record(0.5, attrs)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p = backend.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
    assert p.count == 80_000 and p.sum == 40_000.0


def test_a_histogram_batch_equals_its_values_recorded_one_by_one() -> None:
    """``bind_many``'s recorder (checks the common case in C, counts large batches per bucket with a Counter)
    leaves each series as ``record`` of the same values in order does: random batches of every length around
    the Counter threshold, with negatives, NaN, infinities, ints and values whose sum overflows mixed in."""
    rng = random.Random(3)
    odd = [-1.0, -0.0, 0.0, math.nan, math.inf, -math.inf, 1e308, 5, 0, 2.0, 1.0]
    one, many = AggregationBackend(), AggregationBackend()
    h1 = one.get_meter("m").create_histogram("h", explicit_bucket_boundaries_advisory=[0.5, 1.0, 2.0, 4.0])
    hm = many.get_meter("m").create_histogram("h", explicit_bucket_boundaries_advisory=[0.5, 1.0, 2.0, 4.0])
    for label in range(60):
        attrs = {"k": label % 7}
        record_many = hm.bind_many(attrs)
        for _ in range(3):
            values = [rng.choice(odd) if rng.random() < 0.2 else rng.lognormvariate(0, 1)
                      for _ in range(rng.randint(1, 40))]
            record_many(values)
            for v in values:
                h1.record(v, attrs)

    def series(backend) -> dict:
        data = backend.get_metrics_data()
        return {tuple(p.attributes.items()): p for p in data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points}
    got, want = series(many), series(one)
    assert got.keys() == want.keys() and len(want) == 7
    for key, p in want.items():
        q = got[key]
        assert (q.count, q.bucket_counts, q.min, q.max) == (p.count, p.bucket_counts, p.min, p.max), key
        assert math.isclose(q.sum, p.sum, rel_tol=1e-9), key


def test_the_bridge_serves_observable_gauges() -> None:
    # the SDK's GPU instruments are observable gauges (OpenTelemetry Gauge data, not a Sum): served as gauges
    from opentelemetry.metrics import Observation

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("gauges")
    meter.create_observable_gauge("hw.power", callbacks=[lambda _o: [Observation(300.0, {"hw.id": "GPU-0"})]],
                                  unit="W")
    bridge = OtelBridge(reader)
    text = exposition(reader)
    assert '# TYPE hw_power_W gauge\nhw_power_W{hw_id="GPU-0"} 300.0\n' in text
    assert bridge.text() == text  # the endpoint's own writer, as prometheus_client writes it
