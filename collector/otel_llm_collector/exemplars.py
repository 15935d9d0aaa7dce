"""Exemplars on the derived latency histograms that point only at traces the gateway kept.

The metrics are derived from every request span as it arrives, before the tail-sampling decision; an
exemplar naming a trace that is then dropped would lead a user from a dashboard to nothing. So a
request's values are held as *candidates* under its trace id (``offer``) and become the exemplar of
their (histogram, series, bucket) only when the trace is decided and kept (``decided``): the last kept
one wins, as the OpenTelemetry SDK's bucket-aligned reservoir keeps the last measurement. Without a
tail sampler every trace is kept, so candidates become exemplars at once.

Memory is bounded: at most ``max_pending`` traces hold candidates (the oldest are forgotten first: a
trace older than that decides without exemplars), and at most ``max_series`` (histogram, series) pairs
hold exemplars, one per bucket.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

from otel_llm.core.metrics import SERVER_HISTOGRAMS

# the histograms that carry exemplars: the latencies a user drills down from
# (TTFT, TPOT, end-to-end: chosen by the field each reads; the names are declared in core/metrics.py)
EXEMPLAR_HISTOGRAMS = tuple(spec for spec in SERVER_HISTOGRAMS if spec.field in ("ttft", "tpot", "e2e"))


@dataclass(frozen=True, slots=True)
class Exemplar:
    trace_id: str  # hex, as Prometheus and Grafana read the ``trace_id`` exemplar label
    value: float
    timestamp: float  # seconds since the epoch


_Candidate = tuple[str, tuple, int, float, float]  # (histogram, series key, bucket, value, timestamp)


class ExemplarStore:
    def __init__(self, max_pending: int = 50_000, max_series: int = 20_000) -> None:
        self.max_pending = max_pending
        self.max_series = max_series
        self._lock = threading.Lock()
        self._pending: OrderedDict[bytes, list[_Candidate]] = OrderedDict()
        self._kept: dict[tuple[str, tuple], dict[int, Exemplar]] = {}

    @property
    def pending(self) -> int:
        return len(self._pending)

    @staticmethod
    def candidate(histogram: str, series: tuple, bounds: tuple[float, ...], value: float,
                  timestamp: float) -> _Candidate:
        """A request's value in ``histogram``'s ``series`` (its attributes' key), in the bucket it falls in."""
        return (histogram, series, bisect.bisect_left(bounds, value), value, timestamp)

    def offer(self, offers: list[tuple[bytes, list[_Candidate]]], kept: bool = False) -> None:
        """Requests' candidates by trace id (one hold of the lock per batch); ``kept``: the traces are kept
        already (no tail sampling), so the candidates are exemplars now."""
        with self._lock:
            pending = self._pending
            for trace_id, candidates in offers:
                if kept:
                    self._keep(trace_id, candidates)
                    continue
                held = pending.get(trace_id)
                if held is None:
                    pending[trace_id] = candidates
                elif len(held) < 64:  # a trace with many request spans: its first values are enough
                    held.extend(candidates)
            while len(pending) > self.max_pending:
                pending.popitem(last=False)

    def decided(self, kept: Iterable[bytes], decided: Iterable[bytes]) -> None:
        """Traces decided: ``kept`` ones' candidates become exemplars, every decided one's are released."""
        with self._lock:
            pending = self._pending
            for tid in kept:
                held = pending.pop(tid, None)
                if held:
                    self._keep(tid, held)
            for tid in decided:
                pending.pop(tid, None)

    def _keep(self, trace_id: bytes, candidates: Iterable[_Candidate]) -> None:
        hex_id = trace_id.hex()
        for histogram, series, bucket, value, ts in candidates:
            slot = self._kept.get((histogram, series))
            if slot is None:
                if len(self._kept) >= self.max_series:
                    continue
                slot = self._kept[(histogram, series)] = {}
            slot[bucket] = Exemplar(hex_id, value, ts)

    def of(self, histogram: str, series: tuple) -> dict[int, Exemplar]:
        """The exemplars of one series, by bucket index (the +Inf bucket is ``len(bounds)``)."""
        with self._lock:
            return dict(self._kept.get((histogram, series)) or {})
