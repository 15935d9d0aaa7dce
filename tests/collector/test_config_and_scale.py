"""Config loading (defaults, clear errors) and the CLI. The scale-config output is held against the upstream
Collector's structure in test_scale_config_upstream.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_llm_collector.cli import main
from otel_llm_collector.config import CollectorConfig, ConfigError


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
