"""Names, units and defaults are declared once: the README's tables are generated from the declarations,
no module retypes a name of the trace contract, and ``Config``'s defaults are the options table's."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from otel_llm import semconv
from otel_llm.core import config, metrics, readme_tables, self_metrics, trace_contract
from otel_llm.core.client_metrics import CLIENT_METRICS, CLIENT_METRICS_LATEST

ROOT = Path(__file__).resolve().parents[2]

# Where names are declared: the trace contract's attribute, span and event names (semconv), the
# metric tables (metrics: server, engine-step and GPU instruments; self_metrics: otel-llm's own
# counters and the collector's self-telemetry). Any other module refers to these constants.
DECLARATIONS = {ROOT / "otel_llm/semconv.py", ROOT / "otel_llm/core/metrics.py",
                ROOT / "otel_llm/core/self_metrics.py"}


def declared_names() -> set[str]:
    """Every dotted name the declaration modules hold: attributes, spans, events, metrics."""
    names = {v for v in vars(semconv).values() if isinstance(v, str) and "." in v}
    names |= set(semconv.SLOW_SECONDS.values())
    for metric_set in (metrics.SERVER_METRICS, CLIENT_METRICS, CLIENT_METRICS_LATEST):
        inter_token = (metric_set.inter_token,) if metric_set.inter_token is not None else ()
        names |= {s.name for s in (*metric_set.histograms, *inter_token, *metric_set.instruments())}
    names |= {s.name for s in (*metrics.STEP_METRICS, *metrics.GPU_METRICS, *self_metrics.SELF_METRICS)}
    names |= {self_metrics.STATE, self_metrics.SITE}
    return names


def literals_named(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, value) of each string constant in ``source`` that is exactly one of ``names``."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_no_module_retypes_a_declared_name():
    names = declared_names()
    assert len(names) > 150  # the set is the real one (semconv alone declares well over a hundred)
    found = []
    for path in sorted([*ROOT.glob("otel_llm/**/*.py"), *ROOT.glob("collector/**/*.py")]):
        if path in DECLARATIONS:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {value!r}"
                  for line, value in literals_named(path.read_text(encoding="utf-8"), names)]
    assert not found, "use the declared constant instead of the string:\n" + "\n".join(found)


def test_the_grep_finds_a_retyped_name():
    """The check above can fail: a literal equal to a declared name is found, prose mentioning it is not."""
    source = f'x = {{"{semconv.LATENCY_TTFT}": 1}}\n"""a docstring naming {semconv.LATENCY_TTFT}"""\n'
    assert literals_named(source, declared_names()) == [(1, semconv.LATENCY_TTFT)]


def test_readme_tables_are_the_generated_ones():
    """Byte for byte: ``python -m otel_llm.core.readme_tables --write``
    changes nothing, and every table has its region in one of its files."""
    found = []
    for name in readme_tables.FILES:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert readme_tables.regenerate(text) == text, f"regenerate them: {readme_tables.COMMAND}"
        found += readme_tables.regions(text)
    assert sorted(found) == sorted(readme_tables.TABLES)
    assert readme_tables.main(["--check", *(str(ROOT / name) for name in readme_tables.FILES)]) == 0


def test_a_stale_readme_table_is_caught(tmp_path):
    readme = (ROOT / "docs" / "trace-contract.md").read_text(encoding="utf-8")
    stale = tmp_path / "trace-contract.md"
    stale.write_text(readme.replace(f"`{semconv.SPAN_QUEUE}` |", "`llm.wait` |", 1), encoding="utf-8")
    assert readme_tables.main(["--check", str(stale)]) == 1
    assert readme_tables.main(["--write", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == readme


def test_trace_contract_names_are_declared():
    names = declared_names()
    for span in trace_contract.SPANS:
        assert set(span.names) <= names
        assert set(span.attribute_names()) <= names
        assert {i.name for i in span.items if i.event} <= names


def test_config_defaults_are_the_options_table():
    fields = dataclasses.fields(config.Config)
    assert [f.name for f in fields] == [o.name for o in config.OPTIONS]
    assert all(f.default is o.default for f, o in zip(fields, config.OPTIONS))
    assert config.Config() == config.Config.resolve(environ={})


def test_emitted_spans_carry_only_what_the_contract_declares():
    """The pipeline's spans (full detail: chunks, decode steps and windows, a preemption, an SLO breach,
    an abort, engine steps, content capture, a request with n = 2 choices) hold no attribute or event their contract row lacks: a
    new attribute needs its row, so the README's table stays the truth."""
    from test_core import Harness  # the pipeline on constructed timelines

    rows = {name: row for row in trace_contract.SERVER_SPANS for name in row.names}
    h = Harness(sample_rate=1.0, baseline_detail="steps", slo="ttft=0.01", capture_content=True)
    h.request("r1", tokens=8, chunks=[(0.01, 0.03, 64), (0.03, 0.06, 36)], preempt_at=0.02,
              gaps=[0.01, 0.01, 0.2, 0.01, 0.01, 0.01, 0.01])
    h.request("r2", tokens=3, error="aborted")
    from otel_llm.core.timeline import RequestGroup  # n = 2: a request span over two llm.choice spans

    group = RequestGroup("g", choice_count=2, expected=2)
    h.request("0_g", tokens=3, group=group, index=0)
    h.request("1_g", tokens=3, group=group, index=1)
    spans = h.spans()
    seen = set()
    for span in spans:
        row = rows.get(span.name, trace_contract.REQUEST_SPAN if span.parent is None and
                       not span.name.startswith("llm.") else None)
        assert row is not None, f"{span.name}: no row in core/trace_contract.py"
        seen.add(row)
        extra = set(span.attributes) - set(row.attribute_names())
        assert not extra, f"{span.name} carries {sorted(extra)}: add them to its row in core/trace_contract.py"
        events = {e.name for e in span.events} - set(row.event_names())
        assert not events, f"{span.name} has events {sorted(events)} its row lacks"
    # the check saw every kind of server span in the contract (so it cannot pass by seeing none);
    # the client span's row is held to the openai adapter's spans in tests/openai/test_client_contract.py
    assert seen == set(trace_contract.SERVER_SPANS)


def gateway_metric_keys(source: str) -> list[tuple[int, str]]:
    """(line, name) of each ``<x>.inc("name", ...)`` / ``<x>.set("name", ...)`` call: how the collector
    names its own metrics (GatewayMetrics looks the name up in self_metrics.GATEWAY_METRICS)."""
    return [(node.lineno, node.args[0].value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("inc", "set")
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]


def test_the_collector_counts_only_declared_self_metrics():
    """The collector's ~40 ``telemetry.inc("receiver_bad_requests", ...)`` sites key the core's table by
    name (or the collector's own tables: the upstream Collector's names, the metrics and logs pipelines'
    series); a name the tables lack would raise only when that path runs, so check them all here."""
    from otel_llm_collector import telemetry

    declared = {g.name for g in self_metrics.GATEWAY_METRICS} | {s.name for s in telemetry.SPECS} \
        | set(telemetry.UPSTREAM_NAMES)
    found = {}
    for path in sorted(ROOT.glob("collector/**/*.py")):
        for line, name in gateway_metric_keys(path.read_text(encoding="utf-8")):
            found[f"{path.relative_to(ROOT)}:{line}"] = name
    assert len(found) > 20  # the scan sees the call sites
    unknown = {where: name for where, name in found.items() if name not in declared}
    assert not unknown, f"not in self_metrics.GATEWAY_METRICS: {unknown}"
    assert gateway_metric_keys('t.inc("no_such_metric", 1, reason="x")\n') == [(1, "no_such_metric")]
