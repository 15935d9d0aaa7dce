"""``otel-llm report FILE``: an OTLP/JSON trace file -> a self-contained HTML timeline (and a Chrome trace)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from . import chrome_trace, curves, html
from .timeline import Selection, Timeline, build
from .traces import read_spans


@dataclass(frozen=True)
class Written:
    html: Path
    perfetto: Path | None
    timeline: Timeline


def write_report(trace_file: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 perfetto: str | os.PathLike[str] | None = None, top: int = 8, cause: str | None = None,
                 breached: str | None = None, slo: Mapping[str, float] | None = None) -> Written:
    """Read ``trace_file`` and write the HTML page to ``out`` (default: beside it, ``.html``), and the
    Chrome trace JSON to ``perfetto`` when given: the ``top`` slowest requests, of those with verdict
    ``cause`` and breached objective ``breached`` when given; ``slo`` (objective -> seconds) is shown
    beside breached objectives. Raises ``ValueError`` for a bad selection (before reading anything)
    and ``TraceFileError`` for a file it cannot read."""
    select = Selection(top, cause, breached)
    source = Path(trace_file)
    spans = read_spans(source)
    timeline = build(spans, select=select, slo=slo)
    out_path = Path(out) if out is not None else source.with_suffix(".html")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(html.render(timeline, source.name, curves.build(spans)), encoding="utf-8")
    trace_path = None
    if perfetto is not None:
        trace_path = Path(perfetto)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        trace_path.write_text(chrome_trace.dumps(timeline), encoding="utf-8")
    return Written(out_path, trace_path, timeline)
