"""What deriving the per-token histogram costs the gateway: shape-1 request spans with and without the
compact inter-token summary (``llm.latency.inter_token.bucket_counts``).

    .venv/bin/python benchmarks/collector_inter_token.py [--rounds 7]

The same ~1000-span requests as ``collector_throughput.py``'s shape 1 ("base", 8 attributes), then with the
decode time a real request span carries and one more attribute ("with_decode": what the counts are compared
against), then with the counts as that attribute ("with_counts": 14 counts; every other span has some above
127, two-byte varints, the slower path).
Each round ingests 20 requests (fresh trace ids) on a fresh gateway (no tail sampling: the derivation is
what is measured) for each variant in turn; process CPU per span, medians of the rounds. Writes
benchmarks/results/collector_inter_token.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "collector"), str(ROOT / "benchmarks")]

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from collector_throughput import build_requests, kv, unique_copies  # noqa: E402
from otel_llm import semconv as sc  # noqa: E402
from otel_llm_collector.config import CollectorConfig  # noqa: E402
from otel_llm_collector.gateway import Gateway  # noqa: E402

COUNTS = ((0, 3, 40, 100, 50, 5, 1, 0, 0, 0, 0, 0, 0, 0), (0, 0, 180, 900, 12, 0, 0, 0, 0, 0, 0, 0, 1, 0))


def with_decode(payload: bytes, counts: bool = False) -> bytes:
    """Each span given ``llm.latency.decode`` (real request spans carry it) and the counts, or (``counts``
    False) an unrelated integer attribute in their place, so both variants have the same attribute count."""
    req = ExportTraceServiceRequest.FromString(payload)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for i, s in enumerate(ss.spans):
                s.attributes.extend([kv(sc.LATENCY_DECODE, 4.0 + i / 1000),
                                     kv(sc.LATENCY_ITL_COUNTS if counts else "x.other", 0)])
                if not counts:
                    continue
                arr = s.attributes[-1].value
                arr.ClearField("int_value")
                for c in COUNTS[i % 2]:
                    arr.array_value.values.add(int_value=c)
    return req.SerializeToString()


def us_per_span(payloads: list[bytes], seed: int) -> float:
    raw = {"receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": None}}},
           "exporters": {"prometheus": None}, "processors": {"tail_sampling": None}}
    g = Gateway(CollectorConfig.from_mapping(raw), manual_ticks=True)
    try:
        encoded = unique_copies(payloads, 20, seed)
        parsed = [ExportTraceServiceRequest.FromString(p) for p in encoded]
        spans = sum(len(ss.spans) for r in parsed for rs in r.resource_spans for ss in rs.scope_spans)
        t = time.process_time()
        for req, raw_bytes in zip(parsed, encoded):
            g.ingest(req, raw=raw_bytes)
        return (time.process_time() - t) / spans * 1e6
    finally:
        g.shutdown(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    base = build_requests(1, 4)
    variants = {"base": base, "with_decode": [with_decode(x) for x in base],
                "with_counts": [with_decode(x, counts=True) for x in base]}
    load_before = os.getloadavg()
    rounds: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, payloads in variants.items():
            rounds[name].append(us_per_span(payloads, r))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    result = {"unit": "us CPU per shape-1 span (median of rounds)", "rounds": args.rounds,
              "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
              "median": med, "added_us_per_span": med["with_counts"] - med["with_decode"],
              "added_share": med["with_counts"] / med["with_decode"] - 1,
              "all_rounds": rounds}
    out = ROOT / "benchmarks" / "results" / "collector_inter_token.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median", "added_us_per_span", "added_share")}, indent=2))


if __name__ == "__main__":
    main()
