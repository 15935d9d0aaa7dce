"""Acceptance 2 and 3, on a real vLLM engine (tiny random-weights model) run in a subprocess.

2: vLLM's native ``llm_request`` spans -> gateway: the derived TTFT histogram's count and sum
   equal vLLM's own ``vllm:time_to_first_token_seconds``.
3: our SDK's spans -> a second gateway: the derived metrics equal the SDK's own metrics.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from collector_testkit import loopback_config
from otel_llm.core.metrics import INTER_TOKEN_LATENCY, SERVER_HISTOGRAMS, TOKEN_USAGE
from otel_llm_collector.gateway import Gateway

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")]
SCRIPT = Path(__file__).with_name("vllm_traffic.py")


def histograms(points_by_metric: dict[str, list[dict]]) -> dict[str, tuple[int, float, tuple[int, ...]]]:
    """metric -> (count, sum, bucket counts), summed over label sets."""
    out = {}
    for name, points in points_by_metric.items():
        count = sum(p["count"] for p in points)
        total = sum(p["sum"] for p in points)
        buckets = tuple(map(sum, zip(*(p["bucket_counts"] for p in points))))
        out[name] = (count, total, buckets)
    return out


def sdk_points(dump: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rm in dump["resource_metrics"]:
        for sm in rm["scope_metrics"]:
            for m in sm["metrics"]:
                if "bucket_counts" in (m["data"]["data_points"] or [{}])[0]:
                    out.setdefault(m["name"], []).extend(m["data"]["data_points"])
    return out


def gateway_points(g: Gateway) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    data = g.metric_reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                pts = [json.loads(p.to_json()) for p in m.data.data_points]
                if pts and "bucket_counts" in pts[0]:
                    out.setdefault(m.name, []).extend(pts)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = loopback_config(processors={"tail_sampling": None}, exporters={"prometheus": None},
                          receivers={"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": None}}})
    native, ours = Gateway(cfg, manual_ticks=True).start(), Gateway(cfg, manual_ticks=True).start()
    out = tmp_path_factory.mktemp("vllm") / "result.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), native.grpc_endpoint, ours.grpc_endpoint, str(out)],
                          capture_output=True, text=True, timeout=400)
    if proc.returncode != 0:
        native.shutdown(), ours.shutdown()
        pytest.fail(f"vLLM subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    yield json.loads(out.read_text()), native, ours
    native.shutdown()
    ours.shutdown()


def test_native_vllm_spans_ttft_matches_vllm_own_numbers(run) -> None:
    result, native, _ = run
    derived = histograms(gateway_points(native))["gen_ai.server.time_to_first_token"]
    assert derived[0] == result["requests"] == result["vllm_ttft"]["count"]
    assert derived[1] == pytest.approx(result["vllm_ttft"]["sum"], rel=1e-9, abs=1e-9)
    assert native.telemetry.value("llm_metrics_requests", source="native") == result["requests"]
    # vLLM's span names no provider; its tracer's scope (vllm.tracing.otel in 0.32) does: the series carry it
    providers = {p["attributes"].get("gen_ai.provider.name") for p in gateway_points(native)[
        "gen_ai.server.time_to_first_token"]}
    assert providers == {"vllm"}


def test_sdk_spans_yield_the_sdks_own_metrics(run) -> None:
    result, _, ours = run
    assert "vllm" in result["instrumented"]
    sdk = histograms(sdk_points(result["sdk_metrics"]))
    derived = histograms(gateway_points(ours))
    names = [s.name for s in SERVER_HISTOGRAMS] + [TOKEN_USAGE, INTER_TOKEN_LATENCY.name]
    compared = 0
    for name in names:
        if name not in sdk:
            continue
        compared += 1
        assert derived[name][0] == sdk[name][0], name
        assert derived[name][1] == pytest.approx(sdk[name][1], rel=1e-9, abs=1e-12), name
        assert derived[name][2] == sdk[name][2], name
    assert compared >= 5 and INTER_TOKEN_LATENCY.name in sdk  # every token's gap, from the spans' bucket counts
    assert sdk["gen_ai.server.time_to_first_token"][0] == result["requests"]
