"""Recent values by size class (a power of two of tokens): the baselines of the causes judged against
comparable requests (``kv_transfer``: KV loads of as many external tokens; ``frontend``: hand-overs of
as long a prompt)."""

from __future__ import annotations

import collections
import threading


class RecentBySize:
    """The last ``per_size`` values of each size class (a 40-token request is compared with 32..63) and
    kind (requests unlike in another respect, e.g. with or without a grammar), for at most 64 classes
    (the oldest forgotten first)."""

    def __init__(self, per_size: int, min_samples: int = 3) -> None:
        self.per_size = per_size
        self.min_samples = min_samples
        self._values: dict[tuple[int, int], collections.deque[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def size_class(tokens: int | None) -> int:
        return max(int(tokens or 0), 1).bit_length()

    def note(self, tokens: int | None, value: float, kind: int = 0) -> None:
        key = (kind, self.size_class(tokens))
        with self._lock:
            values = self._values.get(key)
            if values is None:
                if len(self._values) >= 64:
                    self._values.pop(next(iter(self._values)))
                values = self._values[key] = collections.deque(maxlen=self.per_size)
            values.append(value)

    def recent(self, tokens: int | None, kind: int = 0) -> list[float] | None:
        """The class's values, sorted; None with fewer than ``min_samples``."""
        with self._lock:
            values = sorted(self._values.get((kind, self.size_class(tokens)), ()))
        return values if len(values) >= self.min_samples else None
