"""The house's floors, as the imports draw them: ``guard`` and ``semconv`` below everything, the core
below the OTLP layer. No module under otel_llm/core imports otel_llm.otlp (the instrumentors hand the
OTLP router to the pipeline), so the core runs, and is tested, without the wire."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "otel_llm"


def imported(path: Path) -> set[str]:
    """The absolute names of the otel_llm modules one file imports (relative imports resolved)."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return {n for n in out if n == "otel_llm" or n.startswith("otel_llm.")}


def test_no_core_module_imports_the_otlp_layer():
    found = sorted(f"{p.relative_to(ROOT)}: {n}" for p in (PACKAGE / "core").rglob("*.py")
                   for n in imported(p) if n == "otel_llm.otlp" or n.startswith("otel_llm.otlp."))
    assert found == []


def test_guard_and_semconv_import_nothing_of_ours():
    for name in ("guard.py", "semconv.py"):
        assert imported(PACKAGE / name) == set(), name


def test_the_import_reader_sees_relative_imports():
    """(So the tests above cannot pass by reading nothing.)"""
    names = imported(PACKAGE / "otlp" / "routes.py")
    assert "otel_llm.core.span_routes" in names and "otel_llm.otlp.direct_export" in names
    assert "otel_llm.semconv" in names
