"""scale-config output held against the upstream Collector's own structure (tests/collector/upstream_schema.py,
transcribed from the upstream sources with citations), its OTTL grammar (ottl_check.py) and what its
metrics pipeline does with the data (upstream_metrics_model.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_llm import semconv as sc
from otel_llm.core.metrics import GOOD_REQUESTS, REQUESTS, SERVER_HISTOGRAMS, SERVER_METRICS, TTFT_BUCKETS
from otel_llm.core.slo import SLO, SLOTable
from otel_llm.core.summary import RequestSummary
from otel_llm_collector.cli import main
from otel_llm_collector.config import CollectorConfig
from otel_llm_collector.scale_config import TARGETS, ScaleOptions, generate, ottl_number, ottl_string
from ottl_check import OTTLSyntaxError, parse_condition, parse_value_expression, tokenize
from upstream_config_check import check_config, component_type, deprecated_types
from upstream_metrics_model import run_pipeline
from upstream_schema import RELEASES

SLO_ARG = "ttft=0.5,tpot=0.05; big: ttft=2"
VARIANTS = [(t, r) for t in TARGETS for r in ("static", "dns")]


def _cli(tmp_path: Path, target: str, resolver: str, slo: str = SLO_ARG) -> dict[str, dict[str, Any]]:
    where = ["--dns", "gateways.svc:4317"] if resolver == "dns" else ["--gateways", "gw-0:4317,gw-1:4317,gw-2:4317"]
    assert main(["scale-config", "--out", str(tmp_path), *where, "--slo", slo, "--backend", "tempo:4317",
                 "--target", target]) == 0
    return {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in tmp_path.glob("*.yaml")}


def _section(doc: dict[str, Any], section: str, type_: str) -> tuple[str, Any]:
    return next((cid, body) for cid, body in doc[section].items() if component_type(cid) == type_)


def _connector(doc: dict[str, Any], target: str) -> dict[str, Any]:
    return doc["connectors"][TARGETS[target].signal_to_metrics]


def _ottl(doc: dict[str, Any], target: str) -> tuple[list[str], list[str]]:
    """(conditions, value expressions) in an upstream-only document."""
    conds = [c for p in doc["processors"]["tail_sampling"]["policies"]
             for c in (p.get("ottl_condition") or {}).get("span", [])]
    values = []
    for m in _connector(doc, target)["spans"]:
        conds += m.get("conditions", [])
        for kind in ("histogram", "sum", "exponential_histogram", "gauge"):
            if kind in m:
                values += [m[kind][k] for k in ("value", "count") if k in m[kind]]
    return conds, values


# -- every variant, whole-file structure -------------------------------------------------------------------

@pytest.mark.parametrize("target,resolver", VARIANTS)
def test_every_generated_upstream_file_matches_the_release_structure(tmp_path: Path, target: str,
                                                                      resolver: str) -> None:
    files = _cli(tmp_path, target, resolver)
    assert set(files) == {"tier1-loadbalancer.yaml", "tier2-gateway.yaml", "upstream-only.yaml"}
    for name in ("tier1-loadbalancer.yaml", "upstream-only.yaml"):
        assert check_config(files[name], RELEASES[target]) == [], name
    c = CollectorConfig.from_mapping(files["tier2-gateway.yaml"])  # ours: our own strict loader
    assert c.exporters[0].endpoint == "tempo:4317" and c.slo.for_model("big").ttft == 2


@pytest.mark.parametrize("target,resolver", VARIANTS)
def test_every_ottl_statement_parses_with_upstream_grammar(tmp_path: Path, target: str, resolver: str) -> None:
    doc = _cli(tmp_path, target, resolver)["upstream-only.yaml"]
    conds, values = _ottl(doc, target)
    assert len(conds) >= 10 and len(values) >= 8
    for c in conds:
        parse_condition(c)
    for v in values:
        parse_value_expression(v)


# -- the problems of issue 16, one test each ------------------------------------------------------------

def test_dns_resolver_port_is_a_string_as_upstream_declares(tmp_path: Path) -> None:
    doc = _cli(tmp_path, "v0.159", "dns")["tier1-loadbalancer.yaml"]
    _, lb = _section(doc, "exporters", "load_balancing")
    assert lb["resolver"] == {"dns": {"hostname": "gateways.svc", "port": "4317"}}
    assert check_config(doc, RELEASES["v0.159"]) == []
    # the port as the old generator wrote it is what strict decoding refuses
    lb["resolver"]["dns"]["port"] = 4317
    assert check_config(doc, RELEASES["v0.159"]) == [
        "exporters::load_balancing::resolver::dns::port: expected type 'string', got int"]


def test_bad_dns_spec_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["scale-config", "--out", str(tmp_path), "--dns", "gw.svc:http"]) == 2
    assert "port must be a number" in capsys.readouterr().err


def test_v0159_files_use_current_component_names_and_legacy_the_old_ones(tmp_path: Path) -> None:
    new = _cli(tmp_path / "new", "v0.159", "static")
    old = _cli(tmp_path / "old", "legacy", "static")
    for name in ("tier1-loadbalancer.yaml", "upstream-only.yaml"):
        assert deprecated_types(new[name], RELEASES["v0.159"]) == [], name
    assert sorted(deprecated_types(old["upstream-only.yaml"], RELEASES["v0.159"])) == [
        "connectors::signaltometrics", "exporters::otlp", "processors::deltatocumulative"]
    assert deprecated_types(old["tier1-loadbalancer.yaml"], RELEASES["v0.159"]) == ["exporters::loadbalancing"]
    # the new names do not exist in the old releases
    assert check_config(new["upstream-only.yaml"], RELEASES["legacy"]) != []


@pytest.mark.parametrize("target", list(TARGETS))
def test_prometheus_sees_every_request_counted_and_every_histogram_accumulated(tmp_path: Path,
                                                                                target: str) -> None:
    """Three batches through signal_to_metrics -> (the generated processors) -> the Prometheus exporter."""
    doc = _cli(tmp_path, target, "static")["upstream-only.yaml"]
    connector_id = TARGETS[target].signal_to_metrics
    metrics_pipes = [p for pid, p in doc["service"]["pipelines"].items()
                     if component_type(pid) == "metrics" and connector_id in p["receivers"]]
    assert len(metrics_pipes) == 1 and metrics_pipes[0]["exporters"] == ["prometheus"]
    d2c = any(component_type(x) in ("delta_to_cumulative", "deltatocumulative")
              for x in metrics_pipes[0].get("processors", []))
    batches = [(3, 1.5), (2, 0.75), (5, 4.0)]
    by_name = {m["name"]: m for m in _connector(doc, target)["spans"]}
    for name in (REQUESTS, GOOD_REQUESTS):
        monotonic = by_name[name]["sum"].get("monotonic", False)
        shown = run_pipeline("sum", monotonic, d2c, batches)
        assert shown is not None and shown[1] == 10, name  # every request counted
        # a counter (`_total`) needs sum.monotonic, which only the newer connector has; older: a gauge
        assert shown[0] == ("counter" if TARGETS[target].sum_monotonic else "gauge"), name
    for name, m in by_name.items():
        if "histogram" in m:
            assert run_pipeline("histogram", False, d2c, batches) == ("histogram", 10, 6.25), name


def test_the_pipeline_model_shows_what_the_old_files_lost() -> None:
    """The model is not vacuous: without monotonic sums and delta_to_cumulative the data is lost."""
    batches = [(3, 1.5), (2, 0.75), (5, 4.0)]
    assert run_pipeline("sum", False, False, batches) is None                       # dropped
    assert run_pipeline("sum", True, False, batches) == ("counter", 5, 0.0)          # last batch only
    assert run_pipeline("histogram", False, False, batches) == ("histogram", 3, 1.5)  # later points dropped


def test_connector_error_mode_and_numeric_guards_keep_a_bad_value_from_failing_the_batch(tmp_path: Path) -> None:
    doc = _cli(tmp_path, "v0.159", "static")["upstream-only.yaml"]
    connector = _connector(doc, "v0.159")
    assert connector["error_mode"] == "ignore"
    histograms = [m for m in connector["spans"] if "histogram" in m]
    # every server histogram whose value is a request-span attribute, and token usage (input, output)
    derived = [spec.name for spec in SERVER_HISTOGRAMS if spec.attribute is not None]
    assert [m["name"] for m in histograms] == derived + [SERVER_METRICS.token_usage_spec.name] * 2
    for m in histograms:
        attr = parse_value_expression(m["histogram"]["value"]).strings
        assert len(attr) == 1
        # every condition that lets a span in also checks that the value's attribute is a number
        for cond in m["conditions"]:
            found = parse_condition(cond)
            assert {"IsDouble", "IsInt"} <= set(found.converters) and attr[0] in found.strings, (m["name"], cond)
    for p in doc["processors"]["tail_sampling"]["policies"]:
        if p["type"] == "ottl_condition":
            assert p["ottl_condition"]["error_mode"] == "ignore"


@pytest.mark.parametrize("model", ['we"ird', "back\\slash", "trail\\", '\\"', "naïve-模型", "tab\tbed"])
def test_model_names_are_escaped_into_ottl_string_literals(model: str) -> None:
    o = ScaleOptions(slo=SLOTable(SLO(ttft=0.5), {model: SLO(ttft=2.0, e2e=0.00001)}))
    spans = next(p for p in generate(o, "upstream")["upstream-only.yaml"]["processors"]["tail_sampling"]["policies"]
                 if p["name"] == "slo_breach")["ottl_condition"]["span"]
    assert len(spans) == 3
    for cond in spans:
        found = parse_condition(cond)
        assert found.strings.count(model) == 1 and sc.REQUEST_MODEL in found.strings, cond
    assert any(cond.endswith("> 0.00001") for cond in spans)  # never 1e-05, which OTTL cannot lex


def test_model_name_with_quotes_through_the_cli(tmp_path: Path) -> None:
    doc = _cli(tmp_path, "v0.159", "static", slo='ttft=0.5; we"ird\\: ttft=2')["upstream-only.yaml"]
    conds, _ = _ottl(doc, "v0.159")
    assert any('we"ird\\' in parse_condition(c).strings for c in conds)


def test_histograms_use_our_bucket_boundaries_and_attribute_names(tmp_path: Path) -> None:
    doc = _cli(tmp_path, "v0.159", "static")["upstream-only.yaml"]
    ttft = next(m for m in _connector(doc, "v0.159")["spans"] if m["name"] == "gen_ai.server.time_to_first_token")
    assert ttft["histogram"] == {"buckets": list(TTFT_BUCKETS),
                                 "value": 'Double(attributes["llm.latency.time_to_first_token"])'}
    slo = next(p for p in doc["processors"]["tail_sampling"]["policies"] if p["name"] == "slo_breach")
    assert ('attributes["llm.latency.time_to_first_token"] > 0.5 and attributes["gen_ai.request.model"] != "big"'
            in slo["ottl_condition"]["span"])
    pipes = doc["service"]["pipelines"]
    assert pipes["traces/metrics"]["exporters"] == ["signal_to_metrics"]  # metrics see 100% of spans
    assert pipes["traces/sampled"]["processors"] == ["tail_sampling"]


def test_tier1_routes_by_trace_id_to_every_gateway(tmp_path: Path) -> None:
    doc = _cli(tmp_path, "v0.159", "static")["tier1-loadbalancer.yaml"]
    _, lb = _section(doc, "exporters", "load_balancing")
    assert lb["routing_key"] == "traceID"
    assert lb["resolver"] == {"static": {"hostnames": ["gw-0:4317", "gw-1:4317", "gw-2:4317"]}}
    assert "endpoint" not in lb["protocol"]["otlp"]  # set per backend upstream


# -- the checkers themselves catch what they are for ---------------------------------------------------------

def _minimal() -> dict[str, Any]:
    return {"receivers": {"otlp": {"protocols": {"grpc": {}}}},
            "processors": {"tail_sampling": {"policies": [{"name": "a", "type": "always_sample"}]}},
            "connectors": {"signal_to_metrics": {"spans": [{"name": "n", "sum": {"value": "1"}}]}},
            "exporters": {"prometheus": {"endpoint": "0.0.0.0:8889"}, "otlp_grpc": {"endpoint": "x:4317"}},
            "service": {"pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["tail_sampling"], "exporters": ["otlp_grpc"]},
                "traces/m": {"receivers": ["otlp"], "exporters": ["signal_to_metrics"]},
                "metrics": {"receivers": ["signal_to_metrics"], "exporters": ["prometheus"]}}}}


@pytest.mark.parametrize("mutate,error", [
    (lambda d: d["exporters"]["otlp_grpc"].update(timeout=5), "otlp_grpc::timeout: expected a duration"),
    (lambda d: d["exporters"]["otlp_grpc"].update(endpiont="x"), "has invalid keys: endpiont"),
    (lambda d: d["exporters"]["otlp_grpc"].pop("endpoint"), "endpoint is required"),
    (lambda d: d["connectors"]["signal_to_metrics"]["spans"][0].update(histogram={"value": "1"}),
     "exactly one of histogram"),
    (lambda d: d["processors"]["tail_sampling"]["policies"][0].update(type="sometimes"), "'sometimes' is not one of"),
    (lambda d: d["service"]["pipelines"].pop("metrics"), "used as exporter in traces pipeline but not used"),
    (lambda d: d["service"]["pipelines"]["metrics"].update(processors=["tail_sampling"]),
     "processor 'tail_sampling' does not support metrics"),
    (lambda d: d["service"]["pipelines"]["traces"].update(exporters=["otlp_grpc", "kafka"]),
     "references exporter 'kafka' which is not configured"),
    (lambda d: d["exporters"].update({"otlp_grpc/unused": {"endpoint": "y:4317"}}), "used in no pipeline"),
    (lambda d: d["exporters"].update({"loki": {}}), "unknown type 'loki'"),
])
def test_structure_checker_reports_what_upstream_would(mutate, error: str) -> None:
    doc = _minimal()
    assert check_config(doc, RELEASES["v0.159"]) == []
    mutate(doc)
    errs = check_config(doc, RELEASES["v0.159"])
    assert any(error in e for e in errs), errs


@pytest.mark.parametrize("text", [
    'attributes["a"] == "x"y"',                 # unescaped quote
    'attributes["a" == "x"',                    # unbalanced
    'double(attributes["a"]) > 1',              # converters are Uppercase
    'Foo(attributes["a"])',                     # not an OTTL converter
    'attributes["a"] > 1e-05',                  # OTTL has no exponent-only float
    'attributes["a"] == "bad\\q"',              # Go strconv.Unquote refuses \q
    'metric.name == "x"',                       # not a span path
])
def test_ottl_checker_rejects(text: str) -> None:
    with pytest.raises(OTTLSyntaxError):
        parse_condition(text)


def test_ottl_lexer_keeps_an_escaped_trailing_backslash_inside_its_string() -> None:
    """contrib issue #23238 / PR #30839: `"\\\\" == "b"` is two strings, not one."""
    kinds = [t.kind for t in tokenize('attributes["a"] == "\\\\" or attributes["b"] == "b"')]
    assert kinds.count("String") == 4
    trailing = "x\\"
    assert parse_condition('attributes["a"] == ' + ottl_string(trailing)).strings == ["a", trailing]


def test_ottl_number_is_plain_decimal() -> None:
    assert [ottl_number(v) for v in (2.0, 0.5, 0.05, 1e-05, 12.25)] == ["2", "0.5", "0.05", "0.00001", "12.25"]
    with pytest.raises(ValueError):
        ottl_number(float("inf"))


@pytest.mark.parametrize("text", [
    # value expressions from the connector's own test data (testdata/traces/histograms/config.yaml)
    "Milliseconds(end_time - start_time)", "Int(AdjustedCount())", "Microseconds(end_time - start_time)",
    '"1"', "Double(attributes[\"x\"]) * 1000", "-1",
])
def test_ottl_checker_accepts_upstream_value_expressions(text: str) -> None:
    parse_value_expression(text)


@pytest.mark.parametrize("text", [
    'attributes["a"] != nil and not (name == "x" or kind == SPAN_KIND_SERVER)',
    'IsString(attributes["a"]) and attributes["a"] == "\\u00e9"',
    'resource.attributes["service.name"] == "svc"',
    'end_time - start_time > Duration("2s")',
])
def test_ottl_checker_accepts_upstream_conditions(text: str) -> None:
    parse_condition(text)


# -- tenants: the dimension and the tenant-scoped SLOs ------------------------------------------------------

TENANT_SLO = ("ttft=0.5,tpot=0.05; big: ttft=2; @team-a: tpot=0.03,goodput=0.999; big@team-b: e2e=3; "
              "small@team-a: ttft=0.25; @team-c: ttft=9")


class _Attributes(dict):
    def __missing__(self, key: str) -> None:
        return None  # an absent attribute is nil


def _evaluate(condition: str, attributes: dict[str, Any]) -> bool:
    """A span condition of the subset the generator writes (paths, strings, numbers, and/or/not, parens),
    evaluated as OTTL would: the tokens from upstream's lexer, strings unquoted as Go does."""
    from ottl_check import go_unquote

    parse_condition(condition)
    python = []
    for tok in tokenize(condition):
        if tok.kind == "String":
            python.append(repr(go_unquote(tok.text)))
        elif tok.kind == "Nil":
            python.append("None")
        elif tok.kind == "Lowercase" and tok.text == "attributes":
            python.append("A")
        elif tok.kind in ("OpAnd", "OpOr", "OpNot", "OpComparison", "Int", "Float", "LParen", "RParen", "Punct"):
            python.append(tok.text)
        else:
            raise AssertionError(f"{tok} is outside the subset the generator writes")
    return bool(eval(" ".join(python), {"A": _Attributes(attributes)}))  # noqa: S307 - our own tokens only


def test_the_breach_conditions_pick_the_scope_for_request_picks() -> None:
    table = SLOTable.parse(TENANT_SLO)
    conds = next(p for p in generate(ScaleOptions(slo=table), "upstream")["upstream-only.yaml"]["processors"]
                 ["tail_sampling"]["policies"] if p["name"] == "slo_breach")["ottl_condition"]["span"]
    checked = 0
    for model in ("big", "small", "other-model", None):
        for tenant in ("team-a", "team-b", "team-c", "team-z", None):
            for ttft, tpot, e2e in ((0.1, 0.01, 1.0), (0.3, 0.01, 1.0), (1.0, 0.04, 1.0), (3.0, 0.01, 1.0),
                                    (0.1, 0.01, 4.0), (10.0, 0.1, 10.0)):
                attrs = {sc.LATENCY_TTFT: ttft, sc.LATENCY_TPOT: tpot, sc.LATENCY_E2E: e2e}
                if model is not None:
                    attrs[sc.REQUEST_MODEL] = model
                if tenant is not None:
                    attrs[sc.REQUEST_TENANT] = tenant
                summary = RequestSummary(model=model, tenant=tenant, ttft=ttft, tpot=tpot, e2e=e2e)
                expected = bool(table.for_request(model, tenant).breaches(summary))
                matched = [c for c in conds if _evaluate(c, attrs)]
                assert bool(matched) == expected, (model, tenant, ttft, tpot, e2e, matched)
                checked += expected
    assert checked > 20  # the grid breaches in every scope, not only in none


def test_the_tenant_is_a_dimension_of_every_derived_request_metric(tmp_path: Path) -> None:
    for target in TARGETS:
        doc = _cli(tmp_path / target, target, "static", slo=TENANT_SLO)["upstream-only.yaml"]
        assert check_config(doc, RELEASES[target]) == []
        for m in _connector(doc, target)["spans"]:
            assert {"key": sc.REQUEST_TENANT, "optional": True} in m["attributes"], m["name"]
        conds, _ = _ottl(doc, target)
        for c in conds:
            parse_condition(c)
        assert any('attributes["llm.request.tenant"] == "team-a"' in c for c in conds)


def test_the_gateway_tier_keeps_every_tenant_scope_and_goodput_target(tmp_path: Path) -> None:
    files = _cli(tmp_path, "v0.159", "static", slo=TENANT_SLO + "; e2e-only: e2e=0.00001")
    c = CollectorConfig.from_mapping(files["tier2-gateway.yaml"])
    assert c.slo == SLOTable.parse(TENANT_SLO + "; e2e-only: e2e=0.00001")
    assert c.slo.for_request("big", "team-a").goodput == 0.999
