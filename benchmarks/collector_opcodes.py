"""Python work per span of the gateway's receive path, by stage, counted instead of timed.

    .venv/bin/python benchmarks/collector_opcodes.py [--root OTHER_CHECKOUT] [--shape 1] [--requests 2]

On a shared, loaded machine CPU time per span moves by +-20% between runs, more than most single changes to
the receive path save; the number of Python bytecode instructions executed and Python function calls made
per span does not move at all (the same inputs take the same path). So this counts them, per stage
(``extract``: reading the request through the view and the request summaries; ``metrics``:
``llm_metrics.process``; ``add``: buffering in the tail sampler; ``tick``: the decisions), with
``sys.settrace`` opcode events, over the same requests as ``collector_throughput.py`` (fresh trace ids, a fresh
gateway). It says nothing about time spent in C (upb's parse, dict and set operations, the GIL): use it to
compare two checkouts' Python-level work, and ``collector_throughput.py`` for what a span costs.
Prints one JSON line; ``--root`` measures another checkout (e.g. ``git archive main``) with this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--root" in sys.argv:
    ROOT = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "collector"))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from collector_throughput import NullExporter, build_requests, config  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from otel_llm_collector import spans as spans_mod  # noqa: E402
from otel_llm_collector.gateway import Gateway  # noqa: E402


class Counter:
    """Counts opcodes and calls of Python frames while active (``sys.settrace``: this thread only)."""

    def __init__(self) -> None:
        self.opcodes = 0
        self.calls = 0

    def _trace(self, frame, event, arg):  # noqa: ANN001 - the settrace protocol
        if event == "call":
            self.calls += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            self.opcodes += 1
        return self._trace

    def __enter__(self) -> "Counter":
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", help="measure another checkout's collector and core")
    ap.add_argument("--shape", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2, help="export requests of ~1000 spans")
    args = ap.parse_args()
    payloads = build_requests(args.shape, args.requests + 1, seed=args.shape)
    g = Gateway(config(None), manual_ticks=True)
    g.exporters = [NullExporter()]
    stages = {name: Counter() for name in ("extract", "metrics", "add", "tick")}
    keys = getattr(g, "_keys", frozenset())
    spans = 0
    for n, p in enumerate(payloads):
        warm = n == 0  # the first request fills the caches (label sets, plans, decoders): not counted
        with (stages["extract"] if not warm else Counter()):
            batch = spans_mod.extract(ExportTraceServiceRequest.FromString(p), p, keys)
        with (stages["metrics"] if not warm else Counter()):
            g.metrics.process(batch.requests)
        with (stages["add"] if not warm else Counter()):
            g.sampler.add(batch)
        with (stages["tick"] if not warm else Counter()):
            g.sampler.tick()
        if not warm:
            spans += len(batch.spans)
    g.exporters = []
    g.shutdown()
    out = {"root": str(ROOT), "shape": args.shape, "spans": spans,
           "opcodes_per_span": {k: round(c.opcodes / spans, 1) for k, c in stages.items()},
           "calls_per_span": {k: round(c.calls / spans, 2) for k, c in stages.items()}}
    out["opcodes_per_span"]["total"] = round(sum(c.opcodes for c in stages.values()) / spans, 1)
    out["calls_per_span"]["total"] = round(sum(c.calls for c in stages.values()) / spans, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
