"""``otel-llm-collector scale-config``: generate the scale-out deployments on the upstream Collector.

Two layouts (see the README's scale-out section):

* ``two-tier``: an upstream Collector tier with the ``loadbalancing`` exporter routing spans by
  trace id to N of our gateways (each holds whole traces, so tail sampling and the per-request
  metrics stay correct); each gateway exports kept traces to the backend.
* ``upstream``: no Python in the pipeline. The upstream ``tail_sampling`` processor with our
  attribute names (``ottl_condition`` for SLO breaches, because ``numeric_attribute`` is int-only)
  and the ``signaltometrics`` connector building our histograms from the request span's
  ``llm.latency.*`` attributes. The rolling-percentile policy has no upstream equivalent; a static
  ``latency`` threshold stands in for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from otel_llm.core import semconv as sc
from otel_llm.core.metrics import SERVER_HISTOGRAMS, TOKEN_BUCKETS
from otel_llm.core.slo import SLO, SLOTable

# request-level histograms that are one of our span attributes, by metric name
_ATTRIBUTE_OF = {
    "gen_ai.server.time_to_first_token": sc.LATENCY_TTFT,
    "gen_ai.server.time_per_output_token": sc.LATENCY_TPOT,
    "gen_ai.server.request.duration": sc.LATENCY_E2E,
    "llm.server.queue.duration": sc.LATENCY_QUEUE,
    "llm.server.prefill.duration": sc.LATENCY_PREFILL,
    "llm.server.decode.duration": sc.LATENCY_DECODE,
}
_DIMENSIONS = [{"key": sc.OPERATION_NAME}, {"key": sc.REQUEST_MODEL, "optional": True},
               {"key": sc.PROVIDER_NAME, "optional": True}, {"key": sc.ERROR_TYPE, "optional": True}]


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


def _receivers() -> dict[str, Any]:
    return {"otlp": {"protocols": {"grpc": {"endpoint": "0.0.0.0:4317"}, "http": {"endpoint": "0.0.0.0:4318"}}}}


def loadbalancer_tier(o: ScaleOptions) -> dict[str, Any]:
    """Tier 1 (upstream Collector): route every span of a trace to the same gateway."""
    if o.dns_hostname:
        host, _, port = o.dns_hostname.partition(":")
        resolver: dict[str, Any] = {"dns": {"hostname": host, "port": int(port or 4317)}}
    else:
        resolver = {"static": {"hostnames": list(o.gateways)}}
    return {
        "receivers": _receivers(),
        "processors": {"batch": {}},
        "exporters": {"loadbalancing": {
            "routing_key": "traceID",
            "protocol": {"otlp": {"timeout": "5s", "tls": {"insecure": True}}},
            "resolver": resolver,
        }},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                             "exporters": ["loadbalancing"]}}},
    }


def gateway_tier(o: ScaleOptions) -> dict[str, Any]:
    """Tier 2 (ours): one file for every gateway replica."""
    policies: list[dict[str, Any]] = [
        {"name": "errors", "type": "error"},
        {"name": "sdk_decision", "type": "sdk_decision"},
        {"name": "slo_breach", "type": "slo"},
        {"name": "slow_p99", "type": "latency_percentile", "latency_percentile": {"quantile": 0.99, "measure": "e2e"}},
        {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": o.baseline_percent}},
    ]
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "0.0.0.0:4317"},
                                             "http": {"endpoint": "0.0.0.0:4318"}}}},
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
        return ",".join(f"{k}={getattr(s, k):g}" for k in ("ttft", "tpot", "e2e") if getattr(s, k) is not None)

    parts = [one(t.default)] if t.default != SLO() else []
    parts += [f"{m}: {one(s)}" for m, s in t.per_model.items()]
    return "; ".join(parts)


def _slo_conditions(t: SLOTable) -> list[str]:
    """OTTL span conditions true when a request span breaches its model's SLO."""
    attr = {"ttft": sc.LATENCY_TTFT, "tpot": sc.LATENCY_TPOT, "e2e": sc.LATENCY_E2E}

    def terms(s: SLO) -> list[str]:
        return [f'attributes["{attr[k]}"] > {getattr(s, k):g}' for k in ("ttft", "tpot", "e2e")
                if getattr(s, k) is not None]

    out = []
    others = [f'attributes["{sc.REQUEST_MODEL}"] != "{m}"' for m in t.per_model]
    for term in terms(t.default):
        out.append(" and ".join([term, *others]))
    for model, s in t.per_model.items():
        for term in terms(s):
            out.append(f'attributes["{sc.REQUEST_MODEL}"] == "{model}" and {term}')
    return out


def upstream_only(o: ScaleOptions) -> dict[str, Any]:
    """The all-upstream alternative: tail_sampling + signaltometrics, our attribute names."""
    policies: list[dict[str, Any]] = [
        {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
        {"name": "sdk_decision", "type": "ottl_condition",
         "ottl_condition": {"error_mode": "ignore", "span": [f'attributes["{sc.SAMPLING_REASON}"] != nil']}},
    ]
    slo = _slo_conditions(o.slo)
    if slo:
        policies.append({"name": "slo_breach", "type": "ottl_condition",
                         "ottl_condition": {"error_mode": "ignore", "span": slo}})
    policies += [
        {"name": "slow", "type": "latency", "latency": {"threshold_ms": o.slow_threshold_ms}},
        {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": o.baseline_percent}},
    ]
    metrics: list[dict[str, Any]] = []
    for spec in SERVER_HISTOGRAMS:
        attribute = _ATTRIBUTE_OF.get(spec.name)
        if attribute is None:
            continue
        metrics.append({
            "name": spec.name, "description": spec.description, "unit": spec.unit,
            "conditions": [f'attributes["{attribute}"] != nil'],
            "attributes": _DIMENSIONS,
            "histogram": {"buckets": list(spec.buckets), "value": f'Double(attributes["{attribute}"])'},
        })
    for token_type, attribute in (("input", sc.USAGE_INPUT_TOKENS), ("output", sc.USAGE_OUTPUT_TOKENS)):
        metrics.append({
            "name": "llm.server.token.usage", "description": "Input and output tokens per request",
            "unit": "{token}",
            "conditions": [f'attributes["{sc.LATENCY_E2E}"] != nil and attributes["{attribute}"] != nil'],
            "attributes": [*_DIMENSIONS, {"key": sc.TOKEN_TYPE, "default_value": token_type}],
            "histogram": {"buckets": list(TOKEN_BUCKETS), "value": f'Double(attributes["{attribute}"])'},
        })
    metrics.append({"name": "llm.server.requests", "description": "Finished requests", "unit": "{request}",
                    "conditions": [f'attributes["{sc.LATENCY_E2E}"] != nil'], "attributes": _DIMENSIONS,
                    "sum": {"value": "1"}})
    metrics.append({"name": "llm.server.requests.good", "unit": "{request}",
                    "description": "Requests that met every SLO (as the SDK recorded in llm.slo.met)",
                    "conditions": [f'attributes["{sc.SLO_MET}"] == true'], "attributes": _DIMENSIONS,
                    "sum": {"value": "1"}})
    return {
        "receivers": _receivers(),
        "processors": {"tail_sampling": {"decision_wait": o.decision_wait,
                                         "decision_wait_after_root_received": o.decision_wait_after_root,
                                         "num_traces": o.num_traces, "policies": policies}},
        "connectors": {"signaltometrics": {"spans": metrics}},
        "exporters": {"otlp": {"endpoint": o.backend, "tls": {"insecure": True}},
                      "prometheus": {"endpoint": o.prometheus_endpoint}},
        "service": {"pipelines": {
            # metrics from 100% of spans, before sampling
            "traces/metrics": {"receivers": ["otlp"], "exporters": ["signaltometrics"]},
            "traces/sampled": {"receivers": ["otlp"], "processors": ["tail_sampling"], "exporters": ["otlp"]},
            "metrics": {"receivers": ["signaltometrics"], "exporters": ["prometheus"]},
        }},
    }


def write(out_dir: str, o: ScaleOptions, mode: str = "both") -> list[str]:
    """Write the generated files; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    files: dict[str, dict[str, Any]] = {}
    if mode in ("two-tier", "both"):
        files["tier1-loadbalancer.yaml"] = loadbalancer_tier(o)
        files["tier2-gateway.yaml"] = gateway_tier(o)
    if mode in ("upstream", "both"):
        files["upstream-only.yaml"] = upstream_only(o)
    paths = []
    for name, doc in files.items():
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"# generated by otel-llm-collector scale-config ({name})\n")
            yaml.safe_dump(doc, f, sort_keys=False, width=120)
        paths.append(path)
    return paths
