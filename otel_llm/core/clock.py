"""One documented conversion from an engine's monotonic clock to the wall clock.

Engines stamp events with ``time.monotonic()`` (vLLM's EngineCore) or a steady clock,
possibly in another process. On Linux ``CLOCK_MONOTONIC`` is system-wide, so a stamp
taken in the EngineCore process is comparable with one taken here. We read the offset
``wall - monotonic`` at the moment a request is materialized and shift every stamp of that
request by it: intervals stay exactly the engine's, and the absolute position is within the
offset's error plus its drift since the stamp (NTP slews the wall clock by at most 500 ppm,
i.e. < 0.5 ms over a 1 s request).

The offset's error is the time between the two reads: negligible, unless the thread is
descheduled between them, which on a loaded machine costs a whole time slice (an error of
milliseconds, seen under heavy load). So the wall read is bracketed by two monotonic reads
and the tightest of a few brackets wins.
"""

from __future__ import annotations

import time


_TIGHT_NS = 20_000  # a bracket this narrow had no descheduling inside it
_TRIES = 5


def wall_minus_monotonic_ns() -> int:
    """``wall - monotonic`` now, from the tightest of up to ``_TRIES`` bracketed reads."""
    best_width, best = -1, 0
    for _ in range(_TRIES):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        width = after - before
        if best_width < 0 or width < best_width:
            best_width, best = width, wall - (before + after) // 2
        if width <= _TIGHT_NS:
            break
    return best


class WallClock:
    __slots__ = ("offset_ns",)

    def __init__(self) -> None:
        self.offset_ns = wall_minus_monotonic_ns()

    def mono_ns(self, mono_s: float) -> int:
        """Engine monotonic seconds to wall-clock nanoseconds."""
        return int(mono_s * 1e9) + self.offset_ns

    @staticmethod
    def wall_ns(wall_s: float) -> int:
        return int(wall_s * 1e9)
