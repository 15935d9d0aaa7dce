"""Policies on trace-wide facts (upstream ``latency``, ``status_code``, ``span_count``)."""

from __future__ import annotations

from typing import Sequence

from .base import NOT_SAMPLED, Decision, OptionError, TraceView, Verdict


class LatencyPolicy:
    """Keep traces whose trace-wide duration is at least ``threshold`` (and below ``upper``, if given).

    Same meaning as upstream ``latency`` (``threshold_ms`` / ``upper_threshold_ms``); a trace of
    unknown duration cannot match.
    """

    @staticmethod
    def check(threshold: float, upper: float | None = None) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        if threshold < 0 or (upper is not None and upper <= threshold):
            raise OptionError("threshold", f"must be >= 0 and below the upper threshold, got {threshold}, {upper}")

    def __init__(self, threshold: float, upper: float | None = None, name: str = "latency") -> None:
        self.check(threshold, upper)
        self.name = name
        self.threshold = threshold
        self.upper = upper

    def evaluate(self, trace: TraceView) -> Decision:
        d = trace.duration
        if d is not None and d >= self.threshold and (self.upper is None or d <= self.upper):
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class StatusCodePolicy:
    """Keep traces with a span of one of ``codes`` (``ERROR``, ``OK``, ``UNSET``), as upstream ``status_code``.

    The trace view only says whether a span errored (or a request failed), so ``OK``/``UNSET``
    match traces with no error at all.
    """

    _CODES = ("ERROR", "OK", "UNSET")

    @classmethod
    def check(cls, codes: Sequence[str]) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        bad = [c for c in codes if str(c).upper() not in cls._CODES]
        if not codes or bad:
            raise OptionError("status_codes", f"must be a non-empty list of {', '.join(cls._CODES)}; "
                                              f"got {list(codes)}")

    def __init__(self, codes: Sequence[str], name: str = "status_code") -> None:
        self.check(codes)
        self.name = name
        self.codes = frozenset(str(c).upper() for c in codes)

    def evaluate(self, trace: TraceView) -> Decision:
        error = trace.has_error or any(s.failed for s in trace.summaries)
        if ("ERROR" in self.codes) if error else bool(self.codes & {"OK", "UNSET"}):
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


def _count(label: str, bound: int | None) -> None:
    if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
        raise OptionError(label, f"must be a non-negative integer, got {bound!r}")


class SpanCountPolicy:
    """Keep traces with ``min_spans <= span count <= max_spans`` (upstream ``span_count``).

    ``max_spans`` 0 or omitted means no upper bound, as upstream. The count is of the spans
    received so far when the decision is made, as upstream. Unlike upstream we reject
    ``max_spans < min_spans`` (upstream accepts it and then never samples), and a policy with
    neither bound (it would keep every trace: an ``always_sample`` in disguise).
    """

    @staticmethod
    def check(min_spans: int | None = None, max_spans: int | None = None) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        _count("min_spans", min_spans)
        _count("max_spans", max_spans)
        if min_spans is None and max_spans is None:
            raise OptionError("min_spans", "or max_spans is needed: span_count needs min_spans, max_spans or both")
        if max_spans and max_spans < (min_spans or 0):
            raise OptionError("max_spans", f"must be >= min_spans (or 0 for no limit), got {max_spans} < {min_spans}")

    def __init__(self, min_spans: int | None = None, max_spans: int | None = None, name: str = "span_count") -> None:
        self.check(min_spans, max_spans)
        min_spans = min_spans or 0
        self.name = name
        self.min_spans = min_spans
        self.max_spans = max_spans or None

    def evaluate(self, trace: TraceView) -> Decision:
        n = trace.span_count
        if n >= self.min_spans and (self.max_spans is None or n <= self.max_spans):
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED
