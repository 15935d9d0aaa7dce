"""The frontend's hand-over time of recent requests, by prompt length: the ``frontend`` cause's baseline.

A request's hand-over is from its arrival (vLLM's ``arrival_time``: wall clock, stamped by the frontend
before it renders and tokenizes the prompt) to the engine's QUEUED stamp (the engine's monotonic clock).
Both clocks are read on one host: ``time.monotonic()`` is the system-wide CLOCK_MONOTONIC on Linux, the
same in the frontend, the EngineCore and the agent, so the arrival is converted with the offset
``time.time() - time.monotonic()`` read where the verdict runs (``StepWindow.wall_offset``; a wall-clock
step between the arrival and the verdict moves it by that step).

What a request's own prompt costs to render and tokenize is its own work: it is compared with requests
of a comparable prompt length (the same power of two of prompt tokens) on this frontend, over the last
``per_size`` of them, and a request with a structured-output grammar only with others that had one
(the frontend validates a schema; the EngineCore starts its compilation as it takes the request in). The baseline is their lower quartile rather than their median: the frontend's
backlog comes in bursts, and a burst that filled most of the recent window would otherwise become the
usual hand-over it is judged against. A hand-over within twice their median is the frontend's usual
jitter, and an excess below the cause's declared floor (``causes.py``: what a hop between processes
on a busy host can cost by itself) cannot be told from the host's scheduling: neither charges anything.

The output side, where a Python frontend received the outputs: from the engine's stamp of its first
(last) token to the frontend's receipt of that output (vLLM's ``iteration_timestamp`` of the output batch,
wall clock, where vLLM's TTFT and e2e end), compared in the same way with the last ``per_size`` requests'
first (last) output delays on this frontend. A Rust frontend leaves no receipt: nothing is judged there.
"""

from __future__ import annotations

from .history import RecentBySize


def quartile_and_median(times: list[float] | None) -> tuple[float, float] | None:
    """The lower quartile and the median of sorted ``times`` (None: too few to compare with)."""
    return (times[(len(times) - 1) // 4], times[len(times) // 2]) if times is not None else None


def excess(took: float, usual: tuple[float, float] | None, floor: float) -> float:
    """What of ``took`` a busy frontend cost: its excess over comparable requests' lower quartile, when it
    is over twice their median (their usual jitter) and the excess over ``floor``; else 0."""
    if usual is None:
        return 0.0
    over = took - usual[0]
    return over if took > 2 * usual[1] and over > floor else 0.0


class FrontendHistory(RecentBySize):
    """Hand-overs by prompt length (kind: with a grammar or not)."""

    def __init__(self, per_size: int = 64, min_samples: int = 3) -> None:
        super().__init__(per_size, min_samples)

    def add(self, prompt_tokens: int | None, handover_s: float, grammar: bool = False) -> None:
        if handover_s >= 0:  # clocks that disagree: nothing to learn from it
            self.note(prompt_tokens, handover_s, int(grammar))

    def usual(self, prompt_tokens: int | None, grammar: bool = False) -> tuple[float, float] | None:
        """The lower quartile and the median of comparable requests' hand-over times, or None with fewer
        than ``min_samples``."""
        return quartile_and_median(self.recent(prompt_tokens, int(grammar)))


FIRST, LAST = 0, 1  # which output: the first (TTFT ends there) or the last (e2e ends there)


class OutputDelays(RecentBySize):
    """The frontend's output delays of recent requests (the engine's token stamp to the frontend's receipt
    of that output), the first and the last output apart; one class whatever the prompt's length."""

    def __init__(self, per_size: int = 64, min_samples: int = 3) -> None:
        super().__init__(per_size, min_samples)

    def add(self, which: int, delay_s: float) -> None:
        if delay_s >= 0:  # clocks that disagree: nothing to learn from it
            self.note(None, delay_s, which)

    def usual(self, which: int) -> tuple[float, float] | None:
        return quartile_and_median(self.recent(None, which))
