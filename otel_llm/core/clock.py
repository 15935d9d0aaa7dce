"""One documented conversion from an engine's monotonic clock to the wall clock.

Engines stamp events with ``time.monotonic()`` (vLLM's EngineCore) or a steady clock,
possibly in another process. On Linux ``CLOCK_MONOTONIC`` is system-wide, so a stamp
taken in the EngineCore process is comparable with one taken here. We read the offset
``wall - monotonic`` at the moment a request is materialized (both reads ~100 ns apart)
and shift every stamp of that request by it: intervals stay exactly the engine's, and
the absolute position is within the offset's drift since the stamp (NTP slews the wall
clock by at most 500 ppm, i.e. < 0.5 ms over a 1 s request).
"""

from __future__ import annotations

import time


class WallClock:
    __slots__ = ("offset_ns",)

    def __init__(self) -> None:
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def mono_ns(self, mono_s: float) -> int:
        """Engine monotonic seconds to wall-clock nanoseconds."""
        return int(mono_s * 1e9) + self.offset_ns

    @staticmethod
    def wall_ns(wall_s: float) -> int:
        return int(wall_s * 1e9)
