"""What one finished request's metrics cost on the OpenTelemetry SDK: the public API against the
bound recorders of ``otel_llm/core/sdk_metrics.py`` (the same values, the same aggregations).

One ``ServerMetrics`` per path, on a ``MeterProvider`` with one reader (as a deployment has), a
128-token request's summary with its inter-token gaps; the public path records the gaps as one
``record`` per token (what the API offers), the bound path adds the request's bucket counts at
once. Interleaved rounds, medians of thread CPU per request.

Run: ./run bench benchmarks/metrics_record_cost.py
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm.core import metrics as m
from otel_llm.core.inter_token import gap_summary
from otel_llm.core.slo import SLOTable
from otel_llm.core.summary import RequestSummary

RESULTS = Path(__file__).parent / "results"
TOKENS = 128


def public_bind(instrument, attributes):
    call = instrument.record if hasattr(instrument, "record") else instrument.add

    def record(amount, context=None):
        call(amount, attributes, context=context)
    return record


class PublicCounts:
    """The public API's only way to put a request's gaps in a histogram: a record per gap."""

    def __init__(self, instrument, attributes, boundaries) -> None:
        self.record, self.attributes = instrument.record, attributes

    def __call__(self, gaps: list[float]) -> None:
        for g in gaps:
            self.record(g, self.attributes)


def summary(stamps: list[float]) -> RequestSummary:
    s = RequestSummary(model="m", operation="chat", provider="vllm", ttft=0.1, e2e=3.0, queue=0.01, prefill=0.09,
                       decode=2.5, input_tokens=100, output_tokens=TOKENS, output_characters=500)
    s.tpot = RequestSummary.mean_tpot(s.decode, s.output_tokens)
    s.gaps = gap_summary(stamps)
    s.max_gap = s.gaps.max_gap
    return s


def main() -> None:
    stamps = [i * 0.02 + (0.003 if i % 7 == 0 else 0.0) for i in range(TOKENS)]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    paths = {}
    for name in ("public", "bound"):
        meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
        if name == "public":
            saved = m.bind_value
            m.bind_value = public_bind
            metrics = m.ServerMetrics(meter, SLOTable())
            metrics._bound(summary(stamps), ())  # bound (lazily) while the public path is in place
            m.bind_value = saved
        else:
            metrics = m.ServerMetrics(meter, SLOTable())
        paths[name] = metrics
    samples: dict[str, list[float]] = {"public": [], "bound": [], "public_itl": [], "bound_itl": [], "bucketing": []}
    n = 200
    for _ in range(7):
        for name, metrics in paths.items():
            s = summary(stamps)
            itl = s.gaps
            s.gaps = None  # the request's other metrics alone
            c0 = time.thread_time_ns()
            for _ in range(n):
                metrics.record(s)
            samples[name].append((time.thread_time_ns() - c0) / n / 1000)
            b = metrics._bound(s, ())
            c0 = time.thread_time_ns()
            if name == "public":
                per_gap = PublicCounts(metrics._itl[1], metrics.label_attributes(s, ()), None)
                for _ in range(n):
                    per_gap(gaps)
            else:
                for _ in range(n):
                    b.inter_token(itl.counts, itl.total, itl.lo, itl.hi)
            samples[f"{name}_itl"].append((time.thread_time_ns() - c0) / n / 1000)
        c0 = time.thread_time_ns()
        for _ in range(n):
            gap_summary(stamps)
        samples["bucketing"].append((time.thread_time_ns() - c0) / n / 1000)
    out = {k: round(statistics.median(v), 2) for k, v in samples.items()}
    out = {"us_per_request_other_metrics_public": out["public"], "us_per_request_other_metrics_bound": out["bound"],
           f"us_per_request_itl_{TOKENS}_tokens_public_record_per_gap": out["public_itl"],
           f"us_per_request_itl_{TOKENS}_tokens_bound_counts": out["bound_itl"],
           f"us_per_request_bucketing_{TOKENS}_tokens": out["bucketing"],
           "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    print(json.dumps(out, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "metrics_record_cost.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
