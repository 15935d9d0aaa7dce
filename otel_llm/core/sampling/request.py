"""Policies on a trace's request summaries and recorded decision: what the SDK decides with, and the collector too.

``error``, ``slo``, ``latency_percentile``, ``probabilistic``, ``always_sample``, ``sdk_decision``.
"""

from __future__ import annotations

from typing import Sequence

from ... import semconv as sc
from ..quantile import QuantileSketch
from ..disagg import user_requests
from ..slo import SLOTable
from .base import NOT_SAMPLED, Decision, OptionError, TraceView, Verdict

MEASURES = ("e2e", "ttft", "tpot", "queue", "prefill", "decode")


class ErrorPolicy:
    """Keep traces in which a request failed or was aborted, or a span has ERROR status."""

    def __init__(self, name: str = "error") -> None:
        self.name = name
        self._yes = Decision(Verdict.SAMPLED, name)

    def evaluate(self, trace: TraceView) -> Decision:
        if trace.has_error:
            return self._yes
        for s in trace.summaries:  # a loop, not any(<generator>): this runs for every trace
            if s.error_type is not None:
                return self._yes
        return NOT_SAMPLED


class SLOPolicy:
    """Keep traces in which any request breached one of its model's SLOs.

    The requests are the user's: where a trace holds both halves of a disaggregated request (the collector's
    case), the request joined from them is judged, not each half (``core/disagg.py``): the user's TTFT is P's
    whole request and D's TTFT, which neither half breaches alone."""

    def __init__(self, slos: SLOTable, name: str = "slo_breach") -> None:
        self.name = name
        self.slos = slos

    def evaluate(self, trace: TraceView) -> Decision:
        for s in user_requests(trace.summaries):
            missed = self.slos.for_request(s.model, s.tenant).breaches(s)
            if missed:
                return Decision(Verdict.SAMPLED, f"{self.name}:{'+'.join(missed)}")
        return NOT_SAMPLED


class LatencyPercentilePolicy:
    """Keep requests slower than the rolling ``quantile`` of their model's ``measure``.

    Each model has its own sketch (relative error ``alpha``); a value is compared before
    it is added. Until ``min_samples`` requests of a model were seen the policy abstains,
    so a cold start does not keep everything. Latencies of requests served together are
    correlated (a slow batch is slow for all of them), so "slower than p99" can hold for
    far more than 1% at a time: the policy keeps at most ``max_share`` of what it evaluates
    (default twice its nominal share, over a decaying window of about ``1/decay`` requests).
    """

    @staticmethod
    def check(quantile: float = 0.99, measure: str = "e2e", max_share: float | None = None) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        if not 0 < quantile < 1:
            raise OptionError("quantile", f"must be in (0, 1), got {quantile}")
        if measure not in MEASURES:
            raise OptionError("measure", f"must be one of {', '.join(MEASURES)}: unknown latency measure {measure!r}")
        share = 2 * (1 - quantile) if max_share is None else max_share
        if not 0 < share <= 1:
            raise OptionError("max_share", f"must be within (0, 1], got {share}")

    def __init__(
        self,
        quantile: float = 0.99,
        measure: str = "e2e",
        min_samples: int = 50,
        alpha: float = 0.01,
        window: int = 10_000,
        max_models: int = 256,
        max_share: float | None = None,
        name: str | None = None,
    ) -> None:
        self.check(quantile, measure, max_share)
        self.quantile = quantile
        self.measure = measure
        self.min_samples = min_samples
        self.alpha = alpha
        self.window = window
        self.max_models = max_models
        self.max_share = 2 * (1 - quantile) if max_share is None else max_share
        self.name = name or f"slow_p{quantile * 100:g}"
        self._yes = Decision(Verdict.SAMPLED, self.name)
        self._sketches: dict[str | None, QuantileSketch] = {}
        self._seen = 0.0  # decayed counts of evaluated and kept traces, for the share cap
        self._kept = 0.0
        self._decay = 1.0 - 1.0 / max(100.0, 10.0 / self.max_share)

    def threshold(self, model: str | None) -> float | None:
        sketch = self._sketches.get(model)
        if sketch is None or sketch.count < self.min_samples:
            return None
        # the bucket's upper edge, not its midpoint: a request as fast as the quantile is not "slower"
        return sketch.upper_bound(self.quantile)

    def evaluate(self, trace: TraceView) -> Decision:
        keep = False
        measure, quantile, min_samples, sketches = self.measure, self.quantile, self.min_samples, self._sketches
        for s in trace.summaries:
            value = getattr(s, measure)
            if value is None:
                continue
            sketch = sketches.get(s.model) or self._sketch(s.model)
            if sketch.add_above(value, quantile, min_samples):  # value > threshold(), then counted
                keep = True
        seen = self._seen = self._seen * self._decay + 1.0
        if keep:
            if self._kept + 1.0 > self.max_share * seen:
                keep = False  # over its share: a correlated burst, already represented by what was kept
        self._kept = self._kept * self._decay + (1.0 if keep else 0.0)
        return self._yes if keep else NOT_SAMPLED

    def _sketch(self, model: str | None) -> QuantileSketch:
        sketch = self._sketches.get(model)
        if sketch is None:
            if len(self._sketches) >= self.max_models:  # bound memory against unbounded model names
                self._sketches.pop(next(iter(self._sketches)))
            sketch = self._sketches[model] = QuantileSketch(self.alpha, window=self.window)
        return sketch


_RATIO_BITS = 56
_RATIO_MASK = (1 << _RATIO_BITS) - 1


class ProbabilisticPolicy:
    """Keep a fixed share of traces, decided from the trace id so every process agrees.

    Uses the low 56 bits of the trace id (random under W3C trace context level 2), as the
    OpenTelemetry consistent-probability samplers do.
    """

    @staticmethod
    def check(rate: float) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        if not 0.0 <= rate <= 1.0:
            raise OptionError("rate", f"must be within [0, 1], got {rate}")

    def __init__(self, rate: float, name: str = "baseline") -> None:
        self.check(rate)
        self.name = name
        self.rate = rate
        self._bound = int(rate * (1 << _RATIO_BITS))
        self._yes = Decision(Verdict.SAMPLED, name)

    def evaluate(self, trace: TraceView) -> Decision:
        if (trace.trace_id & _RATIO_MASK) < self._bound:
            return self._yes
        return NOT_SAMPLED


class AlwaysSample:
    def __init__(self, name: str = "always") -> None:
        self.name = name
        self._yes = Decision(Verdict.SAMPLED, name)

    def evaluate(self, trace: TraceView) -> Decision:
        return self._yes


class RecordedReasonPolicy:
    """Honour the decision the SDK recorded: keep a trace whose request span carries ``llm.sampling.reason``.

    ``reasons`` limits it to some reasons (prefix match, so ``slo_breach`` matches
    ``slo_breach:ttft``); empty means any recorded reason.
    """

    def __init__(self, reasons: Sequence[str] = (), name: str = "sdk_decision") -> None:
        self.name = name
        self.reasons = tuple(reasons)

    def evaluate(self, trace: TraceView) -> Decision:
        for r in trace.recorded_reasons:
            if r == sc.SAMPLING_REASON_DEFERRED:  # exported for the gateway to decide, not a decision to keep
                continue
            if not self.reasons or any(r.startswith(p) for p in self.reasons):
                return Decision(Verdict.SAMPLED, f"{self.name}:{r}")
        return NOT_SAMPLED
