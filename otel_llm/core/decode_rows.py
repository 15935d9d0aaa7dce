"""Which decode steps of a kept request get a span of their own, within a span budget.

At full detail a request used to get one span per output token: a 30k-token answer made a
30k-span trace that Jaeger's UI cannot render and that nears Tempo's per-trace limit, and
most of those spans said nothing (an uneventful token looks like its neighbours). Here a
decode step keeps its own row when something happened in it:

* its gap (per output token) is above the model's TPOT SLO;
* its gap is more than ``OUTLIER_FACTOR`` times the request's own median gap (the request's
  own notion of slow; a fixed quantile would mark 1 % of every request whatever happened,
  and miss stalls once they exceed 1 % of its tokens);
* a preemption fell inside it, or its engine step preempted another request;
* its engine step prefilled another request's prompt (the classic decode stall).

Runs of uneventful steps between them become one ``llm.decode.window`` row each (token
count, mean and max gap). If the eventful steps alone do not fit the budget, the most
telling are kept first: preemptions, then SLO breaches, then others' prefill, then the
largest gaps; the rest fall into windows and are counted.

Pure functions over plain numbers: the span builder maps timelines and engine steps to
them, and they are tested without spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

OUTLIER_FACTOR = 1.5


@dataclass(frozen=True, slots=True)
class Rows:
    """Decode rows in time order: ``(first, last)`` decode-step indices, inclusive (1-based, as
    ``llm.decode.step.index``). ``first == last`` is one step's own span, else a window."""

    rows: list[tuple[int, int]]
    eventful: int  # decode steps where something happened
    coalesced: int  # of those, how many the budget put into windows


def eventful_steps(per_token_gaps: Sequence[float], tpot_slo: float | None, preempted: Collection[int],
                   others_prefill: Collection[int]) -> dict[int, tuple[int, int, int, float]]:
    """Eventful decode-step indices (1-based) with their priority key (higher is kept first)."""
    n = len(per_token_gaps)
    if not n:
        return {}
    ordered = sorted(per_token_gaps)
    median = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    threshold = OUTLIER_FACTOR * median
    if tpot_slo is not None and tpot_slo < threshold:
        threshold = tpot_slo
    found = {i for i, g in enumerate(per_token_gaps, 1) if g > threshold}
    found.update(i for i in preempted if 1 <= i <= n)
    found.update(i for i in others_prefill if 1 <= i <= n)
    slo = tpot_slo if tpot_slo is not None else float("inf")
    return {i: (i in preempted, per_token_gaps[i - 1] > slo, i in others_prefill, per_token_gaps[i - 1])
            for i in found}


def choose_rows(n: int, eventful: dict[int, tuple[int, int, int, float]], budget: int) -> Rows:
    """Rows for ``n`` decode steps, at most ``budget`` of them. Keeping step ``i`` adds one row
    for each uneventful neighbour it splits from a window, so the count is exact as we go."""
    if n <= 0 or budget <= 0:
        return Rows([], len(eventful), len(eventful) if n > 0 else 0)
    kept = bytearray(n + 2)
    kept[0] = kept[n + 1] = 1  # the edges behave as kept neighbours
    rows, coalesced = 1, 0  # everything in one window
    for i in sorted(eventful, key=eventful.__getitem__, reverse=True):
        delta = (not kept[i - 1]) + (not kept[i + 1])
        if rows + delta <= budget:
            kept[i] = 1
            rows += delta
        else:
            coalesced += 1
    out: list[tuple[int, int]] = []
    first = 1
    for i in range(1, n + 1):
        if kept[i]:
            if first < i:
                out.append((first, i - 1))
            out.append((i, i))
            first = i + 1
    if first <= n:
        out.append((first, n))
    return Rows(out, len(eventful), coalesced)
