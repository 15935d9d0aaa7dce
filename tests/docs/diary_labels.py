"""What a development-diary label looks like, and where the project's own text is (README, docs, code
comments and docstrings, benchmark scripts and results). Used by test_diary_labels.py."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[2]

LABELS = re.compile("|".join((
    r"\bsession[ _-]?\d",                   # "session 8", "session-7"
    r"(?<![A-Za-z0-9])_?s\d{1,2}(?=[_.-]|\b)(?![.:]\d)(?!\s*(?:µs|us|ms)\b)",  # _s7, s8-engine2, results_s9.json
    r"(?<![\w/&.=:-])#\d{1,3}\b",           # "#12" in prose (not jaeger-ui#645, not &#123;, not a URL)
    r"\bissue[ _-]?\d+",                    # "issue 15", "_issue15_"
    r"\b(?:round|landing|submission) \d+\b",  # "round 7"
    r"\b(?:previous|this|earlier) (?:landing|submission|session)s?\b",
    r"(?<![\w.~])/(?:work|root)/",          # a machine's paths
)), re.IGNORECASE)

TEXT_SUFFIXES = {".md", ".txt", ".json", ".yaml", ".yml", ".toml"}
SOURCE_SUFFIXES = {".py", ".c"}


class Hit(NamedTuple):
    path: str
    line: int
    text: str


def scanned_files() -> Iterator[Path]:
    yield ROOT / "README.md"
    for top in ("docs", "otel_llm", "collector", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES | SOURCE_SUFFIXES and "__pycache__" not in path.parts:
                yield path


def prose(path: Path, text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of what a person reads: a whole text file; a source file's comments and docstrings
    (string literals that are statements) — its other strings are data, not the project's prose."""
    if path.suffix == ".c":
        for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.DOTALL):
            yield text.count("\n", 0, m.start()) + 1, m.group()
        return
    if path.suffix != ".py":
        yield from enumerate(text.splitlines(), 1)
        return
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT,
                                                          tokenize.DEDENT, tokenize.ENCODING):
            yield tok.start[0], tok.string
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type


def labels_in(path: Path, text: str) -> list[Hit]:
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    hits = [Hit(rel, 0, m.group()) for m in LABELS.finditer(path.name)]
    for start, chunk in prose(path, text):
        for m in LABELS.finditer(chunk):
            hits.append(Hit(rel, start + chunk.count("\n", 0, m.start()), m.group()))
    return hits


def all_labels() -> list[Hit]:
    out = []
    for path in scanned_files():
        out += labels_in(path, path.read_text(encoding="utf-8", errors="replace"))
    return out
