"""Budget policies (upstream ``rate_limiting``, ``bytes_limiting``) and the buckets they and ``composite`` spend.

Time comes from an injected ``clock`` (seconds), so tests drive it.
"""

from __future__ import annotations

from typing import Callable

from .base import NOT_SAMPLED, Decision, OptionError, TraceView, Verdict

Clock = Callable[[], float]


class TokenBucket:
    """Go's ``x/time/rate`` limiter, which upstream's rate policies use: ``rate`` tokens a second, up to
    ``burst``, starting full; ``take(n)`` spends ``n`` if that many are there (never when ``n > burst``)."""

    __slots__ = ("rate", "burst", "_clock", "_tokens", "_last")

    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._last = clock()

    def take(self, n: float) -> bool:
        now = self._clock()
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
        if n <= self._tokens:
            self._tokens -= n
            return True
        return False


class SecondBudget:
    """A composite sub-policy's spans-per-second share: a fixed one-second window, as upstream's composite."""

    __slots__ = ("limit", "_clock", "_second", "_spent")

    def __init__(self, limit: int, clock: Clock) -> None:
        self.limit, self._clock = limit, clock
        self._second, self._spent = -1, 0

    def take(self, spans: int) -> bool:
        second = int(self._clock())
        if second != self._second:
            self._second, self._spent = second, 0
        if self._spent + spans <= self.limit:
            self._spent += spans
            return True
        return False


class RateLimitingPolicy:
    """Keep traces while the span budget allows (upstream ``rate_limiting``): a token bucket of
    ``spans_per_second`` with a burst of twice that, charged a trace's span count.

    It votes SAMPLED only when it has budget, and charges the budget when it does, so put it last
    or inside ``and`` (where it is asked only when the others agreed).
    """

    @staticmethod
    def check(spans_per_second: int) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        if spans_per_second <= 0:
            raise OptionError("spans_per_second", f"must be positive, got {spans_per_second}")

    def __init__(self, spans_per_second: int, clock: Clock, name: str = "rate_limiting") -> None:
        self.check(spans_per_second)
        self.name = name
        self.limit = spans_per_second
        self._bucket = TokenBucket(spans_per_second, 2 * spans_per_second, clock)

    def evaluate(self, trace: TraceView) -> Decision:
        return Decision(Verdict.SAMPLED, self.name) if self._bucket.take(trace.span_count) else NOT_SAMPLED


class BytesLimitingPolicy:
    """Keep traces while the byte budget allows (upstream ``bytes_limiting``): a token bucket of
    ``bytes_per_second`` with ``burst_capacity`` (default twice the rate), charged the trace's encoded
    size (its spans' OTLP bytes, as received). Put it last or inside ``and``, as ``rate_limiting``."""

    @staticmethod
    def check(bytes_per_second: int, burst_capacity: int | None = None) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        if bytes_per_second <= 0:
            raise OptionError("bytes_per_second", f"must be positive, got {bytes_per_second}")
        if burst_capacity is not None and burst_capacity <= 0:
            raise OptionError("burst_capacity", f"must be positive, got {burst_capacity}")

    def __init__(self, bytes_per_second: int, clock: Clock, burst_capacity: int | None = None,
                 name: str = "bytes_limiting") -> None:
        self.check(bytes_per_second, burst_capacity)
        burst = 2 * bytes_per_second if burst_capacity is None else burst_capacity
        self.name = name
        self._bucket = TokenBucket(bytes_per_second, burst, clock)

    def evaluate(self, trace: TraceView) -> Decision:
        return Decision(Verdict.SAMPLED, self.name) if self._bucket.take(trace.size_bytes) else NOT_SAMPLED
