"""A streaming quantile sketch with a stated relative-error bound (DDSketch-style).

Values are counted in logarithmic buckets ``gamma**(i-1) < v <= gamma**i`` with
``gamma = (1 + alpha) / (1 - alpha)``; any quantile it returns is within a relative
error ``alpha`` of a value of the true rank (Masson et al., VLDB 2019). Memory is
bounded by ``max_buckets`` (the lowest buckets are merged when it is exceeded, which
only affects the low quantiles we never ask for). ``decay`` lets the sketch follow a
changing distribution: every ``window`` additions all counts are halved.
"""

from __future__ import annotations

import math


class QuantileSketch:
    __slots__ = ("alpha", "_gamma_log", "_buckets", "_count", "_zeros", "_max_buckets", "_window", "_since_decay")

    def __init__(self, alpha: float = 0.01, max_buckets: int = 2048, window: int = 0) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self._gamma_log = math.log((1 + alpha) / (1 - alpha))
        self._buckets: dict[int, float] = {}
        self._count = 0.0
        self._zeros = 0.0
        self._max_buckets = max_buckets
        self._window = window
        self._since_decay = 0

    @property
    def count(self) -> float:
        return self._count

    def add(self, value: float) -> None:
        if value != value:  # NaN
            return
        if value <= 0:
            self._zeros += 1
        else:
            key = math.ceil(math.log(value) / self._gamma_log)
            self._buckets[key] = self._buckets.get(key, 0.0) + 1
            if len(self._buckets) > self._max_buckets:
                self._collapse_lowest()
        self._count += 1
        if self._window:
            self._since_decay += 1
            if self._since_decay >= self._window:
                self._halve()

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1), within relative error alpha; None while empty."""
        key = self._key_at(q)
        if key is None:
            return None if self._count <= 0 else 0.0
        # the bucket's representative value, within alpha of every value in it
        return 2 * math.exp(key * self._gamma_log) / (1 + math.exp(self._gamma_log))

    def upper_bound(self, q: float) -> float | None:
        """The upper edge of the q-quantile's bucket: a value above it is surely above the quantile."""
        key = self._key_at(q)
        if key is None:
            return None if self._count <= 0 else 0.0
        return math.exp(key * self._gamma_log)

    def _key_at(self, q: float) -> int | None:
        if self._count <= 0:
            return None
        rank = q * (self._count - 1)
        seen = self._zeros
        if rank < seen or not self._buckets:
            return None
        keys = sorted(self._buckets)
        for key in keys:
            seen += self._buckets[key]
            if seen > rank:
                return key
        return keys[-1]

    def _collapse_lowest(self) -> None:
        keys = sorted(self._buckets)
        low, nxt = keys[0], keys[1]
        self._buckets[nxt] += self._buckets.pop(low)

    def _halve(self) -> None:
        self._since_decay = 0
        self._zeros /= 2
        self._buckets = {k: c / 2 for k, c in self._buckets.items() if c / 2 >= 0.01}
        self._count = self._zeros + sum(self._buckets.values())
