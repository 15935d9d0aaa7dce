"""A streaming quantile sketch with a stated relative-error bound (DDSketch-style).

Values are counted in logarithmic buckets ``gamma**(i-1) < v <= gamma**i`` with
``gamma = (1 + alpha) / (1 - alpha)``; any quantile it returns is within a relative
error ``alpha`` of a value of the true rank (Masson et al., VLDB 2019). Memory is
bounded by ``max_buckets`` (the lowest buckets are merged when it is exceeded, which
only affects the low quantiles we never ask for). ``decay`` lets the sketch follow a
changing distribution: every ``window`` additions all counts are halved.

The tail policy asks for the same high quantile before every addition. Walking down from
the top to it costs a pass over every bucket above it (~50 at p99 of a lognormal latency);
instead the sketch remembers the last high quantile's bucket, with the count below it, and
moves that bucket by one or two steps as values arrive (``_track``). A collapse or a decay
forgets it; the next ask walks again.
"""

from __future__ import annotations

import bisect
import math


class QuantileSketch:
    __slots__ = ("alpha", "_gamma_log", "_buckets", "_keys", "_count", "_zeros", "_max_buckets", "_window",
                 "_since_decay", "_hq", "_hidx", "_hbelow")

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
        # the tracked high quantile: q, the index of its bucket in _keys, and the count below that bucket
        self._hq: float | None = None
        self._hidx = 0
        self._hbelow = 0.0

    @property
    def count(self) -> float:
        return self._count

    def add(self, value: float) -> None:
        if value != value:  # NaN
            return
        if value <= 0:
            self._add_zero()
        else:
            self._add_key(math.ceil(math.log(value) / self._gamma_log))

    def add_above(self, value: float, q: float, min_count: float) -> bool:
        """Add ``value``; return whether it lies above ``upper_bound(q)`` of the values before it, once
        ``min_count`` values were seen (the tail policy's test, in one call: the bucket the value is
        counted in is also what it is compared by, since ``v > gamma**k`` exactly when ``v``'s key is above ``k``)."""
        if value != value:  # NaN
            return False
        if value <= 0:
            self._add_zero()  # never above: every upper bound is >= 0
            return False
        key = math.ceil(math.log(value) / self._gamma_log)
        above = False
        if self._count >= min_count and self._count > 0:
            if q == self._hq and self._keys:  # the tracked quantile (every call but the first): no walk
                rank = q * (self._count - 1)
                at = None if rank < self._zeros else self._track(rank)
            else:
                at = self._key_at(q)
            above = at is None or key > at  # None: the quantile is a zero, whose upper bound is 0.0
        self._add_key(key)
        return above

    def _add_zero(self) -> None:
        self._zeros += 1
        if self._hq is not None:
            self._hbelow += 1  # zeros lie below every bucket
        self._added()

    def _add_key(self, key: int) -> None:
        found = self._buckets.get(key)
        if found is None:
            self._buckets[key] = 1.0
            at = bisect.bisect_left(self._keys, key)
            self._keys.insert(at, key)
            if self._hq is not None and at <= self._hidx:
                self._hidx += 1  # a new bucket below the tracked one
                self._hbelow += 1
            if len(self._keys) > self._max_buckets:
                self._collapse_lowest()
        else:
            self._buckets[key] = found + 1
            if self._hq is not None and key < self._keys[self._hidx]:
                self._hbelow += 1
        self._added()

    def _added(self) -> None:
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
        if q == self._hq:
            return self._track(rank)
        # high quantiles (what the tail policy asks for): walk down from the top; the answer is the
        # highest bucket with at most ``rank`` values below it. Remembered for the next ask.
        keys = self._keys
        above = self._count
        for i in range(len(keys) - 1, -1, -1):
            above -= buckets[keys[i]]  # now: how many lie below this bucket
            if above <= rank:
                self._hq, self._hidx, self._hbelow = q, i, above
                return keys[i]
        return keys[0]

    def _track(self, rank: float) -> int:
        """The tracked quantile's bucket after the additions since the last ask: the highest bucket with
        at most ``rank`` values below it, found by stepping from the remembered one (usually 0-1 steps)."""
        keys, buckets = self._keys, self._buckets
        i, below = self._hidx, self._hbelow
        while below > rank and i > 0:
            i -= 1
            below -= buckets[keys[i]]
        last = len(keys) - 1
        while i < last:
            up = below + buckets[keys[i]]
            if up > rank:
                break
            i += 1
            below = up
        self._hidx, self._hbelow = i, below
        return keys[i]

    def _collapse_lowest(self) -> None:
        self._hq = None  # bucket indices shift: walk again on the next ask
        low = self._keys.pop(0)
        self._buckets[self._keys[0]] += self._buckets.pop(low)

    def _halve(self) -> None:
        self._hq = None  # every count changes: walk again on the next ask
        self._since_decay = 0
        self._zeros /= 2
        self._buckets = {k: c / 2 for k, c in self._buckets.items() if c / 2 >= 0.01}
        self._keys = sorted(self._buckets)
        self._count = self._zeros + sum(self._buckets.values())
