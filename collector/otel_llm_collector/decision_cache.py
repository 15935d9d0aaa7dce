"""Bounded memory of recent decisions, so spans arriving after their trace was decided follow it."""

from __future__ import annotations


class DecisionCache:
    """The trace ids of at least the last ``size`` decisions (and at most ``2 * size``); 0 disables it.

    Two generations of plain sets: ids go into the current one, and when it holds ``size`` it
    becomes the previous one (the older previous is dropped whole). An exact LRU (an ``OrderedDict``
    evicting one id per decision) pays a cache miss on the evicted entry at every decision, at the
    default 100,000; a set insert touches only the new id. Late spans come within seconds
    of their trace's decision, so "the last ``size``" is what matters, not exactly which older ones.
    """

    __slots__ = ("_current", "_previous", "_size")

    def __init__(self, size: int) -> None:
        self._current: set[bytes] = set()
        self._previous: set[bytes] = set()
        self._size = size

    def add(self, trace_id: bytes) -> None:
        if not self._size:
            return
        current = self._current
        current.add(trace_id)
        if len(current) >= self._size:
            self._previous, self._current = current, set()

    def generations(self) -> tuple[set[bytes], set[bytes]]:
        """The two sets (``id in a or id in b`` is ``id in self``, without a method call per id); valid until
        the next ``add``, which may start a new generation."""
        return self._current, self._previous

    def __contains__(self, trace_id: bytes) -> bool:
        return trace_id in self._current or trace_id in self._previous

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)
