"""Acceptance 4: a real Prometheus server scrapes the gateway; histogram_quantile(0.99) over the derived
TTFT histogram lands in the bucket that holds the true p99 (bucket resolution)."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from collector_testkit import export_request, loopback_config, prometheus_binary, request_attrs, span
from otel_llm.core.metrics import TTFT_BUCKETS
from otel_llm_collector.gateway import Gateway

PROM = prometheus_binary()
pytestmark = pytest.mark.skipif(PROM is None, reason="Prometheus not installed (Debian package `prometheus`, "
                                                      "/usr/bin/prometheus, or set PROMETHEUS_BIN)")
N = 2000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


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


def start_prometheus(tmp_path: Path, target: str, *flags: str) -> tuple[subprocess.Popen, int]:
    """Debian's Prometheus scraping ``target`` every second (``flags``: e.g. a feature to enable)."""
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: otel-llm-collector
    static_configs: [{{targets: ["{target}"]}}]
""")
    assert PROM is not None
    proc = subprocess.Popen([PROM, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def prometheus(tmp_path: Path, fed_gateway):
    g, _ = fed_gateway
    proc, port = start_prometheus(tmp_path, g.prometheus_endpoint)
    try:
        yield port
    finally:
        stop(proc)


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
