"""The generated Prometheus rules: `promtool check rules` accepts them, and `promtool test rules` unit tests
(Debian's promtool) show the burn-rate alerts firing, naming the dominant cause, and keeping tenants apart."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from otel_llm import semconv as sc
from otel_llm.core.slo import SLOTable
from otel_llm.views import alerts
from otel_llm.views.cli import main

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
MODEL, TENANT, OBJECTIVE, CAUSE = alerts.MODEL, alerts.TENANT, alerts.OBJECTIVE, alerts.CAUSE
SLO = "ttft=0.5,tpot=0.05,goodput=0.99; big-model: ttft=2,goodput=0.95; @strict: tpot=0.05,goodput=0.999"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def series(model: str, tenant: str, per_minute_requests: int, per_minute_good: int,
           breaches: dict[str, int]) -> list[dict]:
    """Seven hours of counters at one sample a minute: ``breaches`` is cause -> TPOT breaches a minute."""
    labels = f'{MODEL}="{model}", {TENANT}="{tenant}", service_name="svc", job="otel-llm-collector"'
    out = [{"series": f"{alerts.REQUESTS}{{{labels}}}", "values": f"0+{per_minute_requests}x420"},
           {"series": f"{alerts.GOOD}{{{labels}}}", "values": f"0+{per_minute_good}x420"}]
    for cause, n in breaches.items():
        out.append({"series": f'{alerts.BREACHES}{{{labels}, {OBJECTIVE}="tpot", {CAUSE}="{cause}"}}',
                    "values": f"0+{n}x420"})
    return out


def expected(table: SLOTable, scope_name: str, objective: str, tier_name: str, model: str, tenant: str,
             value: str, cause: str) -> dict:
    """The alert as the generator declares it, its templates expanded as Prometheus expands them."""
    scope = next(s for s in alerts.scopes(table) if s.name == scope_name)
    tier = next(t for t in alerts.TIERS if t.name == tier_name)
    rule = alerts.alert(scope, objective, tier, "otel-llm", "http://grafana:3000", alerts.RUNBOOK)
    a = rule["annotations"]
    condition = "span.llm.slo.met = false" if objective == "goodput" else f'span.llm.slo.breached =~ ".*{objective}.*"'
    what = "Goodput" if objective == "goodput" else f"{objective.upper()} breaches"
    return {"exp_labels": {**rule["labels"], MODEL: model, TENANT: tenant},
            "exp_annotations": {
                "summary": f"{what} of {model} for tenant {tenant} is spending its error budget {tier.burn:g}x too fast",
                "description": a["description"].replace("{{ $value | humanizePercentage }}", value),
                "dominant_cause": cause,
                "dashboard": f"http://grafana:3000/d/otel-llm/?var-model={model}&from=now-{tier.long}&to=now",
                "trace_query": (f'{{ span.gen_ai.request.model = "{model}" && span.llm.request.tenant = "{tenant}" '
                                f"&& {condition} }}"),
                "runbook_url": alerts.RUNBOOK}}


def run_tests(tmp_path: Path, table: SLOTable, inputs: list[dict], alert_tests: list[dict]) -> None:
    rules = alerts.write(table, tmp_path / "rules.yml")
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": alert_tests}]}
    spec = tmp_path / "tests.yml"
    spec.write_text(yaml.safe_dump(tests, sort_keys=False, width=1000))
    done = promtool("test", "rules", str(spec))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_command_writes_rules_promtool_accepts(tmp_path: Path) -> None:
    assert main(["alerts", "--slo", SLO, "--out", str(tmp_path)]) == 0
    written = tmp_path / "otel-llm-slo-otel-llm.rules.yml"
    done = promtool("check", "rules", str(written))
    assert done.returncode == 0, done.stdout + done.stderr
    assert main(["alerts", "--slo", SLO, "--source", "upstream", "--out", str(tmp_path)]) == 0
    upstream = tmp_path / "otel-llm-slo-upstream.rules.yml"
    done = promtool("check", "rules", str(upstream))
    assert done.returncode == 0, done.stdout + done.stderr
    # the upstream pipeline derives no breaches by cause: goodput alerts only, none reading the breaches counter
    assert alerts.BREACHES not in upstream.read_text() and alerts.BREACHES in written.read_text()
    names = {r["alert"] for g in yaml.safe_load(written.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert {"LLMGoodputBurnFast", "LLMGoodputBurnSlow", "LLMTtftBurnFast", "LLMTpotBurnFast"} <= names
    # without a goodput target there is no budget: a clear error, nothing written
    assert main(["alerts", "--slo", "ttft=0.5", "--out", str(tmp_path / "none")]) == 1
    assert not (tmp_path / "none").exists()


def test_a_goodput_burn_fires_fast_and_slow_naming_the_dominant_cause(tmp_path: Path) -> None:
    """Half the requests fail (50 budgets of a 99 % target): both page alerts fire after six hours, and the
    cause most of the breaches had is named; a request mix that fails 0.5 % (half the budget) fires neither."""
    table = SLOTable.parse(SLO)
    burning = series("m", "team-a", 100, 50, {sc.SLOW_PREFILL_INTERFERENCE: 40, sc.SLOW_QUEUE_MAX_SEQS: 10})
    calm = series("m", "team-c", 1000, 995, {sc.SLOW_QUEUE_MAX_SEQS: 5})
    burn = [expected(table, "default", "goodput", tier, "m", "team-a", "50%", sc.SLOW_PREFILL_INTERFERENCE)
            for tier in ("fast", "slow")]
    run_tests(tmp_path, table, burning + calm, [
        {"eval_time": "6h", "alertname": "LLMGoodputBurnFast", "exp_alerts": [burn[0]]},
        {"eval_time": "6h", "alertname": "LLMGoodputBurnSlow", "exp_alerts": [burn[1]]},
        # TPOT alone spends the same budget: it fires too, and names its own dominant cause
        {"eval_time": "6h", "alertname": "LLMTpotBurnFast", "exp_alerts": [
            expected(table, "default", "tpot", "fast", "m", "team-a", "50%", sc.SLOW_PREFILL_INTERFERENCE)]},
        # no TTFT breaches at all: nothing
        {"eval_time": "6h", "alertname": "LLMTtftBurnFast", "exp_alerts": []},
    ])


def test_a_burn_below_the_thresholds_fires_neither(tmp_path: Path) -> None:
    """Errors at 10x the budget: above the ticket burns but below the page ones (14.4 and 6): no page."""
    table = SLOTable.parse(SLO)
    run_tests(tmp_path, table, series("m", "team-a", 100, 95, {sc.SLOW_BATCH_GROWTH: 5}), [
        {"eval_time": "6h", "alertname": "LLMGoodputBurnFast", "exp_alerts": []},
        {"eval_time": "6h", "alertname": "LLMGoodputBurnSlow", "exp_alerts": []},
        {"eval_time": "6h", "alertname": "LLMTpotBurnFast", "exp_alerts": []},
    ])
    # and 5 % errors, one budget and a half of a 95 % model target: the model's own SLO is what judges it
    big = series("big-model", "team-a", 100, 95, {sc.SLOW_BATCH_GROWTH: 5})
    run_tests(tmp_path, table, big, [
        {"eval_time": "6h", "alertname": "LLMGoodputBurnFast", "exp_alerts": []},
        {"eval_time": "6h", "alertname": "LLMGoodputBurnSlow", "exp_alerts": []},
    ])


def test_tenants_are_judged_apart_by_their_own_slo(tmp_path: Path) -> None:
    """Two tenants on one model, each failing 2 % of requests: under the default 99 % target that is a burn
    of 2 (no page) for ``team-a``; ``strict`` has a tenant SLO of 99.9 % (it wins over the model's), a burn of
    20: only its alerts fire, labelled with its tenant and scope, its cause named, not the other tenant's."""
    table = SLOTable.parse(SLO)
    inputs = (series("m", "team-a", 100, 98, {sc.SLOW_QUEUE_KV_CACHE: 2})
              + series("m", "strict", 100, 98, {sc.SLOW_PREEMPTION: 2}))
    run_tests(tmp_path, table, inputs, [
        {"eval_time": "6h", "alertname": "LLMGoodputBurnFast", "exp_alerts": [
            expected(table, "@strict", "goodput", "fast", "m", "strict", "2%", sc.SLOW_PREEMPTION)]},
        {"eval_time": "6h", "alertname": "LLMGoodputBurnSlow", "exp_alerts": [
            expected(table, "@strict", "goodput", "slow", "m", "strict", "2%", sc.SLOW_PREEMPTION)]},
    ])


def test_scopes_leave_out_the_series_a_more_specific_slo_judges() -> None:
    table = SLOTable.parse("goodput=0.99; big: goodput=0.9; @t: goodput=0.999; big@t: goodput=0.5")
    by_name = {s.name: s for s in alerts.scopes(table)}
    assert set(by_name) == {"default", "big", "@t", "big@t"}
    assert by_name["big@t"].more_specific == ()
    assert set(by_name["@t"].more_specific) == {("big", "t")}
    assert set(by_name["big"].more_specific) == {("big", "t"), (None, "t")}
    assert len(by_name["default"].more_specific) == 3
    assert table.for_request("big", "t").goodput == 0.5
    assert table.for_request("big", "u").goodput == 0.9
    assert table.for_request("small", "t").goodput == 0.999
    assert table.for_request("small", None).goodput == 0.99
