"""``otel-llm-collector scale-config``: generate the scale-out deployments on the upstream Collector.

Two layouts (see docs/collector.md, "Scale-out"):

* ``two-tier``: an upstream Collector tier with the load-balancing exporter routing spans by trace id
  to N of our gateways (each holds whole traces, so tail sampling and the per-request metrics stay
  correct); each gateway exports kept traces to the backend.
* ``upstream``: no Python in the pipeline. The upstream ``tail_sampling`` processor with our attribute
  names (``ottl_condition`` for SLO breaches, one per SLO scope, model and tenant, because
  ``numeric_attribute`` is int-only) and the signal-to-metrics connector building our histograms from the
  request span's ``llm.latency.*`` attributes, by model, tenant and the other request dimensions. The
  rolling-percentile policy has no upstream equivalent; a static ``latency`` threshold
  stands in for it.

The upstream files are written for one otelcol-contrib release line (``UpstreamTarget``): its
component names and the keys its components accept. Facts behind each choice are cited in
tests/collector/upstream_schema.py, which the tests hold the generated YAML against.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml

from otel_llm import semconv as sc
from otel_llm.core.metrics import SERVER_HISTOGRAMS, SERVER_METRICS
from otel_llm.core.slo import SLO, TENANT_MARK, SLOTable


@dataclass(frozen=True)
class UpstreamTarget:
    """What differs between otelcol-contrib releases, for the components the generated files use."""

    name: str
    releases: str                  # human-readable range, for the file header and the README
    load_balancing: str            # exporter type
    otlp_exporter: str             # the OTLP/gRPC exporter type
    signal_to_metrics: str         # connector type
    delta_to_cumulative: str       # processor type
    # signal_to_metrics ``sum.monotonic`` (contrib PR #45865): without it a sum is a non-monotonic delta,
    # which the Prometheus exporter drops, and after delta_to_cumulative a cumulative gauge-like sum.
    sum_monotonic: bool
    # signal_to_metrics ``error_mode`` (contrib PR #46005; default ``propagate``: one bad record fails the batch)
    connector_error_mode: bool
    # tail_sampling ``decision_wait_after_root_received`` (contrib PR #44878, Dec 2025)
    decision_wait_after_root: bool


TARGETS: dict[str, UpstreamTarget] = {
    # the snake_case names; the old ones are still accepted there, with a deprecation warning
    "v0.159": UpstreamTarget("v0.159", "otelcol-contrib v0.159.x (and later releases that keep these names)",
                             load_balancing="load_balancing", otlp_exporter="otlp_grpc",
                             signal_to_metrics="signal_to_metrics", delta_to_cumulative="delta_to_cumulative",
                             sum_monotonic=True, connector_error_mode=True, decision_wait_after_root=True),
    # releases from before the renames that already ship signaltometrics: the old names, and none of the
    # newer keys (sum.monotonic, the connector's error_mode, decision_wait_after_root_received)
    "legacy": UpstreamTarget("legacy", "otelcol-contrib v0.119 to v0.143 (before the component renames)",
                             load_balancing="loadbalancing", otlp_exporter="otlp",
                             signal_to_metrics="signaltometrics", delta_to_cumulative="deltatocumulative",
                             sum_monotonic=False, connector_error_mode=False, decision_wait_after_root=False),
}
DEFAULT_TARGET = "v0.159"

_DIMENSIONS = [{"key": sc.OPERATION_NAME}, {"key": sc.REQUEST_MODEL, "optional": True},
               {"key": sc.PROVIDER_NAME, "optional": True}, {"key": sc.ERROR_TYPE, "optional": True},
               # disaggregated serving: which half (prefill, decode) a request span is, as our gateways label it
               {"key": sc.DISAGG_ROLE, "optional": True},
               # the request's tenant as the SDK wrote it (cleaned, capped to the ``tenant_limit``, then ``other``):
               # the connector cannot clean or cap, so its cardinality is the SDK's (docs/collector.md)
               {"key": sc.REQUEST_TENANT, "optional": True}]


PRIVATE_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")


@dataclass(frozen=True)
class ScaleOptions:
    gateways: tuple[str, ...] = ("otel-llm-gateway-0:4317", "otel-llm-gateway-1:4317")
    dns_hostname: str | None = None  # use the dns resolver instead of a static list
    backend: str = "tempo:4317"
    slo: SLOTable = field(default_factory=SLOTable)
    baseline_percent: float = 5.0
    slow_threshold_ms: int = 10_000  # upstream stand-in for the percentile policy
    decision_wait: str = "30s"
    decision_wait_after_root: str = "2s"
    num_traces: int = 50_000
    prometheus_endpoint: str = "0.0.0.0:8889"
    target: str = DEFAULT_TARGET
    # where the load-balancing tier's connections come from: every span reaches a gateway through it, so it is
    # exempt from the gateways' per-peer shares (docs/collector-limits.md); the private ranges by default
    trusted_peers: tuple[str, ...] = PRIVATE_NETWORKS

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}; one of {', '.join(TARGETS)}")
        from .fairness import parse_network

        for entry in self.trusted_peers:
            parse_network(entry)  # a ValueError naming the entry

    @property
    def upstream(self) -> UpstreamTarget:
        return TARGETS[self.target]


# -- OTTL ---------------------------------------------------------------------------------------

def ottl_string(value: str) -> str:
    """``value`` as an OTTL string literal.

    OTTL's lexer takes ``"(\\\\.|[^\\\\"])*"`` as a string and unquotes it with Go's ``strconv.Unquote``
    (contrib pkg/ottl/grammar.go and parser.go, escape handling since PR #30839), so a JSON string --
    backslash, quote and control characters escaped, everything else as UTF-8 -- is read back unchanged."""
    return json.dumps(value, ensure_ascii=False)


def ottl_attr(key: str) -> str:
    return f"attributes[{ottl_string(key)}]"


def ottl_number(value: float) -> str:
    """A number literal OTTL's lexer accepts: ``Int`` or ``Float`` in plain decimal (never ``1e-05``)."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{value!r} is not a threshold OTTL can compare with")
    text = format(Decimal(repr(float(value))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _is_number(key: str) -> str:
    """True when the attribute holds a number: ``Double()`` of anything else yields nil, which fails the
    whole batch under signal_to_metrics' default ``error_mode: propagate``."""
    a = ottl_attr(key)
    return f"(IsDouble({a}) or IsInt({a}))"


def _slo_conditions(t: SLOTable) -> list[str]:
    """OTTL span conditions true when a request span breaches the SLO of its scope.

    One condition per (scope, objective): the scope's membership test, then the threshold. The scopes are
    disjoint and follow ``SLOTable.for_request``'s order (``model@tenant``, ``@tenant``, model, default): each
    excludes the more specific scopes that would win over it. A span without a tenant (or a model) compares
    ``!=`` true and ``==`` false with every string, so it falls to the scopes that do not name one, as
    ``for_request`` does. The goodput target is an alerting objective, not a per-request threshold: no term."""
    attr = {"ttft": sc.LATENCY_TTFT, "tpot": sc.LATENCY_TPOT, "e2e": sc.LATENCY_E2E}
    model, tenant = ottl_attr(sc.REQUEST_MODEL), ottl_attr(sc.REQUEST_TENANT)

    def terms(s: SLO) -> list[str]:
        # a comparison of a non-number with a number is false in OTTL, not an error
        return [f"{ottl_attr(attr[k])} > {ottl_number(getattr(s, k))}" for k in ("ttft", "tpot", "e2e")
                if getattr(s, k) is not None]

    def is_model(m: str, op: str = "==") -> str:
        return f"{model} {op} {ottl_string(m)}"

    def is_tenant(x: str, op: str = "==") -> str:
        return f"{tenant} {op} {ottl_string(x)}"

    def not_model(m: str) -> str:
        return is_model(m, "!=")

    def not_tenant(x: str) -> str:
        return is_tenant(x, "!=")

    pairs = list(t.per_model_tenant)
    scopes: list[tuple[list[str], SLO]] = []
    # the default: no model, tenant or (model, tenant) scope of its own
    scopes.append(([*(not_model(m) for m in t.per_model), *(not_tenant(x) for x in t.per_tenant),
                    *(f"({not_model(m)} or {not_tenant(x)})" for m, x in pairs if m not in t.per_model
                      and x not in t.per_tenant)], t.default))
    for m, s in t.per_model.items():  # a model's, unless its tenant (alone or on this model) has one
        scopes.append(([is_model(m), *(not_tenant(x) for x in t.per_tenant),
                        *(not_tenant(x) for pm, x in pairs if pm == m and x not in t.per_tenant)], s))
    for x, s in t.per_tenant.items():  # a tenant's, unless it has one on this model
        scopes.append(([is_tenant(x), *(not_model(m) for m, px in pairs if px == x)], s))
    for (m, x), s in t.per_model_tenant.items():
        scopes.append(([is_model(m), is_tenant(x)], s))
    out = [" and ".join([term, *scopes[0][0]]) for term in terms(scopes[0][1])]  # the default: the term first
    return out + [" and ".join([*scope, term]) for scope, s in scopes[1:] for term in terms(s)]


# -- the files ----------------------------------------------------------------------------------

def _receivers() -> dict[str, Any]:
    return {"otlp": {"protocols": {"grpc": {"endpoint": "0.0.0.0:4317"}, "http": {"endpoint": "0.0.0.0:4318"}}}}


def _gateway_receivers(o: ScaleOptions) -> dict[str, Any]:
    """Our gateways' receivers: the upstream ones, with the load-balancing tier as a trusted peer."""
    trusted = list(o.trusted_peers)
    return {"otlp": {"protocols": {"grpc": {"endpoint": "0.0.0.0:4317", "trusted_peers": trusted},
                                   "http": {"endpoint": "0.0.0.0:4318", "trusted_peers": trusted}}}}


def _dns_resolver(spec: str) -> dict[str, Any]:
    host, _, port = spec.partition(":")
    if not host:
        raise ValueError(f"--dns {spec!r}: give host[:port]")
    port = port or "4317"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dns {spec!r}: port must be a number 1-65535")
    # the upstream DNSResolver declares Port as a string; strict decoding refuses a YAML integer
    return {"dns": {"hostname": host, "port": port}}


def loadbalancer_tier(o: ScaleOptions) -> dict[str, Any]:
    """Tier 1 (upstream Collector): route every span of a trace to the same gateway."""
    u = o.upstream
    resolver = _dns_resolver(o.dns_hostname) if o.dns_hostname else {"static": {"hostnames": list(o.gateways)}}
    return {
        "receivers": _receivers(),
        "processors": {"batch": {}},
        "exporters": {u.load_balancing: {
            "routing_key": "traceID",
            # every otlp exporter key but endpoint (set per gateway); our gateways listen in plaintext
            "protocol": {"otlp": {"timeout": "5s", "tls": {"insecure": True}}},
            "resolver": resolver,
        }},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                             "exporters": [u.load_balancing]}}},
    }


def gateway_tier(o: ScaleOptions) -> dict[str, Any]:
    """Tier 2 (ours): one file for every gateway replica (our config vocabulary, checked by our loader)."""
    policies: list[dict[str, Any]] = [
        {"name": "errors", "type": "error"},
        {"name": "sdk_decision", "type": "sdk_decision"},
        {"name": "slo_breach", "type": "slo"},
        {"name": "slow_p99", "type": "latency_percentile", "latency_percentile": {"quantile": 0.99, "measure": "e2e"}},
        {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": o.baseline_percent}},
    ]
    return {
        "receivers": _gateway_receivers(o),
        "processors": {
            "llm_metrics": {"slo": _slo_text(o.slo)},
            "tail_sampling": {"decision_wait": o.decision_wait,
                              "decision_wait_after_root_received": o.decision_wait_after_root,
                              "num_traces": o.num_traces, "policies": policies},
        },
        "exporters": {"otlp": {"endpoint": o.backend}, "prometheus": {"endpoint": o.prometheus_endpoint}},
    }


def _slo_text(t: SLOTable) -> str:
    def one(s: SLO) -> str:
        return ",".join(f"{k}={getattr(s, k)!r}" for k in ("ttft", "tpot", "e2e", "goodput")
                        if getattr(s, k) is not None)

    parts = [one(t.default)] if t.default != SLO() else []
    parts += [f"{m}: {one(s)}" for m, s in t.per_model.items()]
    parts += [f"{TENANT_MARK}{x}: {one(s)}" for x, s in t.per_tenant.items()]
    parts += [f"{m}{TENANT_MARK}{x}: {one(s)}" for (m, x), s in t.per_model_tenant.items()]
    return "; ".join(parts)


def _connector_metrics(u: UpstreamTarget) -> list[dict[str, Any]]:
    """The signal_to_metrics definitions: our histograms, token usage and the request/goodput counters."""
    metrics: list[dict[str, Any]] = []
    for spec in SERVER_HISTOGRAMS:
        attribute = spec.attribute  # the span attribute the histogram's value is, if it is one
        if attribute is None:
            continue
        metrics.append({
            "name": spec.name, "description": spec.description, "unit": spec.unit,
            "conditions": [_is_number(attribute)],
            "attributes": _DIMENSIONS,
            "histogram": {"buckets": list(spec.buckets), "value": f"Double({ottl_attr(attribute)})"},
        })
    tokens = SERVER_METRICS.token_usage_spec
    for token_type, attribute in (("input", sc.USAGE_INPUT_TOKENS), ("output", sc.USAGE_OUTPUT_TOKENS)):
        metrics.append({
            "name": tokens.name, "description": tokens.description, "unit": tokens.unit,
            "conditions": [f"{ottl_attr(sc.LATENCY_E2E)} != nil and {_is_number(attribute)}"],
            "attributes": [*_DIMENSIONS, {"key": sc.TOKEN_TYPE, "default_value": token_type}],
            "histogram": {"buckets": list(tokens.buckets), "value": f"Double({ottl_attr(attribute)})"},
        })
    counter: dict[str, Any] = {"value": "1"}
    if u.sum_monotonic:
        counter["monotonic"] = True
    requests, good = SERVER_METRICS.requests_spec, SERVER_METRICS.good_requests_spec
    # a prefill instance's half of a disaggregated request is not a user request: out of the goodput counters.
    # Upstream cannot join the halves as our gateways do: the decode half stands for the user request, as in a
    # server's own metrics (a span without the role compares != and counts)
    user = f"{ottl_attr(sc.DISAGG_ROLE)} != {ottl_string(sc.DISAGG_ROLE_PREFILL)}"
    metrics.append({"name": requests.name, "description": requests.description, "unit": requests.unit,
                    "conditions": [f"{ottl_attr(sc.LATENCY_E2E)} != nil and {user}"], "attributes": _DIMENSIONS,
                    "sum": dict(counter)})
    metrics.append({"name": good.name, "unit": good.unit,
                    "description": "Requests that met every SLO (as the SDK recorded in llm.slo.met)",
                    "conditions": [f"{ottl_attr(sc.SLO_MET)} == true and {user}"], "attributes": _DIMENSIONS,
                    "sum": dict(counter)})
    return metrics


def upstream_only(o: ScaleOptions) -> dict[str, Any]:
    """The all-upstream alternative: tail_sampling + signal_to_metrics, our attribute names.

    Metrics pipeline: signal_to_metrics emits one delta data point per batch, with no start timestamp;
    the Prometheus exporter drops non-monotonic delta sums and does not add up delta histograms whose
    start is not the previous point's time. delta_to_cumulative turns them into cumulative series first."""
    u = o.upstream
    policies: list[dict[str, Any]] = [
        {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
        # ignore: a condition that cannot be evaluated on a span is "no match", logged, and the trace is
        # still judged by the other policies (propagate would count it as a policy error instead)
        # a prefill instance exports every half it served with the deferred reason (kv_handoff): that is not a
        # decision to keep, the trace is judged by the decode half's breach like any other
        {"name": "sdk_decision", "type": "ottl_condition",
         "ottl_condition": {"error_mode": "ignore", "span": [
             f"{ottl_attr(sc.SAMPLING_REASON)} != nil and "
             f"{ottl_attr(sc.SAMPLING_REASON)} != {ottl_string(sc.SAMPLING_REASON_DEFERRED)}"]}},
    ]
    slo = _slo_conditions(o.slo)
    if slo:
        policies.append({"name": "slo_breach", "type": "ottl_condition",
                         "ottl_condition": {"error_mode": "ignore", "span": slo}})
    policies += [
        {"name": "slow", "type": "latency", "latency": {"threshold_ms": o.slow_threshold_ms}},
        {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": o.baseline_percent}},
    ]
    connector: dict[str, Any] = {}
    if u.connector_error_mode:
        # ignore: a record whose value cannot be read is skipped and logged; the rest of the batch counts
        connector["error_mode"] = "ignore"
    connector["spans"] = _connector_metrics(u)
    tail_sampling: dict[str, Any] = {"decision_wait": o.decision_wait}
    if u.decision_wait_after_root:
        tail_sampling["decision_wait_after_root_received"] = o.decision_wait_after_root
    tail_sampling.update(num_traces=o.num_traces, policies=policies)
    return {
        "receivers": _receivers(),
        "processors": {"tail_sampling": tail_sampling, u.delta_to_cumulative: {"max_stale": "5m"}},
        "connectors": {u.signal_to_metrics: connector},
        "exporters": {u.otlp_exporter: {"endpoint": o.backend, "tls": {"insecure": True}},
                      "prometheus": {"endpoint": o.prometheus_endpoint}},
        "service": {"pipelines": {
            # metrics from 100% of spans, before sampling
            "traces/metrics": {"receivers": ["otlp"], "exporters": [u.signal_to_metrics]},
            "traces/sampled": {"receivers": ["otlp"], "processors": ["tail_sampling"],
                               "exporters": [u.otlp_exporter]},
            "metrics": {"receivers": [u.signal_to_metrics], "processors": [u.delta_to_cumulative],
                        "exporters": ["prometheus"]},
        }},
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes a shared list out in full each time: no ``&id001`` anchors for a reader to chase."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


FILES = {
    "tier1-loadbalancer.yaml": ("two-tier", loadbalancer_tier,
                                "upstream Collector: routes every span of a trace to one of our gateways"),
    "tier2-gateway.yaml": ("two-tier", gateway_tier,
                           "otel-llm-collector: one config for every gateway replica"),
    "upstream-only.yaml": ("upstream", upstream_only,
                           "upstream Collector alone: tail_sampling + signal_to_metrics on our attributes"),
}


def generate(o: ScaleOptions, mode: str = "both") -> dict[str, dict[str, Any]]:
    """The generated documents by file name."""
    if mode not in ("two-tier", "upstream", "both"):
        raise ValueError(f"unknown mode {mode!r}")
    return {name: build(o) for name, (kind, build, _) in FILES.items() if mode in (kind, "both")}


def write(out_dir: str, o: ScaleOptions, mode: str = "both") -> list[str]:
    """Write the generated files; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, doc in generate(o, mode).items():
        path = os.path.join(out_dir, name)
        what = FILES[name][2]
        target = "" if name == "tier2-gateway.yaml" else f"; for {o.upstream.releases}"
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"# generated by otel-llm-collector scale-config: {what}{target}\n")
            yaml.dump(doc, f, Dumper=_PlainDumper, sort_keys=False, width=120, allow_unicode=True)
        paths.append(path)
    return paths
