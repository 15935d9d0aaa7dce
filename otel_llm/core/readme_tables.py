"""The reference tables of the README and the docs, generated from the declarations the code runs on.

``python -m otel_llm.core.readme_tables`` prints them; ``--write`` replaces each generated region of
the files that hold them (``FILES``, or the files named; between ``<!-- generated: NAME ... -->`` and
``<!-- end generated: NAME -->``) with its table; ``--check`` exits 1 when one differs (a test does
the same). Tables:

* ``options``: ``config.OPTIONS`` (argument, variable, default, meaning);
* ``trace-contract``: ``trace_contract.SPANS`` (span names and attributes are ``semconv``'s);
* ``metrics``: the server metric set (``metrics.SERVER_METRICS``);
* ``client-metrics``: the openai client's metric set (``client_metrics.CLIENT_METRICS``) and the
  collector's client overhead (``metrics.CLIENT_OVERHEAD``);
* ``client-metrics-latest``: the client's set under ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``
  (``client_metrics.CLIENT_METRICS_LATEST``);
* ``step-metrics``: the engine-step and GPU instruments (``metrics.STEP_METRICS``, ``metrics.GPU_METRICS``);
* ``self-metrics``: otel-llm's own health counters (``self_metrics.SELF_METRICS``);
* ``gateway-metrics`` (docs/collector.md): the collector's own telemetry (``self_metrics.GATEWAY_METRICS``);
* ``slow-causes`` (docs/verdict.md): the slow-cause verdict's causes (``diagnosis.causes.CAUSES``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Iterable

from . import metrics as m
from . import self_metrics as sm
from .client_metrics import CLIENT_METRICS, CLIENT_METRICS_LATEST
from .config import options_table
from .diagnosis.causes import causes_table
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
        rows.append(f"| `{s.name}` | {s.kind} | `{s.unit}` | {_buckets(s.buckets)} | {_names(s.attributes)} | "
                    f"{s.description} |")
    return "\n".join(rows)


def metrics_table(metric_set: m.MetricSet = m.SERVER_METRICS) -> str:
    inter_token = (metric_set.inter_token,) if metric_set.inter_token is not None else ()
    return instruments_table((*metric_set.histograms, *inter_token, *metric_set.instruments()),
                             "attributes (beyond the request's)")


def client_metrics_table() -> str:
    per_chunk = (CLIENT_METRICS.inter_token,) if CLIENT_METRICS.inter_token is not None else ()
    return instruments_table((*CLIENT_METRICS.histograms, *per_chunk, *CLIENT_METRICS.instruments(),
                              m.CLIENT_OVERHEAD),
                             "attributes (beyond the call's)")


def client_metrics_latest_table() -> str:
    latest = CLIENT_METRICS_LATEST
    per_chunk = (latest.inter_token,) if latest.inter_token is not None else ()
    return instruments_table((*latest.histograms, *per_chunk, *latest.instruments()), "attributes (beyond the call's)")


def step_metrics_table() -> str:
    return instruments_table((*m.STEP_METRICS, *m.GPU_METRICS), "attributes")


def self_metrics_table() -> str:
    return instruments_table(sm.SELF_METRICS, "attributes")


def gateway_metrics_table() -> str:
    rows = ["| name | type | labels | description |", "|---|---|---|---|"]
    for g in sm.GATEWAY_METRICS:
        rows.append(f"| `{sm.gateway_metric(g.name)}` | {g.kind} | {_names(g.labels)} | {g.doc} |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[], str]] = {
    "options": options_table,
    "trace-contract": spans_table,
    "metrics": metrics_table,
    "client-metrics": client_metrics_table,
    "client-metrics-latest": client_metrics_latest_table,
    "step-metrics": step_metrics_table,
    "self-metrics": self_metrics_table,
    "gateway-metrics": gateway_metrics_table,
    "slow-causes": causes_table,
}
# relative to the repository root; each table lives with the section that explains it
FILES = ("README.md", "docs/trace-contract.md", "docs/metrics.md", "docs/engine-steps.md", "docs/client.md",
         "docs/export.md", "docs/collector.md", "docs/verdict.md")
COMMAND = "python -m otel_llm.core.readme_tables --write"


def _region(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(rf"(<!-- generated: {n} [^\n]*-->\n)(.*?)(<!-- end generated: {n} -->)", re.DOTALL)


def regions(text: str) -> list[str]:
    """The names of the generated regions ``text`` holds (an unknown name is an error)."""
    found = re.findall(r"<!-- generated: (\S+) ", text)
    unknown = set(found) - set(TABLES)
    if unknown:
        raise ValueError(f"unknown generated region(s): {', '.join(sorted(unknown))}")
    return found


def regenerate(text: str) -> str:
    """``text`` with each of its generated regions holding the current table."""
    for name in regions(text):
        pattern = _region(name)
        if not pattern.search(text):
            raise ValueError(f"generated region {name!r} has no end (<!-- end generated: {name} -->)")
        text = pattern.sub(lambda match: match.group(1) + TABLES[name]() + "\n" + match.group(3), text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_llm.core.readme_tables", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE", nargs="*", help="rewrite the generated regions (default: FILES)")
    group.add_argument("--check", metavar="FILE", nargs="*", help="exit 1 if a generated region differs")
    args = parser.parse_args(argv)
    if args.write is not None or args.check is not None:
        stale = 0
        root = Path(__file__).resolve().parents[2]
        for path in map(Path, args.write or args.check or [str(root / name) for name in FILES]):
            text = path.read_text(encoding="utf-8")
            new = regenerate(text)
            if new != text and args.check:
                print(f"{path}: generated tables are stale; run {COMMAND}", file=sys.stderr)
                stale = 1
            elif new != text:
                path.write_text(new, encoding="utf-8")
        return stale
    for name, table in TABLES.items():
        print(f"{name}:\n{table()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
