"""A streaming quantile sketch with a stated relative-error bound (DDSketch-style).

Values are counted in logarithmic buckets ``gamma**(i-1) < v <= gamma**i`` with
``gamma = (1 + alpha) / (1 - alpha)``; any quantile it returns is within a relative
error ``alpha`` of a value of the true rank (Masson et al., VLDB 2019). Memory is
bounded by ``max_buckets`` (the lowest buckets are merged when it is exceeded, which
only affects the low quantiles we never ask for). ``decay`` lets the sketch follow a
changing distribution: every ``window`` additions all counts are halved.
"""

from __future__ import annotations

import bisect
import math


class QuantileSketch:
    __slots__ = ("alpha", "_gamma_log", "_buckets", "_keys", "_count", "_zeros", "_max_buckets", "_window",
                 "_since_decay")

    def __init__(self, alpha: float = 0.01, max_buckets: int = 2048, window: int = 0) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self._gamma_log = math.log((1 + alpha) / (1 - alpha))
        self._buckets: dict[int, float] = {}
        self._keys: list[int] = []  # sorted bucket keys: new keys are rare once the range is covered
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
            found = self._buckets.get(key)
            if found is None:
                self._buckets[key] = 1.0
                bisect.insort(self._keys, key)
                if len(self._keys) > self._max_buckets:
                    self._collapse_lowest()
            else:
                self._buckets[key] = found + 1
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
        if rank < self._zeros or not self._keys:
            return None
        buckets = self._buckets
        if q < 0.5:
            seen = self._zeros
            for key in self._keys:
                seen += buckets[key]
                if seen > rank:
                    return key
            return self._keys[-1]
        # high quantiles (what the tail policy asks for): walk down from the top, a few buckets
        above = self._count
        for key in reversed(self._keys):
            above -= buckets[key]  # now: how many lie below this bucket
            if above <= rank:
                return key
        return self._keys[0]

    def _collapse_lowest(self) -> None:
        low = self._keys.pop(0)
        self._buckets[self._keys[0]] += self._buckets.pop(low)

    def _halve(self) -> None:
        self._since_decay = 0
        self._zeros /= 2
        self._buckets = {k: c / 2 for k, c in self._buckets.items() if c / 2 >= 0.01}
        self._keys = sorted(self._buckets)
        self._count = self._zeros + sum(self._buckets.values())
