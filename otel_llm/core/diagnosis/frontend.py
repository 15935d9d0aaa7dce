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
jitter (a collection pause, a busy moment of a millisecond or two) and charges nothing.
"""

from __future__ import annotations

from .history import RecentBySize


class FrontendHistory(RecentBySize):
    def __init__(self, per_size: int = 64, min_samples: int = 3) -> None:
        super().__init__(per_size, min_samples)

    def add(self, prompt_tokens: int | None, handover_s: float, grammar: bool = False) -> None:
        if handover_s >= 0:  # clocks that disagree: nothing to learn from it
            self.note(prompt_tokens, handover_s, int(grammar))

    def usual(self, prompt_tokens: int | None, grammar: bool = False) -> tuple[float, float] | None:
        """The lower quartile and the median of comparable requests' hand-over times, or None with fewer
        than ``min_samples``."""
        times = self.recent(prompt_tokens, int(grammar))
        return (times[(len(times) - 1) // 4], times[len(times) // 2]) if times is not None else None
