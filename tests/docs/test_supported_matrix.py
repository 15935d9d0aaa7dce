"""The supported matrix of docs/architecture.md names, per row, the real-engine tests that hold it: each
named test exists (a function or a name bound at its module's top level) in a module that runs a real engine
(marked ``engine``), and a row without one says so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BEGIN, _END = "<!-- supported-matrix: begin -->", "<!-- supported-matrix: end -->"
_NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert _BEGIN in text and _END in text, "the supported matrix lost its markers"
    table = text.split(_BEGIN, 1)[1].split(_END, 1)[0]
    return [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| configuration")]


def _top_level_names(path: Path) -> tuple[set[str], bool]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    engine = "pytest.mark.engine" in path.read_text(encoding="utf-8")
    return names, engine


def test_every_row_names_existing_real_engine_tests_or_says_it_has_none():
    rows = _rows()
    assert len(rows) >= 9
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 3, row
        named = _NAMED.findall(cells[2])
        if not named:
            assert cells[2].startswith("no real-engine test"), f"a row without a test must say so: {row}"
            continue
        for file, test in named:
            path = ROOT / file
            assert path.is_file(), f"{file} (named in the supported matrix) does not exist"
            names, engine = _top_level_names(path)
            assert test in names, f"{file}::{test} (named in the supported matrix) does not exist"
            assert test.startswith("test_"), f"{file}::{test} is not a test"
            assert engine, f"{file} runs no real engine (no pytest.mark.engine)"


def test_the_rows_the_issue_asks_for_are_there():
    text = "\n".join(_rows())
    for configuration in ("offline `LLM`", "`AsyncLLM`", "`vllm serve`", "Rust frontend", "--headless",
                          "custom providers", "speculative decoding", "KV connectors", "non-x86 channels"):
        assert configuration in text, configuration
