"""Client-chosen label values cannot grow memory or scrapes without bound, nor take another service's
series, nor make a histogram's sum infinite."""

from __future__ import annotations

import gc
import math
import tracemalloc

from prometheus_client import generate_latest

from collector_testkit import export_request, loopback_config, request_attrs, span
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.llm_metrics import BOUND_LABEL_SET_BYTES

TTFT = "gen_ai_server_time_to_first_token_seconds"
# the documented bound (docs/collector-limits.md): what derived metrics may hold at the defaults
METRICS_MEMORY_BOUND = 200 << 20


def gateway(**labels) -> Gateway:
    procs = {"tail_sampling": None}
    if labels:
        procs["llm_metrics"] = {"slo": "", **labels}
    return Gateway(loopback_config(processors=procs, receivers={"otlp": {"protocols": {"grpc": None, "http": None}}},
                                   exporters={"prometheus": None}), manual_ticks=True)


def series(g: Gateway, name: str = TTFT) -> list:
    return [s for m in g.registry.collect() for s in m.samples if s.name == name + "_count"]


def traffic(g: Gateway, services: int, models: int, model_len: int = 8, start: int = 0) -> None:
    """``services`` x ``models`` request spans, one export per service. The request is encoded once and
    its service and model names replaced at the byte level (same lengths): building 100,000 spans
    through the protobuf classes would cost more than the gateway's work being measured."""
    assert models <= 10**6 and services <= 10**4
    template = export_request(*[span(m + 1, 1, attrs=request_attrs(model=f"M{m:06d}".ljust(model_len, "x")))
                                for m in range(models)], service="svc-S0000")
    raw = template.SerializeToString()
    for s in range(start, start + services):
        g.ingest(template, "direct", raw.replace(b"svc-S0000", b"svc-S%04d" % s))


def retained(fn) -> int:
    """Bytes still allocated after ``fn`` (tracemalloc: what our code keeps, not what the allocator does)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_1000_services_x_100_models_stay_under_the_bound_and_scrape_bounded() -> None:
    g = gateway()
    try:
        gc.collect()
        before = rss()
        traffic(g, 1000, 100)
        gc.collect()
        # RSS growth over-states what is kept (the allocator keeps freed memory): a conservative check
        grown = rss() - before
        assert grown < METRICS_MEMORY_BOUND, f"RSS grew {grown / 2**20:.0f} MiB"
        limits = g.config.labels
        assert g.metrics.label_sets.bytes <= limits.label_cache_bytes
        ttft = series(g)
        # label sets: at most max_series (own and per-service overflow ones) plus the global overflow one
        assert len(ttft) <= limits.max_series + 1
        assert sum(1 for s in ttft if not s.labels.get("service_name")) == 1  # the global overflow series
        assert sum(s.value for s in ttft) == 100_000  # every request counted: own series or an overflow one
        # the first services fill max_series with their models; every later request overflows
        assert g.telemetry.total("llm_metrics_overflow_requests") == 100_000 - limits.max_series
        # the scrape's size follows from the label-set bound (~19 KB of text per label set, all instruments)
        scrape = generate_latest(g.registry)
        assert len(scrape) < (limits.max_series + 1) * 25_000, len(scrape)
    finally:
        g.shutdown()


def test_1mb_label_values_are_cut_and_cost_no_memory_beyond_the_bound() -> None:
    g = gateway()
    try:
        def send():
            for i in range(150):
                g.ingest(export_request(span(i + 1, 1, attrs=request_attrs(model=f"{i}-" + "x" * (1 << 20))),
                                        service="s" * (1 << 20)))

        kept = retained(send)
        assert kept < 20 << 20, f"{kept / 2**20:.0f} MiB retained for 150 requests with 1 MB labels"
        models = {s.labels.get("gen_ai_request_model") for s in series(g)}
        # one service (its 1 MB name cut to 256 characters): its first 100 models, then its overflow
        per_service = g.config.labels.max_series_per_service
        assert len(models) == per_service + 1 and max(len(m or "") for m in models) == 256
        assert g.telemetry.value("llm_metrics_labels_truncated", label="model") == 150
        assert g.telemetry.value("llm_metrics_labels_truncated", label="service") == 150
        assert len(generate_latest(g.registry)) < 20 << 20
    finally:
        g.shutdown()


def test_another_service_still_gets_its_own_series_after_one_floods_junk_models() -> None:
    g = gateway()
    try:
        traffic(g, 1, 2000)  # svc-0 sends 2,000 junk model names
        g.ingest(export_request(span(99_999, 1, attrs=request_attrs(model="llama-new")), service="other"))
        ttft = series(g)
        assert g.telemetry.total("llm_metrics_overflow_requests") == 2000 - g.config.labels.max_series_per_service
        mine = [s for s in ttft if s.labels.get("service_name") == "other"]
        assert [s.labels["gen_ai_request_model"] for s in mine] == ["llama-new"]
        flood = [s for s in ttft if s.labels.get("service_name") == "svc-S0000"]
        per_service = g.config.labels.max_series_per_service
        assert len(flood) == per_service + 1  # its share, then its own overflow series
        overflow = [s for s in flood if s.labels.get("otel_metric_overflow") == "True"]
        assert len(overflow) == 1 and overflow[0].value == 2000 - per_service
    finally:
        g.shutdown()


def test_huge_latencies_cannot_make_a_histogram_sum_infinite() -> None:
    g = gateway()
    try:
        for i in range(3):
            g.ingest(export_request(span(i + 1, 1, attrs=request_attrs(e2e=1e308))))
        g.ingest(export_request(span(10, 1, attrs=request_attrs(e2e=2.0))))
        sums = [s.value for m in g.registry.collect() for s in m.samples
                if s.name == "gen_ai_server_request_duration_seconds_sum"]
        assert sums and all(math.isfinite(v) for v in sums)
        assert g.telemetry.value("llm_metrics_values_refused", reason="sum_overflow") >= 2
    finally:
        g.shutdown()


def test_the_label_set_cost_estimate_is_not_below_what_a_label_set_really_costs() -> None:
    g = gateway()
    try:
        traffic(g, 1, 1)  # instruments and first series exist
        before = g.metrics.label_sets.bytes
        kept = retained(lambda: traffic(g, 5, 40, start=10))  # 200 new label sets, their series and cache entries
        per_set = kept / 200
        # the cache's estimate must cover the bound object (series are bounded separately, by count)
        assert (g.metrics.label_sets.bytes - before) / 200 >= BOUND_LABEL_SET_BYTES
        assert per_set < 4 * BOUND_LABEL_SET_BYTES + 20_000, per_set
    finally:
        g.shutdown()


def test_the_endpoint_writer_renders_what_prometheus_client_would() -> None:
    from prometheus_client import CollectorRegistry

    g = gateway()
    try:
        traffic(g, 3, 4)
        g.ingest(export_request(span(50, 1, attrs=request_attrs(model="we\"ird\\mo\ndel", **{"error.type": "x"}))))
        only = CollectorRegistry(auto_describe=True)
        only.register(g.bridge)
        assert g.bridge.text() == generate_latest(only).decode()
        assert g.exposition().startswith(g.telemetry.exposition())  # own telemetry first (both vocabularies)
    finally:
        g.shutdown()
