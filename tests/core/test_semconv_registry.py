"""Our GenAI names, held against the GenAI semantic conventions' registry as vendored at a fixed commit
(tests/data/semconv_genai/: the extract, its source and commits).

Every ``gen_ai.*`` name we declare (semconv.py's attributes, span and event names; the metric tables' names)
is the registry's, with the registry's unit and instrument where it is a metric, or is listed below with the
reason we emit it anyway. Every other name of ours is under our own ``llm.*`` namespace or another
convention's namespace we use deliberately (listed below).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from otel_llm import semconv as sc
from otel_llm.core import metrics, semconv_mode
from otel_llm.core.client_metrics import CLIENT_METRICS, CLIENT_METRICS_LATEST

REGISTRY_FILE = Path(__file__).resolve().parents[1] / "data" / "semconv_genai" / "registry.yaml"
REGISTRY = yaml.safe_load(REGISTRY_FILE.read_text(encoding="utf-8"))
COMMITS = ", ".join(f"{path}@{commit[:12]}" for path, commit in REGISTRY["files"].items())

# gen_ai.* names of ours that the registry lacks, each with the reason we use it
DELIBERATE = {
    sc.VLLM_TTFT: "vLLM's and SGLang's request-span latency (proposal 408), beside ours for their dashboards",
    sc.VLLM_E2E: "vLLM's and SGLang's request-span latency (proposal 408), beside ours for their dashboards",
    sc.VLLM_QUEUE: "vLLM's and SGLang's request-span latency (proposal 408), beside ours for their dashboards",
    sc.VLLM_PREFILL: "vLLM's request-span latency (proposal 408), beside ours for its dashboards",
    sc.VLLM_DECODE: "vLLM's request-span latency (proposal 408), beside ours for its dashboards",
    sc.VLLM_INFERENCE: "vLLM's request-span latency (proposal 408), beside ours for its dashboards",
    sc.VLLM_PROMPT_TOKENS: "read from vLLM's and TensorRT-LLM's native spans (deprecated names); never emitted",
    sc.VLLM_COMPLETION_TOKENS: "read from vLLM's and TensorRT-LLM's native spans (deprecated names); never emitted",
}
# other conventions' namespaces (and the one URL) among our declarations, each with why
OTHER_NAMESPACES = {
    "error.": "OpenTelemetry's general attribute (error.type)",
    "server.": "OpenTelemetry's general attributes (server.address, server.port)",
    "service.": "resource attributes (service.name, service.instance.id)",
    "hw.": "OpenTelemetry's hardware conventions, for the GPU sampler's metrics",
    "openinference.": "Phoenix's project attribute on our resources",
    "https://opentelemetry.io/schemas/": "the schema URL of our tracers and meters",
}
KINDS = {"histogram": "histogram", "counter": "counter", "gauge": "gauge", "updowncounter": "updowncounter"}


def declared_attribute_names() -> set[str]:
    """Every dotted string semconv.py declares (attributes, span and event names, metric names; not the
    module's own dunders, nor the metric namespaces the names are built from)."""
    names = {v for k, v in vars(sc).items()
             if isinstance(v, str) and "." in v and not k.startswith("__") and not k.endswith("_NAMESPACE")}
    return names | set(sc.SLOW_SECONDS.values())


def metric_rows(metric_set: metrics.MetricSet) -> list:
    inter_token = (metric_set.inter_token,) if metric_set.inter_token is not None else ()
    return [*metric_set.histograms, *inter_token, *metric_set.instruments()]


def all_metric_rows() -> list:
    return [*metric_rows(metrics.SERVER_METRICS), *metric_rows(CLIENT_METRICS), *metric_rows(CLIENT_METRICS_LATEST),
            metrics.CLIENT_OVERHEAD, *metrics.STEP_METRICS, *metrics.GPU_METRICS]


def unregistered(names: set[str], known: dict) -> list[str]:
    """The ``gen_ai.*`` names among ``names`` that neither ``known`` nor ``DELIBERATE`` hold."""
    return sorted(n for n in names if n.startswith("gen_ai.") and n not in known and n not in DELIBERATE)


def known_names() -> dict:
    return {**REGISTRY["attributes"], **REGISTRY["metrics"], **REGISTRY["previous_metrics"],
            **REGISTRY["pending_metrics"]}


def test_the_extract_names_its_source_and_commits():
    assert REGISTRY["source"] == "https://github.com/open-telemetry/semantic-conventions-genai"
    assert all(re.fullmatch(r"[0-9a-f]{40}", c) for c in REGISTRY["files"].values())
    readme = (REGISTRY_FILE.parent / "README.md").read_text(encoding="utf-8")
    assert all(c in readme for c in REGISTRY["files"].values())
    assert len(REGISTRY["attributes"]) > 50 and len(REGISTRY["metrics"]) > 15  # the whole registry, not a sample


def test_every_gen_ai_name_we_declare_is_the_registrys():
    names = declared_attribute_names() | {row.name for row in all_metric_rows()}
    names |= {a for row in all_metric_rows() for a in row.attributes}
    missing = unregistered(names, known_names())
    assert not missing, f"not in the GenAI registry ({COMMITS}) nor listed in DELIBERATE: {missing}"


def test_our_metrics_have_the_registrys_unit_and_instrument():
    known = {**REGISTRY["metrics"], **REGISTRY["previous_metrics"], **REGISTRY["pending_metrics"]}
    wrong = []
    for row in all_metric_rows():
        if not row.name.startswith("gen_ai."):
            continue
        d = known[row.name]
        if (row.unit, KINDS[row.kind]) != (d["unit"], d["instrument"]):
            wrong.append(f"{row.name}: ours {row.unit} {row.kind}, the registry's {d['unit']} {d['instrument']}")
        if set(d.get("attributes", ())) - set(row.attributes):
            wrong.append(f"{row.name}: lacks the registry's required {d['attributes']}")
    assert not wrong, f"against the GenAI registry ({COMMITS}):\n" + "\n".join(wrong)


def test_each_version_of_the_client_metrics_uses_its_conventions_names():
    """The default emits what the contrib instrumentations emit by default (the registry's names, and the
    token-usage histogram the registry replaced); the latest the registry's current names and the open
    renames (PR 521) it already follows; neither emits a name the other replaced."""
    default = {row.name for row in metric_rows(CLIENT_METRICS) if row.name.startswith("gen_ai.")}
    latest = {row.name for row in metric_rows(CLIENT_METRICS_LATEST) if row.name.startswith("gen_ai.")}
    assert default <= set(REGISTRY["metrics"]) | set(REGISTRY["previous_metrics"])
    assert not default & set(REGISTRY["pending_metrics"])
    assert latest <= set(REGISTRY["metrics"]) | set(REGISTRY["pending_metrics"])
    assert not latest & set(REGISTRY["previous_metrics"])
    replaced = {d["replaces"].split()[0] for d in REGISTRY["pending_metrics"].values()}
    assert latest & replaced == {sc.METRIC_CLIENT_DURATION}  # kept for embeddings only (PR 521)


def test_enum_values_we_set_are_members_or_the_enum_is_open():
    attrs = REGISTRY["attributes"]
    for value in (sc.OPERATION_CHAT, sc.OPERATION_TEXT_COMPLETION, sc.OPERATION_EMBEDDINGS):
        assert value in attrs[sc.OPERATION_NAME]["members"]
    assert {"input", "output"} <= set(attrs[sc.TOKEN_TYPE]["members"])
    assert sc.TOKEN_MODALITY_UNKNOWN in attrs[sc.TOKEN_MODALITY]["members"]
    # vLLM and TensorRT-LLM are no listed provider: the registry allows a custom value there
    assert sc.PROVIDER_VLLM not in attrs[sc.PROVIDER_NAME]["members"] and attrs[sc.PROVIDER_NAME]["open"]
    assert "openai" in attrs[sc.PROVIDER_NAME]["members"]


def test_names_outside_the_registry_are_ours_or_a_listed_namespace():
    names = declared_attribute_names() | {row.name for row in all_metric_rows()}
    stray = sorted(n for n in names if not n.startswith(("gen_ai.", "llm.", *OTHER_NAMESPACES)))
    assert not stray, f"neither gen_ai.* (registry), llm.* (ours) nor a listed namespace: {stray}"
    assert not set(DELIBERATE) & set(known_names()), "a deliberate name is in the registry now: drop it from the list"


def test_the_check_can_fail():
    """A misspelt or invented gen_ai name is caught; a listed one is not."""
    assert unregistered({"gen_ai.request.modle", "gen_ai.client.token.usages", sc.VLLM_E2E, sc.REQUEST_MODEL},
                        known_names()) == ["gen_ai.client.token.usages", "gen_ai.request.modle"]


@pytest.mark.parametrize("value, latest", [
    (None, False), ("", False), ("gen_ai_latest_experimental", True), ("http, gen_ai_latest_experimental ", True),
    ("database/dup,gen_ai_latest_experimental", True), ("gen_ai_latest", False), ("GEN_AI_LATEST_EXPERIMENTAL", False),
    ("http/dup", False),
])
def test_the_opt_in_is_read_as_the_contrib_instrumentations_read_it(value, latest):
    env = {} if value is None else {sc.SEMCONV_OPT_IN_ENV: value}
    assert semconv_mode.genai_latest(env) is latest
    _semconv = pytest.importorskip("opentelemetry.instrumentation._semconv")  # opentelemetry-instrumentation's
    stability = _semconv._OpenTelemetrySemanticConventionStability
    saved = (stability._initialized, dict(stability._OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING))
    try:
        stability._initialized = False
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv(sc.SEMCONV_OPT_IN_ENV, raising=False)
            if value is not None:
                mp.setenv(sc.SEMCONV_OPT_IN_ENV, value)
            mode = _semconv._get_semconv_opt_in_modes((_semconv._OpenTelemetryStabilitySignalType.GEN_AI,))
        theirs = mode[_semconv._OpenTelemetryStabilitySignalType.GEN_AI]
        assert (theirs is _semconv._StabilityMode.GEN_AI_LATEST_EXPERIMENTAL) is latest
    finally:
        stability._initialized, stability._OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING = saved[0], saved[1]
