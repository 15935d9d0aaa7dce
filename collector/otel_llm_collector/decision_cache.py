"""Bounded memory of recent decisions, so spans arriving after their trace was decided follow it."""

from __future__ import annotations

from collections import OrderedDict


class DecisionCache:
    """An LRU set of trace ids; size 0 disables it (late spans then start a new trace)."""

    __slots__ = ("_ids", "_size")

    def __init__(self, size: int) -> None:
        self._ids: OrderedDict[bytes, None] = OrderedDict()
        self._size = size

    def add(self, trace_id: bytes) -> None:
        if not self._size:
            return
        ids = self._ids
        if trace_id in ids:  # rare (a trace id decided twice): refresh its place
            ids.move_to_end(trace_id)
            return
        ids[trace_id] = None  # a new key goes to the end already
        if len(ids) > self._size:
            ids.popitem(last=False)

    def __contains__(self, trace_id: bytes) -> bool:
        return trace_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
