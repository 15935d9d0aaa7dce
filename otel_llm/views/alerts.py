"""Prometheus rule files generated from the SLO table: recording rules and multi-window, multi-burn-rate alerts.

``otel-llm alerts --slo "ttft=0.5,tpot=0.05,goodput=0.99; @team-a: tpot=0.03,goodput=0.999"`` writes them. Each
SLO scope of the table (the default, a model, a tenant, a tenant on a model: core/slo.py) that sets a goodput
target gets, for goodput and for each latency objective it sets, the SRE workbook's alerts on the share of
requests that failed (its error ratio) against the budget ``1 - goodput``:

* ``fast``: the ratio over 1 h and over 5 m both above 14.4 budgets (2 % of a 30-day budget in an hour): page;
* ``slow``: 6 h and 30 m above 6 budgets (5 % in 6 hours): page;
* ``ticket``: 1 d and 2 h above 3 budgets; ``drift``: 3 d and 6 h above 1 budget: ticket.

A latency objective's ratio is its breaches (``llm.server.slo.breaches{llm.slo.objective}``) over the requests,
judged against the same budget: a request that misses one objective is not good, so no single objective may
spend more than goodput's budget. The annotations name the dominant cause over the alert's long window (the
largest ``llm.slow.cause`` of the breaches counter, for goodput of every objective's breaches; a request that
missed two objectives counts twice there), and link the
dashboard and a trace query (TraceQL) for the breaching requests. A series (model, tenant) is judged by its
most specific scope only (``unless`` the more specific scopes' series), as the SDK judges its requests.

Metric names come from the core's tables through ``core.prometheus_names`` (as the dashboard's). Two sources:
``otel-llm`` (the SDK's metrics, or our gateway's derived ones: the same names, the gateway adds
``service.name``) and ``upstream`` (the upstream Collector's ``signal_to_metrics`` pipeline of
``otel-llm-collector scale-config``: requests and good requests only, so goodput alerts without a cause).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import semconv as sc
from ..core import metrics as m
from ..core.prometheus_names import prom_label, prom_name
from ..core.slo import GOODPUT, SLO, SLOTable

MODEL, TENANT = prom_label(sc.REQUEST_MODEL), prom_label(sc.REQUEST_TENANT)
OBJECTIVE, CAUSE = prom_label(sc.SLO_OBJECTIVE), prom_label(sc.SLOW_CAUSE)
BY = f"{MODEL}, {TENANT}"
SOURCES = ("otel-llm", "upstream")
DASHBOARD_UID = "otel-llm"  # views/dashboard.py's UID (not imported: the dashboard needs Grafana's SDK)
RUNBOOK = "https://github.com/otel-llm/otel-llm/blob/main/docs/runbook.md"


@dataclass(frozen=True)
class Tier:
    """One multi-window alert: the error ratio over ``long`` and over ``short`` both above ``burn`` budgets."""

    name: str
    long: str
    short: str
    burn: float
    severity: str


# The SRE workbook's table (chapter 5, "Alerting on SLOs", a 30-day budget)
TIERS = (Tier("fast", "1h", "5m", 14.4, "page"), Tier("slow", "6h", "30m", 6.0, "page"),
         Tier("ticket", "1d", "2h", 3.0, "ticket"), Tier("drift", "3d", "6h", 1.0, "ticket"))
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


def counter(spec: m.InstrumentSpec) -> str:
    return prom_name(spec.name, spec.unit) + "_total"


REQUESTS = counter(m.SERVER_METRICS.requests_spec)
GOOD = counter(m.SERVER_METRICS.good_requests_spec)
BREACHES = counter(m.SERVER_METRICS.slo_breaches_spec)  # type: ignore[arg-type]


def requests_rate(w: str) -> str:
    return f"llm:requests:rate{w}"


def good_rate(w: str) -> str:
    return f"llm:requests_good:rate{w}"


def breaches_rate(w: str) -> str:
    return f"llm:slo_breaches:rate{w}"


def error_ratio(objective: str, w: str) -> str:
    """The recording rule of an objective's error ratio over ``w`` (goodput: the share of requests not good)."""
    return f"llm:{objective}_errors:ratio_rate{w}"


def recording_rules(source: str) -> list[dict]:
    rules: list[dict] = []
    for w in WINDOWS:
        rules.append({"record": requests_rate(w), "expr": f"sum by ({BY}) (rate({REQUESTS}[{w}]))"})
        rules.append({"record": good_rate(w), "expr": f"sum by ({BY}) (rate({GOOD}[{w}]))"})
        # "or 0 * requests": no good request at all is a ratio of 1, not no data
        rules.append({"record": error_ratio(GOODPUT, w),
                      "expr": f"1 - (({good_rate(w)} or 0 * {requests_rate(w)}) / {requests_rate(w)})"})
        if source == "upstream":
            continue
        rules.append({"record": breaches_rate(w),
                      "expr": f"sum by ({BY}, {OBJECTIVE}, {CAUSE}) (rate({BREACHES}[{w}]))"})
        for objective in ("ttft", "tpot", "e2e"):
            rules.append({"record": error_ratio(objective, w),
                          "expr": f'sum by ({BY}) ({breaches_rate(w)}{{{OBJECTIVE}="{objective}"}}) '
                                  f"/ {requests_rate(w)}"})
    return rules


# -- scopes: which series each SLO of the table judges ----------------------------------------------------

def _rank(model: str | None, tenant: str | None) -> int:
    """How specific a scope is (core/slo.SLOTable.for_request's order)."""
    return (2 if tenant is not None else 0) + (1 if model is not None else 0)


def _matchers(model: str | None, tenant: str | None) -> str:
    out = []
    if model is not None:
        out.append(f"{MODEL}={_quote(model)}")
    if tenant is not None:
        out.append(f"{TENANT}={_quote(tenant)}")
    return ", ".join(out)


def _selector(metric: str, model: str | None, tenant: str | None) -> str:
    matchers = _matchers(model, tenant)
    return f"{metric}{{{matchers}}}" if matchers else metric


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Scope:
    model: str | None
    tenant: str | None
    slo: SLO
    more_specific: tuple[tuple[str | None, str | None], ...]  # scopes whose series this one leaves out

    def select(self, metric: str) -> str:
        """``metric``'s series this scope judges: its own matchers, less every more specific scope's series."""
        expr = _selector(metric, self.model, self.tenant)
        for model, tenant in self.more_specific:
            expr += f" unless on ({BY}) {_selector(metric, model, tenant)}"
        return expr

    @property
    def name(self) -> str:
        if self.model is None and self.tenant is None:
            return "default"
        return (self.model or "") + (f"@{self.tenant}" if self.tenant is not None else "")


def scopes(table: SLOTable) -> list[Scope]:
    declared = table.scopes()
    out = []
    for model, tenant, slo in declared:
        rank = _rank(model, tenant)
        overlapping = tuple((m2, t2) for m2, t2, _ in declared if _rank(m2, t2) > rank
                            and (model is None or m2 in (None, model)) and (tenant is None or t2 in (None, tenant))
                            and (m2, t2) != (model, tenant))
        out.append(Scope(model, tenant, slo, overlapping))
    return out


# -- alerts ------------------------------------------------------------------------------------------------

_TITLE = {GOODPUT: "Goodput", "ttft": "TTFT", "tpot": "TPOT", "e2e": "E2e"}


def alert_name(objective: str, tier: Tier) -> str:
    return f"LLM{_TITLE[objective].capitalize()}Burn{tier.name.capitalize()}"


def _cause_annotation(objective: str, window: str, source: str) -> str:
    if source == "upstream":
        return "not recorded (the upstream-only pipeline derives no breaches by cause)"
    only = "" if objective == GOODPUT else f", {OBJECTIVE}=\\\"{objective}\\\""
    query = (f'topk(1, sum by ({CAUSE}) (increase({BREACHES}{{{MODEL}=%q, {TENANT}=%q{only}}}[{window}])))')
    return ('{{ with printf "' + query + f'" $labels.{MODEL} $labels.{TENANT} | query }}}}'
            '{{ with first . }}{{ label "' + CAUSE + '" . }}{{ end }}{{ else }}none recorded{{ end }}')


def _trace_query(objective: str) -> str:
    """TraceQL for the requests the alert is about: the model's and tenant's that breached."""
    condition = ("span.llm.slo.met = false" if objective == GOODPUT
                 else f'span.llm.slo.breached =~ ".*{objective}.*"')
    return ('{ span.gen_ai.request.model = "{{ $labels.' + MODEL + ' }}"{{ if $labels.' + TENANT
            + ' }} && span.llm.request.tenant = "{{ $labels.' + TENANT + ' }}"{{ end }} && ' + condition + ' }')


def alert(scope: Scope, objective: str, tier: Tier, source: str, grafana: str, runbook: str) -> dict:
    target = scope.slo.goodput
    assert target is not None
    threshold = tier.burn * (1.0 - target)
    long_, short = (scope.select(error_ratio(objective, w)) for w in (tier.long, tier.short))
    expr = f"({long_}) > {threshold:.6g} and on ({BY}) ({short}) > {threshold:.6g}"
    what = "Goodput" if objective == GOODPUT else f"{objective.upper()} breaches"
    dashboard = (f"{grafana.rstrip('/')}/d/{DASHBOARD_UID}/?var-model={{{{ $labels.{MODEL} }}}}"
                 f"&from=now-{tier.long}&to=now")
    return {
        "alert": alert_name(objective, tier),
        "expr": expr,
        "for": "0m" if tier.severity == "page" else "15m",
        "labels": {"severity": tier.severity, "slo_scope": scope.name, OBJECTIVE: objective,
                   "burn_window": tier.name},
        "annotations": {
            "summary": (f"{what} of {{{{ $labels.{MODEL} }}}}{{{{ if $labels.{TENANT} }}}} for tenant "
                        f"{{{{ $labels.{TENANT} }}}}{{{{ end }}}} is spending its error budget {tier.burn:g}x "
                        f"too fast"),
            "description": (f"{{{{ $value | humanizePercentage }}}} of requests failed {objective} over {tier.long} "
                            f"(and over {tier.short}); the SLO ({scope.name}) allows {1 - target:.4g} "
                            f"(goodput {target:g})."),
            "dominant_cause": _cause_annotation(objective, tier.long, source),
            "dashboard": dashboard,
            "trace_query": _trace_query(objective),
            "runbook_url": runbook,
        },
    }


def rule_groups(table: SLOTable, source: str = "otel-llm", grafana: str = "http://grafana:3000",
                runbook: str = RUNBOOK) -> dict:
    """The rule file's content: a recording group and an alerting group."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    alerts = []
    for scope in scopes(table):
        if scope.slo.goodput is None:
            continue
        objectives = (GOODPUT,) + (scope.slo.objectives if source != "upstream" else ())
        for objective in objectives:
            for tier in TIERS:
                alerts.append(alert(scope, objective, tier, source, grafana, runbook))
    if not alerts:
        raise ValueError("no SLO sets a goodput target (e.g. goodput=0.99): there is no error budget to alert on")
    return {"groups": [{"name": "otel-llm-slo-recording", "interval": "30s", "rules": recording_rules(source)},
                       {"name": "otel-llm-slo-alerts", "interval": "30s", "rules": alerts}]}


HEADER = "# Generated by `otel-llm alerts`; edit the SLO table (or otel_llm/views/alerts.py) instead.\n"


def render(table: SLOTable, source: str = "otel-llm", grafana: str = "http://grafana:3000",
           runbook: str = RUNBOOK) -> str:
    import yaml  # the views extra's (a plain install has no YAML writer; the CLI says what to install)

    return HEADER + yaml.safe_dump(rule_groups(table, source, grafana, runbook), sort_keys=False,
                                   default_flow_style=False, width=1000)


def write(table: SLOTable, out: str | os.PathLike[str], source: str = "otel-llm",
          grafana: str = "http://grafana:3000", runbook: str = RUNBOOK) -> Path:
    text = render(table, source, grafana, runbook)  # first: a table without a budget writes nothing
    path = Path(out)
    if path.suffix not in (".yml", ".yaml"):
        path = path / f"otel-llm-slo-{source}.rules.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path

