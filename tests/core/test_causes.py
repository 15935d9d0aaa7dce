"""The slow causes are declared once (core/diagnosis/causes.py): every place that lists them is that list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from otel_llm import semconv as sc
from otel_llm.core import metrics
from otel_llm.core.diagnosis import causes
from otel_llm.core.diagnosis.verdict import SlowVerdict

ROOT = Path(__file__).resolve().parents[2]


def test_semconv_names_the_declared_causes_in_their_order():
    assert sc.SLOW_CAUSES == causes.NAMES
    assert {c: sc.SLOW_SECONDS[c] for c in causes.NAMES} == {c.name: c.attribute for c in causes.CAUSES}
    assert len(set(causes.NAMES)) == len(causes.NAMES) and causes.NAMES[-1] == sc.SLOW_UNKNOWN
    for c in causes.CAUSES:
        assert c.objectives and set(c.objectives) <= {"ttft", "tpot", "e2e"} and c.summary and c.formula


def test_the_verdict_and_the_breach_counter_carry_every_declared_cause():
    attrs = SlowVerdict(sc.SLOW_UNKNOWN, {}).attributes()
    assert set(attrs) == {sc.SLOW_CAUSE} | {c.attribute for c in causes.CAUSES}
    for name in causes.NAMES:  # each is a label value the counter keeps; anything else is unknown
        assert metrics.breach_attributes({}, "ttft", name)[sc.SLOW_CAUSE] == name
    assert metrics.breach_attributes({}, "ttft", "made-up")[sc.SLOW_CAUSE] == sc.SLOW_UNKNOWN


def test_the_docs_table_the_report_legend_and_the_dashboard_are_generated_from_it():
    doc = (ROOT / "docs" / "verdict.md").read_text(encoding="utf-8")
    region = re.search(r"<!-- generated: slow-causes [^\n]*-->\n(.*?)<!-- end generated: slow-causes -->", doc, re.S)
    assert region is not None and region.group(1).strip() == causes.causes_table()
    dashboard = (ROOT / "dashboards" / "otel-llm.json").read_text(encoding="utf-8")
    for c in causes.CAUSES:
        assert f"{c.name}: {c.summary}." in dashboard, c.name

    from otel_llm.views.html import _causes
    from otel_llm.views.timeline import Lane, Timeline

    lanes = [Lane("k", "t", "s", [], set(), "", c) for c in causes.NAMES]
    t = Timeline.__new__(Timeline)
    t.requests = lanes
    text = _causes(t)
    for c in causes.CAUSES:
        assert f"<dt>{c.name}</dt>" in text


def test_a_cause_with_a_floor_states_it_and_its_reason_in_the_docs_table():
    table = causes.causes_table()
    for c in causes.CAUSES:
        assert c.floor >= 0 and bool(c.floor) == bool(c.floor_reason), c.name
        if c.floor:
            assert f"excess over {c.floor * 1000:g} ms ({c.floor_reason})" in table


def test_no_other_module_lists_the_causes_by_hand():
    """A cause's name is typed in semconv.py only (a list of them in causes.py only). (The one-word names,
    ``frontend`` and ``unknown``, are ordinary words elsewhere: the compound ones are searched.)"""
    pattern = re.compile("|".join(rf"[\"']{re.escape(n)}[\"']" for n in causes.NAMES if "_" in n))
    found = []
    for path in (ROOT / "otel_llm").rglob("*.py"):
        if path.name == "semconv.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}")
    assert found == []


def test_the_declaration_imports_nothing_heavy():
    """Alert rules and annotations read it without the SDK or vLLM."""
    code = ("import sys; import otel_llm.core.diagnosis.causes as c; "
            "heavy = [m for m in ('opentelemetry', 'opentelemetry.sdk', 'vllm', 'torch') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
