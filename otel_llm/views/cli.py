"""The ``otel-llm`` command: ``otel-llm report FILE [-o OUT] [--perfetto OUT] [--top N] [--cause C]
[--breached OBJ] [--slo SLO]``, ``otel-llm dashboard [--out DIR]`` (regenerates the committed Grafana
dashboard and provisioning) and ``otel-llm alerts --slo SLO [--out DIR|FILE] [--source S]`` (Prometheus rule
files: burn-rate alerts from the SLO table)."""

from __future__ import annotations

import argparse
import sys

from .. import semconv as sc
from ..core.diagnosis.causes import NAMES as CAUSES


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (the number of requests to draw), not {value}")
    return value


def slo_seconds(text: str) -> dict[str, float]:
    """``ttft=0.5,tpot=0.05``: the SLOs the trace was judged against (a trace does not carry them)."""
    from ..core.slo import SLO

    try:
        slo = SLO.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return {k: v for k, v in (("ttft", slo.ttft), ("tpot", slo.tpot), ("e2e", slo.e2e)) if v is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="otel-llm", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="timeline of the slowest requests from an OTLP/JSON trace file")
    rep.add_argument("file", help="OTLP/JSON trace file (one export request per line), e.g. out/demo-traces.jsonl")
    rep.add_argument("-o", "--out", help="HTML page to write (default: FILE with .html)")
    rep.add_argument("--perfetto", metavar="OUT", help="also write the lanes as Chrome trace JSON (opens in Perfetto)")
    rep.add_argument("--top", type=positive_int, default=8, help="how many of the slowest requests to draw (default 8)")
    rep.add_argument("--cause", choices=CAUSES, help="only requests with this verdict (llm.slow.cause)")
    rep.add_argument("--breached", choices=("ttft", "tpot", "e2e"), help="only requests that breached this objective")
    rep.add_argument("--slo", type=slo_seconds, help="the SLOs the trace was judged against, shown beside each "
                                                       "breached objective (e.g. ttft=0.5,tpot=0.05)")
    dash = sub.add_parser("dashboard", help="regenerate the Grafana dashboard JSON and provisioning files")
    dash.add_argument("--out", default="dashboards", help="directory to write into (default: dashboards)")
    al = sub.add_parser("alerts", help="write Prometheus recording and burn-rate alert rules from the SLO table")
    al.add_argument("--slo", default=None, help="the SLO table, with goodput targets (default: OTEL_LLM_SLO), e.g. "
                                                "'ttft=0.5,tpot=0.05,goodput=0.99; @team-a: tpot=0.03,goodput=0.999'")
    al.add_argument("--out", default="alerts", help="directory (or .yml file) to write (default: alerts)")
    al.add_argument("--source", default="otel-llm", choices=("otel-llm", "upstream"),
                    help="whose metrics: otel-llm (the SDK's or otel-llm-collector's; default) or upstream (the "
                         "upstream Collector's signal_to_metrics pipeline: goodput only, no cause)")
    al.add_argument("--grafana-url", default="http://grafana:3000", help="Grafana base URL for the dashboard link")
    args = ap.parse_args(argv)

    if args.command == "alerts":
        import os

        from ..core.slo import SLOTable
        from .alerts import write

        text = args.slo if args.slo is not None else os.environ.get("OTEL_LLM_SLO", "")
        try:
            path = write(SLOTable.parse(text), args.out, args.source, args.grafana_url)
        except (OSError, ValueError) as exc:
            print(f"otel-llm alerts: {exc}", file=sys.stderr)
            return 1
        except ImportError as exc:
            print(f"otel-llm alerts: {exc}; install `pip install 'otel-llm[views]'`", file=sys.stderr)
            return 1
        print(path)
        return 0

    if args.command == "report":
        from .report import write_report
        from .traces import TraceFileError

        try:
            written = write_report(args.file, args.out, args.perfetto, args.top, args.cause, args.breached, args.slo)
        except (OSError, ValueError, TraceFileError) as exc:
            print(f"otel-llm report: {exc}", file=sys.stderr)
            return 1
        t = written.timeline
        chosen = t.selection.describe() if t.selection is not None else ""
        print(f"{written.html}: {len(t.requests)} slowest of {t.total_requests} requests"
              + (f" ({chosen})" if chosen else "") + ", "
              f"{sum(len(e.segments) for e in t.engines)} engine steps")
        if written.perfetto:
            print(f"{written.perfetto}: Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing)")
        return 0
    try:
        from .dashboard import write_all
    except ImportError as exc:  # the generator reads the collector's metric tables and Grafana's SDK
        print(f"otel-llm dashboard: {exc}; install `pip install -e './collector' -e '.[views]'`", file=sys.stderr)
        return 1

    for path in write_all(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
