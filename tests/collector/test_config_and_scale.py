"""Config loading (defaults, clear errors), the CLI, and scale-config output checked against the keys the
upstream components document (loadbalancing exporter, tail_sampling processor, signaltometrics connector)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from otel_llm.core.metrics import TTFT_BUCKETS
from otel_llm_collector.cli import main
from otel_llm_collector.config import CollectorConfig, ConfigError

# documented keys (collector-anchors.md sections 1.3, 2.2 and 3)
LB_KEYS = {"routing_key", "protocol", "resolver"}
LB_ROUTING = {"traceID", "service", "resource", "metric", "streamID", "attributes"}
LB_RESOLVERS = {"static", "dns", "k8s", "aws_cloud_map"}
TS_KEYS = {"decision_wait", "decision_wait_after_root_received", "num_traces", "expected_new_traces_per_sec",
           "decision_cache", "policies", "sample_on_first_match"}
TS_POLICY_KEYS = {"always_sample": set(), "latency": {"threshold_ms", "upper_threshold_ms"},
                  "probabilistic": {"sampling_percentage", "hash_salt"}, "status_code": {"status_codes"},
                  "ottl_condition": {"error_mode", "span", "spanevent"}, "rate_limiting": {"spans_per_second"}}
S2M_METRIC_KEYS = {"name", "description", "unit", "conditions", "attributes", "include_resource_attributes",
                   "sum", "gauge", "histogram", "exponential_histogram"}
S2M_ATTR_KEYS = {"key", "default_value", "optional"}


def test_empty_config_is_the_embedded_defaults_on_loopback() -> None:
    c = CollectorConfig.from_yaml("")
    assert c.grpc.host == c.http.host == "127.0.0.1" and (c.grpc.port, c.http.port) == (4317, 4318)
    assert c.tail_sampling.decision_wait == 30 and len(c.tail_sampling.policies) == 5


@pytest.mark.parametrize("text,match", [
    ("nope: 1", "unknown key"),
    ("processors: {tail_sampling: {decision_wait: soon}}", "decision_wait"),
    ("processors: {tail_sampling: {policies: []}}", "non-empty"),
    ("processors: {tail_sampling: {policies: [{name: x, type: latency}]}}", "threshold_ms"),
    ("processors: {llm_metrics: {slo: 'ttft=fast'}}", "slo"),
    ("exporters: {kafka: {endpoint: x}}", "unknown exporter"),
    ("exporters: {file: {}}", "path"),
    ("receivers: {otlp: {protocols: {grpc: {endpoint: nohost}}}}", "host:port"),
    ("[unclosed", "YAML"),
])
def test_bad_config_is_a_clear_error(text, match) -> None:
    with pytest.raises(ConfigError, match=match):
        CollectorConfig.from_yaml(text)


def test_cli_check_and_bad_config(tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("processors: {llm_metrics: {slo: 'ttft=0.5'}}\n")
    bad.write_text("processors: {tail_sampling: {num_traces: 0}}\n")
    assert main(["--config", str(good), "--check"]) == 0
    assert main(["--config", str(bad), "--check"]) == 2
    assert "num_traces" in capsys.readouterr().err


@pytest.fixture
def generated(tmp_path: Path) -> dict[str, dict]:
    assert main(["scale-config", "--out", str(tmp_path), "--gateways", "gw-0:4317,gw-1:4317,gw-2:4317",
                 "--slo", "ttft=0.5,tpot=0.05; big: ttft=2", "--backend", "tempo:4317"]) == 0
    return {p.name: yaml.safe_load(p.read_text()) for p in tmp_path.glob("*.yaml")}


def test_tier1_routes_by_trace_id_to_every_gateway(generated) -> None:
    cfg = generated["tier1-loadbalancer.yaml"]
    lb = cfg["exporters"]["loadbalancing"]
    assert set(lb) <= LB_KEYS and lb["routing_key"] == "traceID" and lb["routing_key"] in LB_ROUTING
    assert set(lb["resolver"]) <= LB_RESOLVERS and lb["resolver"]["static"]["hostnames"] == [
        "gw-0:4317", "gw-1:4317", "gw-2:4317"]
    assert "endpoint" not in lb["protocol"]["otlp"]  # overridden per backend upstream
    assert cfg["service"]["pipelines"]["traces"]["exporters"] == ["loadbalancing"]


def test_tier2_is_a_valid_gateway_config(generated) -> None:
    c = CollectorConfig.from_mapping(generated["tier2-gateway.yaml"])
    assert c.exporters[0].endpoint == "tempo:4317" and c.slo.for_model("big").ttft == 2


def test_upstream_only_uses_documented_keys_and_our_attribute_names(generated) -> None:
    cfg = generated["upstream-only.yaml"]
    ts = cfg["processors"]["tail_sampling"]
    assert set(ts) <= TS_KEYS
    for p in ts["policies"]:
        assert set(p) <= {"name", "type", p["type"]} and set(p.get(p["type"], {})) <= TS_POLICY_KEYS[p["type"]]
    slo = next(p for p in ts["policies"] if p["name"] == "slo_breach")["ottl_condition"]["span"]
    assert 'attributes["llm.latency.time_to_first_token"] > 0.5 and attributes["gen_ai.request.model"] != "big"' in slo
    assert 'attributes["gen_ai.request.model"] == "big" and attributes["llm.latency.time_to_first_token"] > 2' in slo
    metrics = cfg["connectors"]["signaltometrics"]["spans"]
    for m in metrics:
        assert set(m) <= S2M_METRIC_KEYS and all(set(a) <= S2M_ATTR_KEYS for a in m["attributes"])
        assert len({"sum", "gauge", "histogram", "exponential_histogram"} & set(m)) == 1
    ttft = next(m for m in metrics if m["name"] == "gen_ai.server.time_to_first_token")
    assert ttft["histogram"] == {"buckets": list(TTFT_BUCKETS),
                                 "value": 'Double(attributes["llm.latency.time_to_first_token"])'}
    pipes = cfg["service"]["pipelines"]
    assert pipes["traces/metrics"]["exporters"] == ["signaltometrics"]  # metrics see 100% of spans
    assert pipes["metrics"]["receivers"] == ["signaltometrics"]
    assert pipes["traces/sampled"]["processors"] == ["tail_sampling"]
