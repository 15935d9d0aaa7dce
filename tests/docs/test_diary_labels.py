"""The project speaks of itself only: no development-diary labels (numbered sessions or rounds, earlier
submissions, issue numbers, ``_sN`` suffixes) in the README, the docs, code comments and docstrings,
benchmark scripts or their results."""

from __future__ import annotations

from pathlib import Path

import diary_labels as dl

# Files owned by another change that will clean them: each entry names the exact labels it may still hold.
PENDING: set[tuple[str, str]] = set()  # (path, label) pairs allowed for now; empty: none


def test_no_diary_labels():
    hits = [h for h in dl.all_labels() if (h.path, h.text) not in PENDING]
    assert not hits, "development-diary labels:\n" + "\n".join(f"{h.path}:{h.line}: {h.text}" for h in hits)


def test_the_scan_finds_each_kind_of_label(tmp_path):
    text = ("# Cost\nMeasured in session 8 (results/engine_hooks_ab_s8.json), see #12 and issue 15;\n"
            "round 7 beat the previous landing, in /work/main.\n")
    found = [h.text.lower() for h in dl.labels_in(tmp_path / "notes_s9.md", text)]
    assert found == ["s9", "session 8", "s8", "#12", "issue 15", "round 7", "previous landing", "/work/"]


def test_the_scan_reads_comments_and_docstrings_not_data(tmp_path):
    source = ('"""Docstring: fixed in issue 4."""\n'
              'COLOURS = {"grid": "#333"}  # from session 2\n'
              'URL = "https://github.com/x/y/issues/12#123"\n')
    found = [(h.line, h.text) for h in dl.labels_in(tmp_path / "module.py", source)]
    assert found == [(1, "issue 4"), (2, "session 2")]


def test_upstream_references_and_units_are_not_labels(tmp_path):
    text = ("jaeger-ui#645, contrib PR #45714, 4.5 µs a step, 10 s, 0.5 s, "
            "an HTML entity &#123;, https://example.com/page#12\n")
    assert [h.text for h in dl.labels_in(tmp_path / "page.md", text)] == []


def test_pending_entries_still_apply():
    """An entry that no longer matches anything is stale: remove it."""
    hits = {(h.path, h.text) for h in dl.all_labels()}
    for entry in PENDING:
        if (dl.ROOT / entry[0]).exists():
            assert entry in hits, f"{entry} no longer holds that label: remove it from PENDING"
