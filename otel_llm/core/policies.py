"""Sampling policies: small evaluators behind one interface, shared by the SDK and the collector.

The SDK evaluates one finished request (a ``TraceView`` holding its summary); the
collector evaluates a buffered trace (a ``TraceView`` holding every request summary
found in it). The same classes decide in both places.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from .quantile import QuantileSketch
from .slo import SLOTable
from .summary import RequestSummary


class Verdict(enum.Enum):
    SAMPLED = "sampled"
    NOT_SAMPLED = "not_sampled"
    DROPPED = "dropped"  # an explicit drop; wins over every other vote


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str = ""

    @property
    def sampled(self) -> bool:
        return self.verdict is Verdict.SAMPLED


NOT_SAMPLED = Decision(Verdict.NOT_SAMPLED)


@dataclass(slots=True)
class TraceView:
    """What a policy may look at: the trace id, its request summaries, and trace-wide facts."""

    trace_id: int
    summaries: Sequence[RequestSummary] = ()
    has_error: bool = False
    span_count: int = 1
    duration: float | None = None  # trace-wide, seconds; None when unknown
    recorded_reasons: Sequence[str] = field(default_factory=tuple)  # llm.sampling.reason set by the SDK


class Policy(Protocol):
    name: str

    def evaluate(self, trace: TraceView) -> Decision: ...


class ErrorPolicy:
    """Keep traces in which a request failed or was aborted, or a span has ERROR status."""

    def __init__(self, name: str = "error") -> None:
        self.name = name

    def evaluate(self, trace: TraceView) -> Decision:
        if trace.has_error or any(s.failed for s in trace.summaries):
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class SLOPolicy:
    """Keep traces in which any request breached one of its model's SLOs."""

    def __init__(self, slos: SLOTable, name: str = "slo_breach") -> None:
        self.name = name
        self.slos = slos

    def evaluate(self, trace: TraceView) -> Decision:
        for s in trace.summaries:
            missed = self.slos.for_model(s.model).breaches(s)
            if missed:
                return Decision(Verdict.SAMPLED, f"{self.name}:{'+'.join(missed)}")
        return NOT_SAMPLED


class LatencyPercentilePolicy:
    """Keep requests slower than the rolling ``quantile`` of their model's ``measure``.

    Each model has its own sketch (relative error ``alpha``); a value is compared before
    it is added. Until ``min_samples`` requests of a model were seen the policy abstains,
    so a cold start does not keep everything.
    """

    def __init__(
        self,
        quantile: float = 0.99,
        measure: str = "e2e",
        min_samples: int = 50,
        alpha: float = 0.01,
        window: int = 10_000,
        max_models: int = 256,
        name: str | None = None,
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if measure not in ("e2e", "ttft", "tpot", "queue", "prefill", "decode"):
            raise ValueError(f"unknown latency measure {measure!r}")
        self.quantile = quantile
        self.measure = measure
        self.min_samples = min_samples
        self.alpha = alpha
        self.window = window
        self.max_models = max_models
        self.name = name or f"slow_p{quantile * 100:g}"
        self._sketches: dict[str | None, QuantileSketch] = {}

    def threshold(self, model: str | None) -> float | None:
        sketch = self._sketches.get(model)
        if sketch is None or sketch.count < self.min_samples:
            return None
        return sketch.quantile(self.quantile)

    def evaluate(self, trace: TraceView) -> Decision:
        keep = False
        for s in trace.summaries:
            value = getattr(s, self.measure)
            if value is None:
                continue
            limit = self.threshold(s.model)
            if limit is not None and value > limit:
                keep = True
            self._sketch(s.model).add(value)
        return Decision(Verdict.SAMPLED, self.name) if keep else NOT_SAMPLED

    def _sketch(self, model: str | None) -> QuantileSketch:
        sketch = self._sketches.get(model)
        if sketch is None:
            if len(self._sketches) >= self.max_models:  # bound memory against unbounded model names
                self._sketches.pop(next(iter(self._sketches)))
            sketch = self._sketches[model] = QuantileSketch(self.alpha, window=self.window)
        return sketch


_RATIO_BITS = 56


class ProbabilisticPolicy:
    """Keep a fixed share of traces, decided from the trace id so every process agrees.

    Uses the low 56 bits of the trace id (random under W3C trace context level 2), as the
    OpenTelemetry consistent-probability samplers do.
    """

    def __init__(self, rate: float, name: str = "baseline") -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"sampling rate must be within [0, 1], got {rate}")
        self.name = name
        self.rate = rate
        self._bound = int(rate * (1 << _RATIO_BITS))

    def evaluate(self, trace: TraceView) -> Decision:
        if (trace.trace_id & ((1 << _RATIO_BITS) - 1)) < self._bound:
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class AlwaysSample:
    def __init__(self, name: str = "always") -> None:
        self.name = name

    def evaluate(self, trace: TraceView) -> Decision:
        return Decision(Verdict.SAMPLED, self.name)


def first_match(policies: Sequence[Policy], trace: TraceView, on_error: "callable | None" = None) -> Decision:
    """Run policies in order; an explicit drop wins, else the first SAMPLED vote.

    A policy that raises is "no vote" (reported through ``on_error``), never a crash.
    """
    chosen = NOT_SAMPLED
    for policy in policies:
        try:
            decision = policy.evaluate(trace)
        except Exception as exc:  # a broken policy must not break the pipeline
            if on_error is not None:
                on_error(policy, exc)
            continue
        if decision.verdict is Verdict.DROPPED:
            return decision
        if decision.sampled and not chosen.sampled:
            chosen = decision
    return chosen
