"""Sampling policies: small evaluators behind one interface, shared by the SDK and the collector.

The SDK evaluates one finished request (a ``TraceView`` holding its summary); the
collector evaluates a buffered trace (a ``TraceView`` holding every request summary
found in it). The same classes decide in both places.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from .quantile import QuantileSketch
from .slo import SLOTable
from .summary import RequestSummary


class Verdict(enum.Enum):
    SAMPLED = "sampled"
    NOT_SAMPLED = "not_sampled"
    DROPPED = "dropped"  # an explicit drop; wins over every other vote


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str = ""

    @property
    def sampled(self) -> bool:
        return self.verdict is Verdict.SAMPLED


NOT_SAMPLED = Decision(Verdict.NOT_SAMPLED)


@dataclass(slots=True)
class TraceView:
    """What a policy may look at: the trace id, its request summaries, and trace-wide facts."""

    trace_id: int
    summaries: Sequence[RequestSummary] = ()
    has_error: bool = False
    span_count: int = 1
    duration: float | None = None  # trace-wide, seconds; None when unknown
    recorded_reasons: Sequence[str] = field(default_factory=tuple)  # llm.sampling.reason set by the SDK
    # attribute key -> every value seen for it on the trace's spans and their resources (in arrival order);
    # filled only for the keys some policy names in its ``attribute_keys`` (the collector reads nothing else)
    attributes: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    size_bytes: int = 0  # the trace's spans as encoded OTLP (what bytes_limiting charges); 0 when unknown


class Policy(Protocol):
    name: str

    def evaluate(self, trace: TraceView) -> Decision: ...


def attribute_keys(policies: Sequence[Policy]) -> frozenset[str]:
    """Every attribute key the given policies (and their sub-policies) read from ``TraceView.attributes``.

    The collector collects values only for these keys, so a policy that reads attributes must
    declare them. Composites declare the union of their children; a wrapper that does not
    declare ``attribute_keys`` is looked into through its ``policies`` / ``policy``, so a
    hand-written composite still gets its children's keys collected.
    """
    keys: set[str] = set()
    for p in policies:
        declared = getattr(p, "attribute_keys", None)
        if declared is not None:
            keys.update(declared)
            continue
        children = list(getattr(p, "policies", ()) or ())
        child = getattr(p, "policy", None)
        if child is not None:
            children.append(child)
        if children:
            keys.update(attribute_keys(children))
    return frozenset(keys)


class ErrorPolicy:
    """Keep traces in which a request failed or was aborted, or a span has ERROR status."""

    def __init__(self, name: str = "error") -> None:
        self.name = name

    def evaluate(self, trace: TraceView) -> Decision:
        if trace.has_error:
            return Decision(Verdict.SAMPLED, self.name)
        for s in trace.summaries:  # a loop, not any(<generator>): this runs for every trace
            if s.failed:
                return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class SLOPolicy:
    """Keep traces in which any request breached one of its model's SLOs."""

    def __init__(self, slos: SLOTable, name: str = "slo_breach") -> None:
        self.name = name
        self.slos = slos

    def evaluate(self, trace: TraceView) -> Decision:
        for s in trace.summaries:
            missed = self.slos.for_model(s.model).breaches(s)
            if missed:
                return Decision(Verdict.SAMPLED, f"{self.name}:{'+'.join(missed)}")
        return NOT_SAMPLED


class LatencyPercentilePolicy:
    """Keep requests slower than the rolling ``quantile`` of their model's ``measure``.

    Each model has its own sketch (relative error ``alpha``); a value is compared before
    it is added. Until ``min_samples`` requests of a model were seen the policy abstains,
    so a cold start does not keep everything. Latencies of requests served together are
    correlated (a slow batch is slow for all of them), so "slower than p99" can hold for
    far more than 1% at a time: the policy keeps at most ``max_share`` of what it evaluates
    (default twice its nominal share, over a decaying window of about ``1/decay`` requests).
    """

    def __init__(
        self,
        quantile: float = 0.99,
        measure: str = "e2e",
        min_samples: int = 50,
        alpha: float = 0.01,
        window: int = 10_000,
        max_models: int = 256,
        max_share: float | None = None,
        name: str | None = None,
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if measure not in ("e2e", "ttft", "tpot", "queue", "prefill", "decode"):
            raise ValueError(f"unknown latency measure {measure!r}")
        self.quantile = quantile
        self.measure = measure
        self.min_samples = min_samples
        self.alpha = alpha
        self.window = window
        self.max_models = max_models
        self.max_share = 2 * (1 - quantile) if max_share is None else max_share
        if not 0 < self.max_share <= 1:
            raise ValueError(f"max_share must be within (0, 1], got {self.max_share}")
        self.name = name or f"slow_p{quantile * 100:g}"
        self._sketches: dict[str | None, QuantileSketch] = {}
        self._seen = 0.0  # decayed counts of evaluated and kept traces, for the share cap
        self._kept = 0.0
        self._decay = 1.0 - 1.0 / max(100.0, 10.0 / self.max_share)

    def threshold(self, model: str | None) -> float | None:
        sketch = self._sketches.get(model)
        if sketch is None or sketch.count < self.min_samples:
            return None
        # the bucket's upper edge, not its midpoint: a request as fast as the quantile is not "slower"
        return sketch.upper_bound(self.quantile)

    def evaluate(self, trace: TraceView) -> Decision:
        keep = False
        for s in trace.summaries:
            value = getattr(s, self.measure)
            if value is None:
                continue
            sketch = self._sketches.get(s.model) or self._sketch(s.model)
            if sketch.add_above(value, self.quantile, self.min_samples):  # value > threshold(), then counted
                keep = True
        self._seen = self._seen * self._decay + 1.0
        if keep and self._kept + 1.0 > self.max_share * self._seen:
            keep = False  # over its share: a correlated burst, already represented by what was kept
        self._kept = self._kept * self._decay + (1.0 if keep else 0.0)
        return Decision(Verdict.SAMPLED, self.name) if keep else NOT_SAMPLED

    def _sketch(self, model: str | None) -> QuantileSketch:
        sketch = self._sketches.get(model)
        if sketch is None:
            if len(self._sketches) >= self.max_models:  # bound memory against unbounded model names
                self._sketches.pop(next(iter(self._sketches)))
            sketch = self._sketches[model] = QuantileSketch(self.alpha, window=self.window)
        return sketch


_RATIO_BITS = 56


class ProbabilisticPolicy:
    """Keep a fixed share of traces, decided from the trace id so every process agrees.

    Uses the low 56 bits of the trace id (random under W3C trace context level 2), as the
    OpenTelemetry consistent-probability samplers do.
    """

    def __init__(self, rate: float, name: str = "baseline") -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"sampling rate must be within [0, 1], got {rate}")
        self.name = name
        self.rate = rate
        self._bound = int(rate * (1 << _RATIO_BITS))

    def evaluate(self, trace: TraceView) -> Decision:
        if (trace.trace_id & ((1 << _RATIO_BITS) - 1)) < self._bound:
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class AlwaysSample:
    def __init__(self, name: str = "always") -> None:
        self.name = name

    def evaluate(self, trace: TraceView) -> Decision:
        return Decision(Verdict.SAMPLED, self.name)


def first_match(policies: Sequence[Policy], trace: TraceView, on_error: "callable | None" = None) -> Decision:
    """Run policies in order; an explicit drop wins, else the first SAMPLED vote.

    A policy that raises is "no vote" (reported through ``on_error``), never a crash.
    """
    chosen = NOT_SAMPLED
    sampled, dropped = Verdict.SAMPLED, Verdict.DROPPED
    for policy in policies:
        try:
            decision = policy.evaluate(trace)
        except Exception as exc:  # a broken policy must not break the pipeline
            if on_error is not None:
                on_error(policy, exc)
            continue
        if decision is NOT_SAMPLED:  # the shared "no": most votes
            continue
        verdict = decision.verdict
        if verdict is dropped:
            return decision
        if verdict is sampled and chosen is NOT_SAMPLED:
            chosen = decision
    return chosen


# --- Policies added for the collector (the upstream tail_sampling vocabulary) -------------------
# Each is a small evaluator behind the same ``evaluate(trace) -> Decision`` interface; the config
# names that map to them live in ``policy_registry``.


class LatencyPolicy:
    """Keep traces whose trace-wide duration is at least ``threshold`` (and below ``upper``, if given).

    Same meaning as upstream ``latency`` (``threshold_ms`` / ``upper_threshold_ms``); a trace of
    unknown duration cannot match.
    """

    def __init__(self, threshold: float, upper: float | None = None, name: str = "latency") -> None:
        if threshold < 0 or (upper is not None and upper <= threshold):
            raise ValueError(f"latency needs 0 <= threshold < upper_threshold, got {threshold}, {upper}")
        self.name = name
        self.threshold = threshold
        self.upper = upper

    def evaluate(self, trace: TraceView) -> Decision:
        d = trace.duration
        if d is not None and d >= self.threshold and (self.upper is None or d <= self.upper):
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class StatusCodePolicy:
    """Keep traces with a span of one of ``codes`` (``ERROR``, ``OK``, ``UNSET``), as upstream ``status_code``.

    The trace view only says whether a span errored (or a request failed), so ``OK``/``UNSET``
    match traces with no error at all.
    """

    _CODES = ("ERROR", "OK", "UNSET")

    def __init__(self, codes: Sequence[str], name: str = "status_code") -> None:
        bad = [c for c in codes if str(c).upper() not in self._CODES]
        if not codes or bad:
            raise ValueError(f"status_codes must be a non-empty list of {', '.join(self._CODES)}; got {list(codes)}")
        self.name = name
        self.codes = frozenset(str(c).upper() for c in codes)

    def evaluate(self, trace: TraceView) -> Decision:
        error = trace.has_error or any(s.failed for s in trace.summaries)
        if ("ERROR" in self.codes) if error else bool(self.codes & {"OK", "UNSET"}):
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class RecordedReasonPolicy:
    """Honour the decision the SDK recorded: keep a trace whose request span carries ``llm.sampling.reason``.

    ``reasons`` limits it to some reasons (prefix match, so ``slo_breach`` matches
    ``slo_breach:ttft``); empty means any recorded reason.
    """

    def __init__(self, reasons: Sequence[str] = (), name: str = "sdk_decision") -> None:
        self.name = name
        self.reasons = tuple(reasons)

    def evaluate(self, trace: TraceView) -> Decision:
        for r in trace.recorded_reasons:
            if not self.reasons or any(r.startswith(p) for p in self.reasons):
                return Decision(Verdict.SAMPLED, f"{self.name}:{r}")
        return NOT_SAMPLED


class _TokenBucket:
    """Go's ``x/time/rate`` limiter, which upstream's rate policies use: ``rate`` tokens a second, up to
    ``burst``, starting full; ``take(n)`` spends ``n`` if that many are there (never when ``n > burst``)."""

    __slots__ = ("rate", "burst", "_clock", "_tokens", "_last")

    def __init__(self, rate: float, burst: float, clock: "Callable[[], float]") -> None:
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


class RateLimitingPolicy:
    """Keep traces while the span budget allows (upstream ``rate_limiting``): a token bucket of
    ``spans_per_second`` with a burst of twice that, charged a trace's span count. Time comes from
    ``clock`` (seconds), so tests drive it.

    It votes SAMPLED only when it has budget, and charges the budget when it does, so put it last
    or inside ``and`` (where it is asked only when the others agreed).
    """

    def __init__(self, spans_per_second: int, clock: "Callable[[], float]", name: str = "rate_limiting") -> None:
        if spans_per_second <= 0:
            raise ValueError(f"spans_per_second must be positive, got {spans_per_second}")
        self.name = name
        self.limit = spans_per_second
        self._bucket = _TokenBucket(spans_per_second, 2 * spans_per_second, clock)

    def evaluate(self, trace: TraceView) -> Decision:
        return Decision(Verdict.SAMPLED, self.name) if self._bucket.take(trace.span_count) else NOT_SAMPLED


class BytesLimitingPolicy:
    """Keep traces while the byte budget allows (upstream ``bytes_limiting``): a token bucket of
    ``bytes_per_second`` with ``burst_capacity`` (default twice the rate), charged the trace's encoded
    size (its spans' OTLP bytes, as received). Put it last or inside ``and``, as ``rate_limiting``."""

    def __init__(self, bytes_per_second: int, clock: "Callable[[], float]", burst_capacity: int | None = None,
                 name: str = "bytes_limiting") -> None:
        if bytes_per_second <= 0:
            raise ValueError(f"bytes_per_second must be positive, got {bytes_per_second}")
        burst = 2 * bytes_per_second if burst_capacity is None else burst_capacity
        if burst <= 0:
            raise ValueError(f"burst_capacity must be positive, got {burst_capacity}")
        self.name = name
        self._bucket = _TokenBucket(bytes_per_second, burst, clock)

    def evaluate(self, trace: TraceView) -> Decision:
        return Decision(Verdict.SAMPLED, self.name) if self._bucket.take(trace.size_bytes) else NOT_SAMPLED


class _SecondBudget:
    """A composite sub-policy's spans-per-second share: a fixed one-second window, as upstream's composite."""

    __slots__ = ("limit", "_clock", "_second", "_spent")

    def __init__(self, limit: int, clock: "Callable[[], float]") -> None:
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


# --- Attribute and span-count policies (upstream string/numeric/boolean_attribute, span_count) -------
# They read ``TraceView.attributes[key]``: every value the key has on the trace's spans and resources.
# As upstream, a trace matches when ANY of those values matches. With ``invert_match`` the policy keeps
# a trace when NO value matches, and so keeps a trace that lacks the key entirely (upstream's config
# doc: "if the specified Key does not match any resource or span attributes, data will be sampled").
# Upstream once answered InvertSampled / InvertNotSampled, and an InvertNotSampled vetoed every other
# policy's keep; that was deprecated (feature gate ``disableinvertdecisions``, PR #39833) and the gate
# went stable and was removed (PR #48976), so today an inverted policy votes plain Sampled / NotSampled.
# We do the same and add no verdict: to veto, put the non-inverted policy under ``drop``.

def _keep(matched: bool, invert: bool, name: str) -> Decision:
    return Decision(Verdict.SAMPLED, name) if matched is not invert else NOT_SAMPLED


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    return key


_DEFAULT_REGEX_CACHE = 128  # upstream's defaultCacheSize, used when cache_max_size <= 0


class StringAttributePolicy:
    """Keep traces where attribute ``key`` has one of ``values`` (upstream ``string_attribute``).

    Exact match by default; with ``regex`` each value is a pattern matched anywhere in the
    string (``re.search``: upstream calls Go's ``Regexp.MatchString``, which is unanchored too,
    so write ``^...$`` for a whole-string match). Regex results are cached per attribute value,
    at most ``cache_max_size`` entries (default 128, as upstream), evicting the oldest entry
    first: upstream evicts the least recently used, which would cost a reorder on every hit.

    Where we differ from upstream, and why:
    - patterns are Python ``re``, not Go RE2: the common syntax is the same, but Python also
      accepts look-around and back-references, and spells end-of-text ``\\Z`` (RE2: ``\\z``);
    - only ``str`` values are compared. Upstream reads any other type (int, bool, array) as ""
      through ``Value.Str()``, which can never equal a configured value, so exact matching
      agrees; a regex that matches "" (``.*``) would match a non-string resource attribute
      upstream and does not here;
    - empty strings never match: upstream skips "" on spans but not on resources; the view
      here does not say where a value came from, so we skip it everywhere;
    - arrays are not searched element by element (upstream does not either: an array reads as "").
    """

    def __init__(self, key: str, values: Sequence[str], regex: bool = False, cache_max_size: int = 0,
                 invert_match: bool = False, name: str = "string_attribute") -> None:
        self.key = _check_key(key)
        if isinstance(values, str) or not values or not all(isinstance(v, str) for v in values):
            raise ValueError(f"values must be a non-empty list of strings, got {values!r}")
        self.name = name
        self.invert_match = invert_match
        self.attribute_keys = frozenset((key,))
        self._exact: frozenset[str] | None = None
        self._patterns: tuple[re.Pattern[str], ...] = ()
        if regex:
            compiled = []
            for v in values:
                try:
                    compiled.append(re.compile(v))
                except re.error as exc:  # not a ValueError: say which pattern, in the registry's terms
                    raise ValueError(f"bad regex {v!r} in values: {exc}") from None
            self._patterns = tuple(compiled)
        else:
            self._exact = frozenset(v for v in values if v)  # upstream drops "" from the exact set
        self._cache: dict[str, bool] = {}
        self._cache_max = cache_max_size if cache_max_size > 0 else _DEFAULT_REGEX_CACHE

    def _matches(self, value: str) -> bool:
        if self._exact is not None:
            return value in self._exact
        cache = self._cache
        hit = cache.get(value)
        if hit is None:
            hit = False
            for pattern in self._patterns:
                if pattern.search(value):
                    hit = True
                    break
            if len(cache) >= self._cache_max:
                try:
                    del cache[next(iter(cache))]  # oldest first: dicts keep insertion order
                except (StopIteration, KeyError, RuntimeError):
                    pass  # another thread evicted at the same moment; the bound still holds
            cache[value] = hit
        return hit

    def evaluate(self, trace: TraceView) -> Decision:
        matched = False
        for v in trace.attributes.get(self.key) or ():
            if isinstance(v, str) and v and self._matches(v):
                matched = True
                break
        return _keep(matched, self.invert_match, self.name)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class NumericAttributePolicy:
    """Keep traces where attribute ``key`` is within ``[min_value, max_value]`` (upstream ``numeric_attribute``).

    Bounds are inclusive; either may be omitted (no bound on that side, as upstream since the
    fix for #41562), but not both.

    Where we differ from upstream, and why: upstream reads the value with ``Value.Int()``, so
    only int64 attributes work and every other type (a double, a string, a bool, an array)
    reads as 0, which then matches any range that contains 0. We compare ints and floats by
    value (LLM attributes such as temperature or top_p are doubles) and ignore every other
    type (bools too, though Python counts them as ints): a value that is not a number neither
    matches nor, under ``invert_match``, blocks. Bounds may be floats as well.
    """

    def __init__(self, key: str, min_value: float | None = None, max_value: float | None = None,
                 invert_match: bool = False, name: str = "numeric_attribute") -> None:
        self.key = _check_key(key)
        if min_value is None and max_value is None:
            raise ValueError("numeric_attribute needs min_value, max_value or both")
        for label, bound in (("min_value", min_value), ("max_value", max_value)):
            if bound is not None and (not _is_number(bound) or math.isnan(bound)):
                raise ValueError(f"{label} must be a number, got {bound!r}")
        if min_value is not None and max_value is not None and min_value > max_value:
            raise ValueError(f"min_value must be <= max_value, got {min_value} > {max_value}")
        self.name = name
        self.min_value = min_value
        self.max_value = max_value
        self.invert_match = invert_match
        self.attribute_keys = frozenset((key,))
        self._low = -math.inf if min_value is None else min_value
        self._high = math.inf if max_value is None else max_value

    def evaluate(self, trace: TraceView) -> Decision:
        matched = False
        low, high = self._low, self._high
        for v in trace.attributes.get(self.key) or ():
            if _is_number(v) and low <= v <= high:  # NaN compares false: never in range
                matched = True
                break
        return _keep(matched, self.invert_match, self.name)


class BooleanAttributePolicy:
    """Keep traces where attribute ``key`` is the boolean ``value`` (upstream ``boolean_attribute``).

    Where we differ from upstream, and why: upstream reads the value with ``Value.Bool()``,
    which gives ``false`` for any non-boolean attribute, so ``value: false`` matches a string
    or int attribute of that key. Here only real booleans count (``1`` is not ``True``).
    """

    def __init__(self, key: str, value: bool, invert_match: bool = False, name: str = "boolean_attribute") -> None:
        self.key = _check_key(key)
        if not isinstance(value, bool):
            raise ValueError(f"value must be true or false, got {value!r}")
        self.name = name
        self.value = value
        self.invert_match = invert_match
        self.attribute_keys = frozenset((key,))

    def evaluate(self, trace: TraceView) -> Decision:
        matched = False
        want = self.value
        for v in trace.attributes.get(self.key) or ():
            if v is want:  # identity: bools are singletons, and 1 == True must not count
                matched = True
                break
        return _keep(matched, self.invert_match, self.name)


class SpanCountPolicy:
    """Keep traces with ``min_spans <= span count <= max_spans`` (upstream ``span_count``).

    ``max_spans`` 0 or omitted means no upper bound, as upstream. The count is of the spans
    received so far when the decision is made, as upstream. Unlike upstream we reject
    ``max_spans < min_spans`` (upstream accepts it and then never samples).
    """

    def __init__(self, min_spans: int = 0, max_spans: int | None = None, name: str = "span_count") -> None:
        for label, bound in (("min_spans", min_spans), ("max_spans", max_spans)):
            if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
                raise ValueError(f"{label} must be a non-negative integer, got {bound!r}")
        if max_spans and max_spans < min_spans:
            raise ValueError(f"max_spans must be >= min_spans (or 0 for no limit), got {max_spans} < {min_spans}")
        self.name = name
        self.min_spans = min_spans
        self.max_spans = max_spans or None

    def evaluate(self, trace: TraceView) -> Decision:
        n = trace.span_count
        if n >= self.min_spans and (self.max_spans is None or n <= self.max_spans):
            return Decision(Verdict.SAMPLED, self.name)
        return NOT_SAMPLED


class AndPolicy:
    """Keep only if every sub-policy votes SAMPLED (upstream ``and``); evaluation stops at the first no."""

    def __init__(self, policies: Sequence[Policy], name: str = "and") -> None:
        if not policies:
            raise ValueError("and needs at least one sub-policy")
        self.name = name
        self.policies = tuple(policies)
        self.attribute_keys = attribute_keys(self.policies)

    def evaluate(self, trace: TraceView) -> Decision:
        for p in self.policies:
            d = p.evaluate(trace)
            if not d.sampled:
                return NOT_SAMPLED
        return Decision(Verdict.SAMPLED, self.name)


class NotPolicy:
    """Invert one sub-policy (upstream ``not``): SAMPLED becomes NOT_SAMPLED and back; a drop stays a drop."""

    def __init__(self, policy: Policy, name: str = "not") -> None:
        self.name = name
        self.policy = policy
        self.attribute_keys = attribute_keys([policy])

    def evaluate(self, trace: TraceView) -> Decision:
        d = self.policy.evaluate(trace)
        if d.verdict is Verdict.DROPPED:
            return d
        return NOT_SAMPLED if d.sampled else Decision(Verdict.SAMPLED, self.name)


class DropPolicy:
    """Explicitly drop when every sub-policy votes SAMPLED (upstream ``drop``); a drop wins over any keep."""

    def __init__(self, policies: Sequence[Policy], name: str = "drop") -> None:
        self.name = name
        self.match = AndPolicy(policies, name)
        self.attribute_keys = self.match.attribute_keys

    def evaluate(self, trace: TraceView) -> Decision:
        if self.match.evaluate(trace).sampled:
            return Decision(Verdict.DROPPED, self.name)
        return NOT_SAMPLED


class FirstMatchPolicy:
    """Composite: run sub-policies in order, first SAMPLED wins, an explicit drop wins over all."""

    def __init__(self, policies: Sequence[Policy], name: str = "first_match") -> None:
        if not policies:
            raise ValueError("first_match needs at least one sub-policy")
        self.name = name
        self.policies = tuple(policies)
        self.attribute_keys = attribute_keys(self.policies)

    def evaluate(self, trace: TraceView) -> Decision:
        return first_match(self.policies, trace)


class CompositePolicy:
    """Upstream ``composite``: sub-policies in order, each with a share of ``max_total_spans_per_second``.

    As upstream's ``composite.go``: the first sub-policy that votes SAMPLED decides; the trace is kept
    if that sub-policy's spans in the current second (a fixed one-second window) stay within its
    share, and not kept otherwise (a later sub-policy is not asked; a smaller trace may still fit).
    """

    def __init__(self, max_total_spans_per_second: int, policies: Sequence[Policy], percents: Sequence[float],
                 clock: "Callable[[], float]", name: str = "composite") -> None:
        if len(policies) != len(percents) or not policies:
            raise ValueError("composite needs one rate_allocation percent per sub-policy")
        if any(p < 0 for p in percents) or sum(percents) > 100:
            raise ValueError(f"composite rate_allocation percents must be >= 0 and sum to <= 100, got {list(percents)}")
        self.name = name
        self.policies = tuple(policies)
        self.attribute_keys = attribute_keys(self.policies)
        self.limits = tuple(_SecondBudget(max(1, int(max_total_spans_per_second * p / 100)), clock) for p in percents)

    def evaluate(self, trace: TraceView) -> Decision:
        for policy, limit in zip(self.policies, self.limits):
            d = policy.evaluate(trace)
            if d.verdict is Verdict.DROPPED:
                return d
            if d.sampled:
                return Decision(Verdict.SAMPLED, f"{self.name}:{d.reason}") if limit.take(trace.span_count) \
                    else NOT_SAMPLED
        return NOT_SAMPLED
