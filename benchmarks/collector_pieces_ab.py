"""Pieces of the gateway's receive path, this checkout against another, in ONE process, interleaved rounds.

    .venv/bin/python benchmarks/collector_pieces_ab.py --root OTHER_CHECKOUT [--rounds 15] [--out FILE]

On the shared 2-core machine a whole-gateway A/B (collector_throughput.py --root, one process per side) moves
by +-20% between runs, more than a single change saves. This loads the same few modules from both checkouts
side by side (by file path, under other names) and times each piece on the same inputs in alternating
rounds; CPU time per item, min and median of the rounds. Pieces whose modules load standalone:

* ``histogram_add_*``: a bound histogram recorder (``aggregation``'s ``bind_many``) taking batches of 1, 8
  and 1000 values: us per value.
* ``sketch_add_above``: the tail policy's ``QuantileSketch.add_above`` (``core/quantile.py``), p99 of a
  lognormal with the gateway's window: us per call.
* ``summary_reader``: ``fast/summary.py``'s reader over shape-1 request spans' attribute maps (the view's
  parse subtracted): us per span.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "collector"))
sys.path.insert(0, str(HERE / "benchmarks"))

from collector_throughput import build_requests  # noqa: E402
from otel_llm.otlp.view import RequestView, SpanView, value_of  # noqa: E402
from otel_llm_collector.spans import TYPED  # noqa: E402


def load(root: Path, relative: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, root / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def pieces(root: Path, tag: str) -> dict[str, Callable[[], float]]:
    """name -> a function running the piece once over its inputs, returning CPU us per item."""
    agg = load(root, "collector/otel_llm_collector/aggregation.py", f"_ab_aggregation_{tag}")
    quantile = load(root, "otel_llm/core/quantile.py", f"_ab_quantile_{tag}")
    summary = load(root, "collector/otel_llm_collector/fast/summary.py", f"_ab_summary_{tag}")
    rng = random.Random(1)
    out: dict[str, Callable[[], float]] = {}
    for size in (1, 8, 1000):
        batches = [[rng.lognormvariate(-1, 1) for _ in range(size)] for _ in range(max(1, 20000 // size))]

        def histogram(batches: list = batches) -> float:
            h = agg.AggregationBackend().get_meter("m").create_histogram(
                "h", explicit_bucket_boundaries_advisory=[0.01 * 2 ** i for i in range(15)])
            record = h.bind_many({"a": 1})
            t0 = time.process_time()
            for b in batches:
                record(b)
            return (time.process_time() - t0) / sum(map(len, batches)) * 1e6
        out[f"histogram_add_{size}_us_per_value"] = histogram
    values = [rng.lognormvariate(0, 0.5) for _ in range(20000)]

    def sketch() -> float:
        s = quantile.QuantileSketch(0.01, window=10_000)
        t0 = time.process_time()
        for v in values:
            s.add_above(v, 0.99, 50)
        return (time.process_time() - t0) / len(values) * 1e6
    out["sketch_add_above_us_per_call"] = sketch
    read = summary.summary_reader(value_of, TYPED)
    spans = [s for p in build_requests(1, 4) for rs in RequestView.FromString(p).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    parse = SpanView.FromString

    def reader() -> float:
        t0 = time.process_time()
        for s in spans:
            read(parse(s).attributes)
        t1 = time.process_time()
        for s in spans:
            parse(s).attributes
        t2 = time.process_time()
        return ((t1 - t0) - (t2 - t1)) / len(spans) * 1e6
    out["summary_reader_us_per_span"] = reader
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, help="the other checkout (e.g. `git archive main` extracted)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", help="write the results here (JSON)")
    args = ap.parse_args()
    sides = {"base": pieces(Path(args.root).resolve(), "base"), "this": pieces(HERE, "this")}
    load_before = os.getloadavg()
    times: dict[str, dict[str, list[float]]] = {side: {k: [] for k in p} for side, p in sides.items()}
    for r in range(args.rounds):
        order = ("base", "this") if r % 2 == 0 else ("this", "base")
        for name in sides["base"]:
            for side in order:
                times[side][name].append(sides[side][name]())
    result = {"unit": "us CPU (min, median of rounds)", "rounds": args.rounds, "base": str(Path(args.root).resolve()),
              "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
              "pieces": {name: {side: [round(min(times[side][name]), 4), round(statistics.median(times[side][name]), 4)]
                                for side in sides} for name in sides["base"]}}
    for name, row in result["pieces"].items():
        row["this/base_median"] = round(row["this"][1] / row["base"][1], 3)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
