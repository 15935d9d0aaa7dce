"""Acceptance 4: a real Prometheus server scrapes the gateway; histogram_quantile(0.99) over the derived
TTFT histogram lands in the bucket that holds the true p99 (bucket resolution)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from collector_testkit import export_request, loopback_config, request_attrs, span
from otel_llm.core.metrics import TTFT_BUCKETS
from otel_llm_collector.gateway import Gateway
from support.prometheus import PromAPI, Prometheus, prometheus_binary

PROM = prometheus_binary()
pytestmark = pytest.mark.skipif(PROM is None, reason="Prometheus not installed (Debian package `prometheus`, "
                                                      "/usr/bin/prometheus, or set PROMETHEUS_BIN)")
N = 2000


def query(port: int, expr: str) -> list:
    return PromAPI(port).query(expr)


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll an external process until it is ready; the bound is for a hung server, not a timing assertion."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"gave up waiting for {what} ({last})")


@pytest.fixture
def fed_gateway():
    g = Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True).start()
    rng = random.Random(11)
    values = [min(rng.lognormvariate(-2.5, 0.9), 9.9) for _ in range(N)]
    for i, v in enumerate(values):
        g.ingest(export_request(span(i + 1, 1, attrs=request_attrs(model="llama", ttft=v))))
    yield g, values
    g.shutdown()


@pytest.fixture
def prometheus(tmp_path: Path, fed_gateway):
    g, _ = fed_gateway
    with Prometheus(tmp_path, {"otel-llm-collector": g.prometheus_endpoint}) as prom:
        yield prom.port


def test_prometheus_scrapes_and_p99_is_within_bucket_resolution(fed_gateway, prometheus) -> None:
    _, values = fed_gateway
    count = wait_for(lambda: query(prometheus, "sum(gen_ai_server_time_to_first_token_seconds_count)"),
                     "the first scrape")
    assert float(count[0]["value"][1]) == N
    result = query(prometheus,
                   "histogram_quantile(0.99, sum by (le) (gen_ai_server_time_to_first_token_seconds_bucket))")
    estimate = float(result[0]["value"][1])
    true_p99 = sorted(values)[int(0.99 * N) - 1]
    bounds = (0.0,) + TTFT_BUCKETS
    i = next(k for k in range(1, len(bounds)) if true_p99 <= bounds[k])
    assert bounds[i - 1] <= estimate <= bounds[i], (true_p99, estimate, bounds[i - 1], bounds[i])
    # labels: by model and service; and the collector's own telemetry is on the same endpoint
    series = query(prometheus, "gen_ai_server_time_to_first_token_seconds_count")
    assert series[0]["metric"]["gen_ai_request_model"] == "llama" and series[0]["metric"]["service_name"] == "svc"
    accepted = query(prometheus, "otelcol_llm_receiver_accepted_spans_total")
    assert float(accepted[0]["value"][1]) == N
