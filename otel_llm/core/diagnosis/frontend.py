"""The frontend's hand-over time of recent requests, by prompt length: the ``frontend`` cause's baseline.

A request's hand-over is from its arrival (vLLM's ``arrival_time``: wall clock, stamped by the frontend
before it renders and tokenizes the prompt) to the engine's QUEUED stamp (the engine's monotonic clock).
Both clocks are read on one host: ``time.monotonic()`` is the system-wide CLOCK_MONOTONIC on Linux, the
same in the frontend, the EngineCore and the agent, so the arrival is converted with the offset
``time.time() - time.monotonic()`` read where the verdict runs (``StepWindow.wall_offset``; a wall-clock
step between the arrival and the verdict moves it by that step).

What a request's own prompt costs to render and tokenize is its own work: it is compared with requests
of a comparable prompt length (the same power of two of prompt tokens) on this frontend, over the last
``per_size`` of them. The baseline is their lower quartile rather than their median: the frontend's
backlog comes in bursts, and a burst that filled most of the recent window would otherwise become the
usual hand-over it is judged against.
"""

from __future__ import annotations

import collections
import threading


class FrontendHistory:
    def __init__(self, per_size: int = 64, min_samples: int = 3) -> None:
        self.per_size = per_size
        self.min_samples = min_samples
        self._times: dict[int, collections.deque[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def size_class(tokens: int | None) -> int:
        return max(int(tokens or 0), 1).bit_length()

    def add(self, prompt_tokens: int | None, handover_s: float) -> None:
        if handover_s < 0:  # clocks that disagree: nothing to learn from it
            return
        key = self.size_class(prompt_tokens)
        with self._lock:
            times = self._times.get(key)
            if times is None:
                if len(self._times) >= 64:
                    self._times.pop(next(iter(self._times)))
                times = self._times[key] = collections.deque(maxlen=self.per_size)
            times.append(handover_s)

    def usual(self, prompt_tokens: int | None) -> float | None:
        """The lower quartile of comparable requests' hand-over times, or None with fewer than ``min_samples``."""
        with self._lock:
            times = self._times.get(self.size_class(prompt_tokens))
            if times is None or len(times) < self.min_samples:
                return None
            ordered = sorted(times)
        return ordered[(len(ordered) - 1) // 4]
