"""What the upstream metrics pipeline does to signal_to_metrics' output, modelled from the Go sources.

Only temporality, monotonicity and timestamps are modelled -- the parts that decide whether a series
reaches Prometheus and adds up. Each rule cites the code it is read from
(open-telemetry/opentelemetry-collector-contrib, files read at the commits named):

* connector/signaltometricsconnector/internal/aggregator/aggregator.go @ 5c0bb011 (``Finalize``): every
  ``Consume*`` call emits one data point per series with ``AggregationTemporalityDelta``, timestamp =
  the aggregator's creation time, no start timestamp (0, as issue #40232's debug output shows:
  ``StartTimestamp: 1970-01-01``); a sum is monotonic only when ``sum.monotonic`` says so (PR #45865,
  before it ``IsMonotonic: false`` always).
* processor/deltatocumulativeprocessor/internal/delta/delta.go @ c51fdeda (``AccumulateInto``): a point
  whose start is older than the stream's start is dropped, one not newer than the stream's last time is
  dropped (out of order), otherwise added; the output is cumulative, monotonicity kept.
* exporter/prometheusexporter/accumulator.go @ bf97aade: ``accumulateSum`` drops a delta sum that is not
  monotonic; for a delta monotonic sum it adds only when the point's start equals the previous point's
  time, else keeps the new point alone; ``accumulateHistogram`` for a delta point whose start is not
  the previous point's time drops it unless the start is after that time (then a reset). A cumulative
  point replaces the stored one when newer.
* exporter/prometheusexporter/collector.go @ 5952a526 (``convertSum``): a monotonic sum is written as a
  counter, any other sum as a gauge.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Point:
    kind: str            # "sum" or "histogram"
    cumulative: bool
    monotonic: bool      # sums only
    start: int
    time: int
    value: float         # sum value, or histogram count
    total: float = 0.0   # histogram sum


def connector_point(kind: str, monotonic: bool, time: int, value: float, total: float = 0.0) -> Point:
    return Point(kind, cumulative=False, monotonic=monotonic if kind == "sum" else False, start=0, time=time,
                 value=value, total=total)


class DeltaToCumulative:
    def __init__(self) -> None:
        self.state: Point | None = None

    def __call__(self, p: Point) -> Point | None:
        if p.cumulative:
            return p
        if self.state is None:
            self.state = replace(p, cumulative=True)
            return self.state
        if p.start < self.state.start or p.time <= self.state.time:
            return None  # ErrOlderStart / ErrOutOfOrder
        self.state = replace(self.state, time=p.time, value=self.state.value + p.value,
                             total=self.state.total + p.total)
        return self.state


class PrometheusAccumulator:
    def __init__(self) -> None:
        self.stored: Point | None = None

    def __call__(self, p: Point) -> None:
        prev = self.stored
        if p.kind == "sum":
            if not p.cumulative and not p.monotonic:
                return  # "Drop non-monotonic and non-cumulative metrics"
            if prev is not None and p.time < prev.time:
                return
            if not p.cumulative and prev is not None and p.start == prev.time:
                p = replace(p, start=prev.start, value=p.value + prev.value)
            self.stored = replace(p, cumulative=True)
            return
        if prev is None:
            self.stored = replace(p, cumulative=True)
        elif p.cumulative:
            if p.time >= prev.time:
                self.stored = p
        elif p.start != prev.time:
            if p.start > prev.time:
                self.stored = replace(p, cumulative=True)  # treated as a reset
            # else: "Dropped misaligned histogram datapoint"
        else:
            self.stored = replace(prev, time=p.time, value=prev.value + p.value, total=prev.total + p.total)

    def exposition(self) -> tuple[str, float, float] | None:
        """(Prometheus type, value or count, histogram sum) as a scrape would show it, or None if absent."""
        p = self.stored
        if p is None:
            return None
        if p.kind == "histogram":
            return ("histogram", p.value, p.total)
        return ("counter" if p.monotonic else "gauge", p.value, 0.0)


def run_pipeline(kind: str, monotonic: bool, with_delta_to_cumulative: bool,
                 batches: list[tuple[float, float]]) -> tuple[str, float, float] | None:
    """Feed one series' per-batch (value, total) through the pipeline; what Prometheus shows at the end."""
    d2c = DeltaToCumulative() if with_delta_to_cumulative else None
    prom = PrometheusAccumulator()
    for i, (value, total) in enumerate(batches):
        p: Point | None = connector_point(kind, monotonic, time=1_000 + i, value=value, total=total)
        if d2c is not None:
            p = d2c(p)
        if p is not None:
            prom(p)
    return prom.exposition()
