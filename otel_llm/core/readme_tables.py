"""The README's reference tables, generated from the declarations the code runs on.

``python -m otel_llm.core.readme_tables`` prints them; ``--write README.md`` replaces each generated
region of the README (between ``<!-- generated: NAME ... -->`` and ``<!-- end generated: NAME -->``)
with its table; ``--check README.md`` exits 1 when one differs (a test does the same). Tables:

* ``options``: ``config.OPTIONS`` (argument, variable, default, meaning);
* ``trace-contract``: ``trace_contract.SPANS`` (span names and attributes are ``semconv``'s);
* ``metrics``: the server metric set (``metrics.SERVER_METRICS``);
* ``step-metrics``: the engine-step and GPU instruments (``metrics.STEP_METRICS``, ``metrics.GPU_METRICS``);
* ``self-metrics``: otel-llm's own health counters (``self_metrics.SELF_METRICS``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Iterable

from . import metrics as m
from . import self_metrics as sm
from .config import options_table
from .trace_contract import spans_table


def _number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _buckets(b: tuple[float, ...]) -> str:
    return f"{_number(b[0])} … {_number(b[-1])} ({len(b)} boundaries)" if b else ""


def _names(attributes: Iterable[str]) -> str:
    return ", ".join(f"`{a}`" for a in attributes)


def instruments_table(specs: Iterable[m.InstrumentSpec | m.HistogramSpec], attributes_title: str) -> str:
    rows = [f"| name | instrument | unit | buckets | {attributes_title} | description |", "|---|---|---|---|---|---|"]
    for s in specs:
        kind = getattr(s, "kind", "histogram")
        rows.append(f"| `{s.name}` | {kind} | `{s.unit}` | {_buckets(s.buckets)} | "
                    f"{_names(getattr(s, 'attributes', ()))} | {s.description} |")
    return "\n".join(rows)


def metrics_table(metric_set: m.MetricSet = m.SERVER_METRICS) -> str:
    return instruments_table((*metric_set.histograms, *metric_set.instruments()), "attributes (beyond the request's)")


def step_metrics_table() -> str:
    return instruments_table((*m.STEP_METRICS, *m.GPU_METRICS), "attributes")


def self_metrics_table() -> str:
    return instruments_table(sm.SELF_METRICS, "attributes")


TABLES: dict[str, Callable[[], str]] = {
    "options": options_table,
    "trace-contract": spans_table,
    "metrics": metrics_table,
    "step-metrics": step_metrics_table,
    "self-metrics": self_metrics_table,
}
COMMAND = "python -m otel_llm.core.readme_tables --write README.md"


def _region(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {re.escape(name)} [^\n]*-->\n)(.*?)(<!-- end generated: {re.escape(name)} -->)",
                      re.DOTALL)


def regenerate(text: str) -> str:
    """``text`` with every generated region holding its current table; a region missing is an error."""
    for name, table in TABLES.items():
        pattern = _region(name)
        if not pattern.search(text):
            raise ValueError(f"no generated region {name!r} (<!-- generated: {name} ... --> ... "
                             f"<!-- end generated: {name} -->)")
        text = pattern.sub(lambda match: match.group(1) + table() + "\n" + match.group(3), text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_llm.core.readme_tables", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="README", help="rewrite the generated regions of this file")
    group.add_argument("--check", metavar="README", help="exit 1 if a generated region differs")
    args = parser.parse_args(argv)
    if args.write or args.check:
        path = Path(args.write or args.check)
        text = path.read_text(encoding="utf-8")
        new = regenerate(text)
        if args.check:
            if new != text:
                print(f"{path}: generated tables are stale; run {COMMAND}", file=sys.stderr)
                return 1
            return 0
        if new != text:
            path.write_text(new, encoding="utf-8")
        return 0
    for name, table in TABLES.items():
        print(f"{name}:\n{table()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
