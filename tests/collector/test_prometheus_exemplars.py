"""On a real Prometheus (exemplar storage on): the TTFT histogram's exemplars resolve only to traces the
gateway kept, and the metrics an SDK sends to the gateway's one endpoint reach Prometheus."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from collector_testkit import FakeClock, export_request, loopback_config, request_attrs, span
from otel_llm_collector.gateway import Gateway
from support.prometheus import Prometheus, prometheus_binary
from test_prometheus import query, wait_for

PROM = prometheus_binary()
pytestmark = pytest.mark.skipif(PROM is None, reason="Prometheus not installed (Debian package `prometheus`, "
                                                      "/usr/bin/prometheus, or set PROMETHEUS_BIN)")
TTFT = "gen_ai_server_time_to_first_token_seconds_bucket"


def query_exemplars(port: int, expr: str) -> list:
    now = time.time()
    url = f"http://127.0.0.1:{port}/api/v1/query_exemplars?" + urllib.parse.urlencode(
        {"query": expr, "start": now - 3600, "end": now + 60})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]


@pytest.fixture
def kept_and_dropped(tmp_path: Path):
    """Traces 1..10 end in an error (kept by the errors policy), 11..40 do not (dropped); all are requests."""
    kept_file = tmp_path / "kept.jsonl"
    clock = FakeClock()
    cfg = loopback_config(
        processors={"tail_sampling": {"policies": [{"name": "errors", "type": "error"}]}},
        exporters={"prometheus": {"endpoint": "127.0.0.1:0", "enable_open_metrics": True},
                   "file": {"path": str(kept_file)}})
    g = Gateway(cfg, clock=clock, manual_ticks=True).start()
    for t in range(1, 41):
        spans = [span(t, 1, attrs=request_attrs(model="llama", ttft=0.05 * (1 + t % 7)))]
        if t <= 10:
            spans.append(span(t, 2, parent=1, error=True))
        g.ingest(export_request(*spans))
    clock.advance(60)
    g.tick()
    assert g.flush(10)
    yield g, {f"{t:032x}" for t in range(1, 11)}, {f"{t:032x}" for t in range(11, 41)}
    g.shutdown()


def test_ttft_exemplars_on_prometheus_resolve_to_kept_traces_only(tmp_path, kept_and_dropped) -> None:
    g, kept, dropped = kept_and_dropped
    # what the gateway exported (the kept traces) is what the exemplars may name
    exported = {sp["traceId"] for line in (tmp_path / "kept.jsonl").read_text().splitlines()
                for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]}
    assert exported == kept
    with Prometheus(tmp_path, {"otel-llm-collector": g.prometheus_endpoint},
                    flags=["--enable-feature=exemplar-storage"]) as prom:
        port = prom.port
        data = wait_for(lambda: query_exemplars(port, TTFT), "exemplars scraped")
        ids = {e["labels"]["trace_id"] for series in data for e in series["exemplars"]}
        assert ids and ids <= kept, ids - kept
        assert not ids & dropped
        # each exemplar sits in the bucket its value falls in
        for series in data:
            le = float(series["seriesLabels"]["le"])
            for e in series["exemplars"]:
                assert float(e["value"]) <= le


def test_sdk_metrics_sent_to_the_gateway_reach_prometheus(tmp_path, monkeypatch) -> None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from test_upstream_vocabulary import _sdk_metrics

    with Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True) as g:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", g.http_endpoint)  # the standard variable, no path
        _sdk_metrics(OTLPMetricExporter())
        with Prometheus(tmp_path, {"otel-llm-collector": g.prometheus_endpoint}) as prom:
            port = prom.port
            got = wait_for(lambda: query(port, "orders_total"), "the SDK's counter scraped")
            assert float(got[0]["value"][1]) == 3
            assert got[0]["metric"]["exported_job"] == "shop" and got[0]["metric"]["region"] == "eu"
            count = wait_for(lambda: query(port, "checkout_duration_seconds_count"), "the SDK's histogram")
            assert float(count[0]["value"][1]) == 1
            accepted = query(port, "otelcol_receiver_accepted_metric_points_total")
            assert float(accepted[0]["value"][1]) == 3
