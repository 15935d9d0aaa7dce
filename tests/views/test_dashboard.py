"""The committed Grafana dashboard and provisioning files are exactly what `otel-llm dashboard` writes."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from otel_llm.views import dashboard
from otel_llm.views.cli import main

COMMITTED = Path(__file__).resolve().parents[2] / "dashboards"


def test_regenerating_reproduces_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    assert main(["dashboard", "--out", str(tmp_path)]) == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated == sorted(p.relative_to(COMMITTED) for p in COMMITTED.rglob("*") if p.is_file())
    for rel in generated:
        assert (tmp_path / rel).read_bytes() == (COMMITTED / rel).read_bytes(), (
            f"dashboards/{rel} is stale: run `otel-llm dashboard` and commit the result")


def test_dashboard_model() -> None:
    d = json.loads((COMMITTED / "otel-llm.json").read_text())
    assert d["uid"] == dashboard.UID
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "service", "model", "goodput_target"]
    assert d["templating"]["list"][0]["current"]["value"] == dashboard.PROMETHEUS_UID
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    titles = {p["title"] for p in panels}
    for wanted in ("Time to first token", "Time per output token", "End-to-end duration", "Goodput",
                   "Output tokens/s", "Output characters/s", "Where the time goes", "SLO breaches by cause",
                   "Tail sampling: traces decided", "Collector: spans in and out", "SDK: engine steps",
                   "Engine-step duration by phase", "Step time against phase (latency curve)", "Inter-token latency",
                   "GPU utilization", "GPU memory used", "GPU power and SM clock", "Draft acceptance rate",
                   "Drafted and accepted tokens/s", "Acceptance by draft position", "Requests by LoRA adapter",
                   "Output tokens/s by LoRA adapter", "Engine steps by LoRA adapter", "Step time by LoRA adapter",
                   "Adapter loads and evictions", "Goodput by tenant", "Engine time by tenant",
                   "Interference caused by tenant", "Goodput error-budget burn rate", "Active alerts"):
        assert wanted in titles
    # breaches are counted as breaches (one per request and objective), not as requests
    (causes,) = [p for p in panels if p["title"] == "SLO breaches by cause"]
    assert causes["fieldConfig"]["defaults"]["unit"] == "suffix: breaches/s"
    # the SDK's own instruments (engine steps, GPU) carry no model or service label: not filtered by them
    # (nor do Prometheus' own ALERTS: the burn-rate rules sum over services)
    sdk_only = ("otelcol", "otel_llm_", "llm_server_engine_", "hw_", "llm_gpu_", "llm_server_lora_",
                "llm_server_spec_decode_position_", "ALERTS{")
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
        for t in p["targets"]:
            if p["title"] not in ("Tail sampler buffer",) and not any(x in t["expr"] for x in sdk_only):
                assert '$model' in t["expr"] and '$service' in t["expr"], t["expr"]
    latency = [t for p in panels if p["title"].startswith(("Time to", "Time per", "End-to-end")) for t in p["targets"]]
    assert len(latency) == 9 and all(t["exemplar"] for t in latency)


def test_provisioning_links_exemplars_to_tempo() -> None:
    ds = yaml.safe_load((COMMITTED / "provisioning/datasources/otel-llm.yaml").read_text())["datasources"]
    prom, tempo = ({d["type"]: d for d in ds}[k] for k in ("prometheus", "tempo"))
    assert prom["uid"] == dashboard.PROMETHEUS_UID and tempo["uid"] == dashboard.TEMPO_UID
    assert prom["jsonData"]["exemplarTraceIdDestinations"] == [{"name": "trace_id", "datasourceUid": tempo["uid"]}]
