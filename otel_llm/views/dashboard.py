"""The Grafana dashboard, as code (Grafana's foundation SDK for Python), and its provisioning files.

Regenerate the committed files with ``otel-llm dashboard`` (writes ``dashboards/``); a test checks that
the command reproduces them byte for byte. Metric names are not typed here: they come from the core's
metric tables (``core.metrics``, ``core.self_metrics``, whose ``GATEWAY_METRICS`` is the collector's
self-telemetry table), translated by ``core.prometheus_names`` (dots to underscores, unit suffixes,
``_total`` on counters): the collector's Prometheus endpoint uses the same translation, which is also
what an upstream Collector's Prometheus exporter writes. The views do not import the collector.

Every panel's query is run against a real Prometheus scraping the real collector after a real engine
load (tests/views/test_dashboard_prometheus.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import stat, timeseries
from grafana_foundation_sdk.builders.common import (ReduceDataOptions, StackingConfig, VizLegendOptions,
                                                   VizTooltipOptions)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (LegendDisplayMode, LegendPlacement, SortOrder, StackingMode,
                                                 TooltipDisplayMode)
from grafana_foundation_sdk.models.dashboard import (DashboardCursorSync, DataSourceRef, VariableOption,
                                                     VariableRefresh, VariableSort)

from ..core import metrics as m
from ..core import self_metrics as sm
from .. import semconv as sc
from ..core.diagnosis.causes import CAUSES
from ..core.prometheus_names import prom_label, prom_name

UID = "otel-llm"
PROMETHEUS_UID, TEMPO_UID = "otel-llm-prometheus", "otel-llm-tempo"
# panels use the datasource variable (its default: the provisioned datasource), so an import into a
# Grafana whose Prometheus has another uid only needs the variable set
PROM = DataSourceRef(type_val="prometheus", uid="${datasource}")
SLO_BREACHES, SLOW_CAUSE = m.SERVER_METRICS.slo_breaches_spec, sc.SLOW_CAUSE  # the slow-cause verdict's counter, label
TOKENS, CHARACTERS = m.SERVER_METRICS.token_usage_spec, m.SERVER_METRICS.characters_spec


def label(attribute: str) -> str:
    return prom_label(attribute)


MODEL, SERVICE, TOKEN_TYPE = label(sc.REQUEST_MODEL), label(sc.SERVICE_NAME), label(sc.TOKEN_TYPE)
SEL = f'{MODEL}=~"$model", {SERVICE}=~"$service"'
RATE = "$__rate_interval"
_HIST = {spec.name: spec for spec in (*m.SERVER_HISTOGRAMS, m.INTER_TOKEN_LATENCY)}
TTFT, TPOT, E2E = (m.SERVER_HISTOGRAM[f].name for f in ("ttft", "tpot", "e2e"))
PHASES = tuple(m.SERVER_HISTOGRAM[f].name for f in ("queue", "prefill", "decode"))


def histogram(name: str) -> str:
    return prom_name(name, _HIST[name].unit)


def counter(spec: m.InstrumentSpec) -> str:
    return prom_name(spec.name, spec.unit) + "_total"


def collector(name: str) -> str:
    return sm.gateway_metric(name)  # a KeyError here: the collector's table lost the metric


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    exemplar: bool = False


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    kind: str = "timeseries"  # or "stat"
    stacked: bool = False
    # a health counter that is 0 in a healthy system has no series until the first event: the query
    # ends in "or vector(0)", and the query test checks the metric names instead of the values
    zero_normal: bool = False


def _quantiles(name: str) -> tuple[Query, ...]:
    metric = histogram(name)
    return tuple(Query(f"histogram_quantile({q}, sum by (le, {MODEL}) (rate({metric}_bucket{{{SEL}}}[{RATE}])))",
                       f"p{int(q * 100)} {{{{{MODEL}}}}}", exemplar=True) for q in (0.5, 0.95, 0.99))


def _rate_sum(metric: str, by: str = MODEL, extra: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{{{SEL}{extra}}}[{RATE}]))"


def _goodput() -> str:
    good, total = counter(m.SERVER_METRICS.good_requests_spec), counter(m.SERVER_METRICS.requests_spec)
    # "or 0 * total": goodput is 0 (not "no data") while no request has met every SLO yet
    return f"({_rate_sum(good)} or 0 * {_rate_sum(total)}) / {_rate_sum(total)}"


def _share(phase: str) -> Query:
    phases = [histogram(n) for n in PHASES]
    total = " + ".join(_rate_sum(p + "_sum") for p in phases)
    return Query(f"{_rate_sum(histogram(phase) + '_sum')} / ({total})", phase.split(".")[2] + " {{" + MODEL + "}}")


STEP_PHASE, STEP_PART, HW_ID = label(sc.STEP_PHASE), label(sc.STEP_PART), label(sc.HW_ID)


def instrument(spec: m.InstrumentSpec) -> str:
    """An SDK instrument's Prometheus name (histograms without their _bucket/_sum/_count)."""
    return prom_name(spec.name, spec.unit) + ("_total" if spec.kind == "counter" else "")


def _step_quantiles() -> tuple[Query, ...]:
    """Engine-step time by phase (the whole step: part=total): the SDK's step instruments, no model label."""
    metric = instrument(m.STEP_DURATION)
    return tuple(Query(f'histogram_quantile({q}, sum by (le, {STEP_PHASE}) (rate({metric}_bucket{{{STEP_PART}="total"}}'
                       f'[{RATE}])))', f"p{int(q * 100)} {{{{{STEP_PHASE}}}}}") for q in (0.5, 0.95))


def _step_mean_by_phase() -> Query:
    """Mean step time per phase: with steps/s beside it, the latency curve a metric can show (a phase's
    step time rises with its work; decode steps stay flat until the batch reaches the memory-bound knee)."""
    metric = instrument(m.STEP_DURATION)
    sel = f'{{{STEP_PART}="total"}}'
    return Query(f"sum by ({STEP_PHASE}) (rate({metric}_sum{sel}[{RATE}])) / "
                 f"sum by ({STEP_PHASE}) (rate({metric}_count{sel}[{RATE}]))", "mean {{" + STEP_PHASE + "}}")


def _gpu(spec: m.InstrumentSpec, legend: str) -> Query:
    return Query(f"max by ({HW_ID}) ({instrument(spec)})", f"{legend} {{{{{HW_ID}}}}}")


def _health(metric: str, by: str, legend: str) -> Query:
    grouping = f" by ({by})" if by else ""
    return Query(f"sum{grouping} (rate({metric}[{RATE}])) or vector(0)", legend)


ADAPTER = label(sc.LORA_NAME)
BASE_MODEL = "(base model)"  # the legend of steps without an adapter label


def _speculative_decoding() -> tuple[str, tuple[PanelSpec, ...]]:
    """Speculative decoding (docs/production-features.md). Engines without it have none of these series: the
    queries end in "or vector(0)" (0 there: the feature is off)."""
    spec_tokens = counter(m.SERVER_METRICS.spec_tokens_spec)
    kind = label(sc.SPEC_TOKEN_KIND)
    accepted = _rate_sum(spec_tokens, extra=f', {kind}="accepted"')
    drafted = _rate_sum(spec_tokens, extra=f', {kind}="drafted"')
    positions, position = instrument(m.SPEC_POSITION_TOKENS), label(sc.SPEC_POSITION)
    by_position = (f'sum by ({position}) (rate({positions}{{{kind}="accepted"}}[{RATE}])) / '
                   f'sum by ({position}) (rate({positions}{{{kind}="drafted"}}[{RATE}]))')
    return ("Speculative decoding", (
        PanelSpec("Draft acceptance rate", "Accepted over drafted speculative tokens per model (vLLM's "
                  "draft_acceptance_rate; 0: no speculative decoding)",
                  (Query(f"({accepted}) / ({drafted}) or vector(0)", "{{" + MODEL + "}}"),), "percentunit",
                  zero_normal=True),
        PanelSpec("Drafted and accepted tokens/s", "Speculative draft tokens per second by kind",
                  (Query(f"sum by ({MODEL}, {kind}) (rate({spec_tokens}{{{SEL}}}[{RATE}])) or vector(0)",
                         "{{" + kind + "}} {{" + MODEL + "}}"),), "short", zero_normal=True),
        PanelSpec("Acceptance by draft position", "Accepted over drafted tokens at each draft position (0 is the "
                  "first drafted token), over every engine step: where the drafter's guesses stop holding (the "
                  "SDK's step instruments)",
                  (Query(f"{by_position} or vector(0)", "position {{" + position + "}}"),), "percentunit",
                  zero_normal=True),
    ))


def _lora_adapters() -> tuple[str, tuple[PanelSpec, ...]]:
    """LoRA adapters: requests and tokens per adapter (the request metrics' llm.lora.name) and the engine
    steps by adapter (the SDK's step instruments: one label per step, ``multiple`` for a step of several
    adapters; llm.server.lora.steps counts each adapter of a step). "or vector(0)": 0 without adapters."""
    requests, tokens = counter(m.SERVER_METRICS.requests_spec), prom_name(TOKENS.name, TOKENS.unit)
    adapter_set = f'{ADAPTER}!=""'
    step_time, sel = instrument(m.STEP_DURATION), f'{{{STEP_PART}="total"}}'
    mean_step = (f"sum by ({ADAPTER}) (rate({step_time}_sum{sel}[{RATE}])) / "
                 f"sum by ({ADAPTER}) (rate({step_time}_count{sel}[{RATE}]))")
    loads, evictions = instrument(m.LORA_LOAD_DURATION), instrument(m.LORA_EVICTIONS)
    return ("LoRA adapters", (
        PanelSpec("Requests by LoRA adapter", "Finished requests per second per adapter (llm.lora.name; other: "
                  "adapters beyond the label cap)",
                  (Query(f"sum by ({ADAPTER}) (rate({requests}{{{SEL}, {adapter_set}}}[{RATE}])) or vector(0)",
                         "{{" + ADAPTER + "}}"),), "reqps", stacked=True, zero_normal=True),
        PanelSpec("Output tokens/s by LoRA adapter", "Output tokens per second of each adapter's requests",
                  (Query(f"sum by ({ADAPTER}) (rate({tokens}_sum{{{SEL}, {adapter_set}, {TOKEN_TYPE}=\"output\"}}"
                         f"[{RATE}])) or vector(0)", "{{" + ADAPTER + "}}"),), "short", stacked=True,
                  zero_normal=True),
        PanelSpec("Engine steps by LoRA adapter", "Steps per second each adapter was active in (a step of two "
                  "adapters counts for each: llm.server.lora.steps)",
                  (Query(f"sum by ({ADAPTER}) (rate({instrument(m.LORA_STEPS)}[{RATE}])) or vector(0)",
                         "{{" + ADAPTER + "}}"),), "short", zero_normal=True),
        PanelSpec("Step time by LoRA adapter", f"Mean engine-step time of the steps that ran one adapter, of those "
                  f"that ran several ({sc.LORA_MULTIPLE}) and of the base model's: what serving adapters costs a step",
                  (Query(f'label_replace({mean_step}, "{ADAPTER}", "{BASE_MODEL}", "{ADAPTER}", "") or vector(0)',
                         "{{" + ADAPTER + "}}"),), "s", zero_normal=True),
        PanelSpec("Adapter loads and evictions", "The model runner's adapter cache per adapter: loads/s (a load "
                  "inside a step delays it) and evictions/s (a cache too small for the adapters in use thrashes)",
                  (Query(f"sum by ({ADAPTER}) (rate({loads}_count[{RATE}])) or vector(0)", "loads {{" + ADAPTER + "}}"),
                   Query(f"sum by ({ADAPTER}) (rate({evictions}[{RATE}])) or vector(0)",
                         "evictions {{" + ADAPTER + "}}")), "short", zero_normal=True),
    ))


TENANT = label(sc.REQUEST_TENANT)
GOODPUT_TARGET = "$goodput_target"  # the dashboard's variable: the SLO table's goodput target, for the burn rate


def _slo_operations() -> tuple[str, tuple[PanelSpec, ...]]:
    """Tenants, engine time and the error budget (docs/runbook.md): per-tenant goodput, engine-seconds and the
    interference caused by tenant (the request histograms' sums: core/diagnosis/engine_time.py), the goodput
    burn rate over the fast alert's two windows, and the burn-rate alerts firing (Prometheus' ``ALERTS``, where
    the rules of ``otel-llm alerts`` are loaded; 0 otherwise). Requests without a tenant are the empty tenant."""
    good, total = counter(m.SERVER_METRICS.good_requests_spec), counter(m.SERVER_METRICS.requests_spec)
    by = f"{MODEL}, {TENANT}"
    goodput = (f"({_rate_sum(good, by=TENANT)} or 0 * {_rate_sum(total, by=TENANT)}) / "
               f"{_rate_sum(total, by=TENANT)}")
    engine, caused = (histogram(m.SERVER_HISTOGRAM[f].name) + "_sum" for f in ("engine_time", "interference_caused"))

    def burn(window: str) -> Query:
        good_w = f"sum by ({by}) (rate({good}{{{SEL}}}[{window}]))"
        total_w = f"sum by ({by}) (rate({total}{{{SEL}}}[{window}]))"
        return Query(f"(1 - (({good_w} or 0 * {total_w}) / {total_w})) / (1 - {GOODPUT_TARGET})",
                     f"{window} {{{{{MODEL}}}}} {{{{{TENANT}}}}}")

    return ("SLO operations: tenants, engine time, error budget", (
        PanelSpec("Goodput by tenant", f"Share of each tenant's requests that met every SLO of its own "
                  f"({sc.REQUEST_TENANT}; a tenant's SLO wins over its model's; other: tenants beyond the label cap)",
                  (Query(goodput, "{{" + TENANT + "}}"),), "percentunit"),
        PanelSpec("Engine time by tenant", "Engine-seconds per second charged to each tenant's requests (each step's "
                  "time split by the requests' share of its work): its share of the engines. Times a device-hour "
                  "price / 3600: its cost",
                  (Query(_rate_sum(engine, by=TENANT), "{{" + TENANT + "}}"),), "s", stacked=True),
        PanelSpec("Interference caused by tenant", "Seconds per second of prefill interference each tenant's "
                  "prompts cost other requests (the decode steps they slowed)",
                  (Query(_rate_sum(caused, by=TENANT), "{{" + TENANT + "}}"),), "s", stacked=True),
        PanelSpec("Goodput error-budget burn rate", "Share of requests not good over the window, in error budgets "
                  "(1 - $goodput_target): the fast alert pages when both 1h and 5m exceed 14.4, the slow one "
                  "when 6h and 30m exceed 6", (burn("1h"), burn("5m")), "short"),
        PanelSpec("Active alerts", "The otel-llm burn-rate alerts firing now (loaded from `otel-llm alerts`), by "
                  "alert, model and tenant; 0: none",
                  (Query(f'sum by (alertname, {MODEL}, {TENANT}) (ALERTS{{alertstate="firing", '
                         f'alertname=~"LLM.*Burn.*", {MODEL}=~"$model"}}) or vector(0)',
                         "{{alertname}} {{" + MODEL + "}} {{" + TENANT + "}}"),), "short", zero_normal=True),
    ))


FEATURE_ROWS = (_speculative_decoding(), _lora_adapters())

PANELS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Latency (every request, from the histograms)", (
        PanelSpec("Time to first token", "p50 / p95 / p99 per model; exemplars link a point to its trace in Tempo",
                  _quantiles(TTFT), "s"),
        PanelSpec("Time per output token", "p50 / p95 / p99 per model (mean decode gap of a request)",
                  _quantiles(TPOT), "s"),
        PanelSpec("End-to-end duration", "p50 / p95 / p99 per model",
                  _quantiles(E2E), "s"),
    )),
    ("Goodput and throughput", (
        PanelSpec("Goodput", "Share of requests that met every SLO of their model at once (SLOs: OTEL_LLM_SLO / "
                  "the collector's llm_metrics slo)", (Query(_goodput(), "{{" + MODEL + "}}"),), "percentunit"),
        PanelSpec("Output tokens/s", "Output tokens per second, all requests of a model together",
                  (Query(_rate_sum(prom_name(TOKENS.name, TOKENS.unit) + "_sum", extra=f', {TOKEN_TYPE}="output"'),
                         "{{" + MODEL + "}}"),), "short"),
        PanelSpec("Output characters/s", "Tokenizer-independent: compare models by this, not by tokens/s",
                  (Query(_rate_sum(counter(CHARACTERS)), "{{" + MODEL + "}}"),), "short"),
        PanelSpec("Where the time goes", "Share of request time in queue, prefill and decode (sums of the phase "
                  "histograms)", tuple(_share(p) for p in PHASES),
                  "percentunit", stacked=True),
    )),
    ("Why slow, and what was kept", (
        PanelSpec("SLO breaches by cause", "SLO breaches per second by the verdict's cause (llm.slow.cause): "
                  "one per request and objective missed, so a request that missed TTFT and TPOT counts twice. "
                  + " ".join(f"{c.name}: {c.summary}." for c in CAUSES),
                  (Query(_rate_sum(counter(SLO_BREACHES), by=label(SLOW_CAUSE)),
                         "{{" + label(SLOW_CAUSE) + "}}"),), "suffix: breaches/s", stacked=True),
        PanelSpec("Tail sampling: traces decided", "The collector's decisions by deciding policy and verdict",
                  (Query(f"sum by (policy, decision) (rate({collector('count_traces_sampled')}[{RATE}]))",
                         "{{policy}} {{decision}}"),), "short", stacked=True),
        PanelSpec("SDK: what happened to each request's telemetry", "otel_llm.requests by state (kept = got spans)",
                  (Query(f"sum by ({label(sm.STATE)}) (rate({counter(sm.REQUESTS)}[{RATE}]))",
                         "{{" + label(sm.STATE) + "}}"),), "reqps"),
        PanelSpec("Tail sampler buffer", "Traces waiting for a decision",
                  (Query(f"sum({collector('sampling_traces_on_memory')})", "traces"),), "short", kind="stat"),
    )),
    ("Engine steps and tokens", (
        PanelSpec("Engine-step duration by phase", "p50 / p95 of a whole engine step (schedule to outputs) by "
                  "phase: prefill, decode, mixed (the SDK's step instruments)", _step_quantiles(), "s"),
        PanelSpec("Step time against phase (latency curve)", "Mean engine-step time per phase: prefill steps "
                  "grow with their tokens (compute-bound), decode steps stay flat until the batch is large "
                  "(memory-bound); the report's latency-curve view plots each step against its work",
                  (_step_mean_by_phase(),), "s"),
        PanelSpec("Inter-token latency", "p50 / p95 / p99 of the time between consecutive output tokens, every "
                  "token of every request", _quantiles(m.INTER_TOKEN_LATENCY.name), "s"),
    )),
    ("GPU (NVML, hw.gpu.* conventions)", (
        PanelSpec("GPU utilization", "hw.gpu.utilization and hw.gpu.memory.utilization per device (sampled "
                  "by the SDK where the engine runs on an NVIDIA GPU)",
                  (_gpu(m.GPU_UTILIZATION, "compute"), _gpu(m.GPU_MEMORY_UTILIZATION, "memory")), "percentunit"),
        PanelSpec("GPU memory used", "hw.gpu.memory.usage against hw.gpu.memory.limit per device",
                  (_gpu(m.GPU_MEMORY_USAGE, "used"), _gpu(m.GPU_MEMORY_LIMIT, "limit")), "bytes"),
        PanelSpec("GPU power and SM clock", "hw.power (W) and the SM clock (MHz) per device",
                  (_gpu(m.GPU_POWER, "power W"), _gpu(m.GPU_SM_CLOCK, "SM clock MHz")), "short"),
    )),
    _slo_operations(),
    # speculative decoding and LoRA adapters: a row each (_speculative_decoding, _lora_adapters)
    *FEATURE_ROWS,
    ("Health: collector and SDK", (
        PanelSpec("Collector: spans in and out", "Accepted by the receivers, delivered by the exporters",
                  (Query(f"sum by (transport) (rate({collector('receiver_accepted_spans')}[{RATE}]))",
                         "accepted {{transport}}"),
                   Query(f"sum by (exporter) (rate({collector('exporter_sent_spans')}[{RATE}]))", "sent {{exporter}}")),
                  "short"),
        PanelSpec("Collector: lost or refused", "Refused spans, bad requests, exporter drops and failures, late spans "
                  "(0 when healthy)",
                  (_health(collector("receiver_refused_spans"), "reason", "refused {{reason}}"),
                   _health(collector("receiver_bad_requests"), "reason", "bad request {{reason}}"),
                   _health(collector("exporter_dropped_spans"), "reason", "dropped {{reason}}"),
                   _health(collector("exporter_send_failures"), "exporter", "send failures {{exporter}}"),
                   _health(collector("sampling_late_spans"), "decision", "late {{decision}}")),
                  "short", zero_normal=True),
        PanelSpec("SDK: spans sent directly, dropped, errors", "otel_llm.spans.* and otel_llm.errors (0 when healthy)",
                  (Query(f"sum(rate({counter(sm.SPANS_SENT)}[{RATE}]))", "sent"),
                   _health(counter(sm.SPANS_DROPPED), "", "dropped"),
                   _health(counter(sm.ERRORS), label(sm.SITE), "errors {{" + label(sm.SITE) + "}}")),
                  "short", zero_normal=True),
        PanelSpec("SDK: engine steps", "otel_llm.engine_steps by state (recorded, emitted as spans, settled early)",
                  (Query(f"sum by ({label(sm.STATE)}) (rate({counter(sm.ENGINE_STEPS)}[{RATE}]))",
                         "{{" + label(sm.STATE) + "}}"),), "short"),
    )),
)


def _panel(spec: PanelSpec, width: int, panel_id: int):
    if spec.kind == "stat":
        p = stat.Panel().reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
    else:
        p = (timeseries.Panel().fill_opacity(10 if not spec.stacked else 60)
             .legend(VizLegendOptions().display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM)
                     .show_legend(True))
             .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)))
        if spec.stacked:
            p = p.stacking(StackingConfig().mode(StackingMode.NORMAL))
    p = p.id(panel_id).title(spec.title).description(spec.description).unit(spec.unit).datasource(PROM).height(8).span(width)
    for ref, q in enumerate(spec.queries):
        p = p.with_target(gp.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + ref))
                          .exemplar(q.exemplar).range())
    return p


def _variable(name: str, label_name: str, match: str):
    return (gd.QueryVariable(name).label(name).datasource(PROM)
            .query({"query": f"label_values({match}, {label_name})", "refId": f"{name}-var"})
            .multi(True).include_all(True).all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC).current(VariableOption(selected=True, text="All", value="$__all")))


def build() -> dict:
    """The dashboard as Grafana's JSON model (a dict)."""
    requests = histogram(E2E) + "_count"
    d = (gd.Dashboard("otel-llm: LLM serving").uid(UID).tags(["otel-llm", "llm", "vllm"]).refresh("30s")
         .time("now-1h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
         .description("TTFT / TPOT / latency, goodput, throughput, phase shares, slow causes, tail sampling and "
                      "health, from otel-llm's metrics (SDK or otel-llm-collector). Generated by `otel-llm dashboard`.")
         .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
                        .current(VariableOption(selected=True, text="Prometheus (otel-llm)", value=PROMETHEUS_UID)))
         .with_variable(_variable("service", SERVICE, requests))
         .with_variable(_variable("model", MODEL, f'{requests}{{{SERVICE}=~"$service"}}'))
         .with_variable(gd.TextBoxVariable(GOODPUT_TARGET[1:]).label("goodput target")
                        .description("The SLO table's goodput target (OTEL_LLM_SLO goodput=...), for the burn rate")
                        .default_value("0.99")
                        .current(VariableOption(selected=True, text="0.99", value="0.99"))))
    panel_id = 0
    for title, panels in PANELS:
        panel_id += 1
        d = d.with_row(gd.Row(title).id(panel_id))
        width = 24 // len(panels) if len(panels) <= 4 else 6
        for spec in panels:
            panel_id += 1
            d = d.with_panel(_panel(spec, width, panel_id))
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def queries() -> list[tuple[str, PanelSpec, Query]]:
    """(panel title, spec, query) for every target, in dashboard order."""
    return [(spec.title, spec, q) for _, panels in PANELS for spec in panels for q in spec.queries]


def provisioning() -> dict[str, dict]:
    """Grafana provisioning: the two datasources (exemplars' trace_id -> Tempo; Tempo's traces -> the
    Prometheus metrics) and a dashboard provider reading this directory."""
    datasources = {"apiVersion": 1, "datasources": [
        {"name": "Prometheus (otel-llm)", "type": "prometheus", "uid": PROMETHEUS_UID, "access": "proxy",
         "url": "http://prometheus:9090", "isDefault": True,
         "jsonData": {"exemplarTraceIdDestinations": [{"name": "trace_id", "datasourceUid": TEMPO_UID}]}},
        {"name": "Tempo (otel-llm)", "type": "tempo", "uid": TEMPO_UID, "access": "proxy", "url": "http://tempo:3200",
         "jsonData": {"serviceMap": {"datasourceUid": PROMETHEUS_UID},
                      "nodeGraph": {"enabled": True},
                      "search": {"hide": False}}},
    ]}
    dashboards = {"apiVersion": 1, "providers": [
        {"name": "otel-llm", "type": "file", "disableDeletion": False, "allowUiUpdates": True,
         "options": {"path": "/etc/grafana/dashboards/otel-llm", "foldersFromFilesStructure": False}}]}
    return {"provisioning/datasources/otel-llm.yaml": datasources,
            "provisioning/dashboards/otel-llm.yaml": dashboards}


def render() -> dict[str, str]:
    """Every generated file, relative path -> exact text."""
    files = {"otel-llm.json": json.dumps(build(), indent=2, sort_keys=True) + "\n"}
    header = "# Generated by `otel-llm dashboard`; edit otel_llm/views/dashboard.py instead.\n"
    for path, doc in provisioning().items():
        files[path] = header + yaml.safe_dump(doc, sort_keys=True, default_flow_style=False)
    return files


def write_all(out: str | os.PathLike[str] = "dashboards") -> list[Path]:
    written = []
    for rel, text in render().items():
        path = Path(out) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
