"""A request's inter-token latencies, bucketed once when it finishes (for 100 % of requests).

The hot path only appends a stamp per step that produced tokens (``RequestTimeline.token_ts``);
here, off the engine's thread, the gaps between those stamps become bucket counts over the
conventions' time-per-output-token boundaries, which ``bucket_counts`` adds to the histogram
in one call per request. A step that produced k tokens (speculative decoding) after a gap g
counts k tokens of g / k each: the counts add up to the output tokens after the first step's,
their sum is the decode time, and their mean is the request's TPOT. The longest gap itself
(not divided) is the request's stall: what a streaming client waited for at worst.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from operator import sub
from typing import Sequence

from .buckets import INTER_TOKEN_BUCKETS

ITL_BUCKETS = INTER_TOKEN_BUCKETS
_INF = float("inf")


@dataclass(slots=True)
class GapSummary:
    counts: list[int]  # tokens per bucket of ITL_BUCKETS (len + 1: the last is above the last boundary)
    total: float  # the sum of the per-token values: the time from the first to the last token
    lo: float  # the smallest per-token value
    hi: float  # the largest per-token value
    max_gap: float  # the longest wall-clock gap between two steps that produced tokens

    @property
    def count(self) -> int:
        return sum(self.counts)


def sorted_gap_summary(gaps: Sequence[float], total: float, buckets: Sequence[float] = ITL_BUCKETS) -> GapSummary:
    """The summary of one token per gap, from the gaps already sorted (at least one). The sort is C; then
    one bisection per boundary, so the Python-level work is per bucket, not per token. A value v belongs
    to the first bucket whose boundary is >= v (the SDK's bisect_left): bucket i holds (b[i-1], b[i]]."""
    counts = [0] * (len(buckets) + 1)
    below = 0
    for i, bound in enumerate(buckets):
        upto = bisect_right(gaps, bound, below)
        counts[i] = upto - below
        below = upto
    counts[-1] = len(gaps) - below
    return GapSummary(counts, total, gaps[0], gaps[-1], gaps[-1])


def gap_summary(token_ts: Sequence[float], multi_token_steps: dict[int, int] | None = None,
                buckets: Sequence[float] = ITL_BUCKETS) -> GapSummary | None:
    """The bucketed gaps of one request's token stamps; None with fewer than two stamps."""
    if len(token_ts) < 2:
        return None
    if not multi_token_steps:  # one token per stamp (the common case)
        return sorted_gap_summary(sorted(map(sub, token_ts[1:], token_ts)), token_ts[-1] - token_ts[0], buckets)
    counts = [0] * (len(buckets) + 1)
    lo, hi, longest = float("inf"), float("-inf"), 0.0
    for i in range(1, len(token_ts)):
        gap = token_ts[i] - token_ts[i - 1]
        k = multi_token_steps.get(i, 1)
        per_token = gap / k
        counts[bisect_left(buckets, per_token)] += k
        lo, hi, longest = min(lo, per_token), max(hi, per_token), max(longest, gap)
    return GapSummary(counts, token_ts[-1] - token_ts[0], lo, hi, longest)


def from_counts(counts: Sequence[int], decode: float | None, max_gap: float | None,
                buckets: Sequence[float] = ITL_BUCKETS) -> GapSummary | None:
    """The summary a request span's bucket counts (``llm.latency.inter_token.bucket_counts``) stand for, as
    the collector adds it to its histogram; None when the counts do not fit ``buckets`` or count nothing.
    The counts are exact. The sum is the span's decode time (the gaps add up to the first-to-last-token
    time; without it, each bucket's midpoint). Min and max are bounds: the lowest non-empty bucket's lower
    edge, and the highest non-empty bucket's upper edge, or the longest gap where that is smaller."""
    if len(counts) != len(buckets) + 1:
        return None
    if max_gap is not None and not 0 <= max_gap < _INF:  # a client's NaN, inf or negative: not a gap
        max_gap = None
    smallest = next(filter(None, counts), 0)  # the first non-zero count (C-level scans: this runs per span)
    if not smallest:
        return None
    first = counts.index(smallest)
    last = len(counts) - 1 - counts[::-1].index(next(filter(None, reversed(counts))))
    lo = buckets[first - 1] if first else 0.0
    hi = buckets[last] if last < len(buckets) else _INF
    if max_gap is not None and max_gap < hi:
        hi = max(max_gap, lo)
    if hi == _INF:
        hi = buckets[-1]  # above the last boundary and no longest gap: the boundary is what is known
    if decode is not None and 0 <= decode < _INF:
        total = decode
    else:
        edges = (0.0, *buckets, buckets[-1])
        total = sum(c * (edges[i] + edges[i + 1]) / 2 for i, c in enumerate(counts) if c)
    return GapSummary(list(counts), total, lo, hi, max_gap if max_gap is not None else hi)
