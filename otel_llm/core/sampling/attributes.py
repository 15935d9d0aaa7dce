"""Attribute policies (upstream ``string_attribute``, ``numeric_attribute``, ``boolean_attribute``)."""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from .base import NOT_SAMPLED, Decision, OptionError, TraceView, Verdict

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
        raise OptionError("key", f"must be a non-empty string, got {key!r}")
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

    @staticmethod
    def check(key: str, values: Sequence[str], regex: bool = False) -> tuple[re.Pattern[str], ...]:
        """The arguments' rules (the registry checks a config with them too); the compiled patterns."""
        _check_key(key)
        if isinstance(values, str) or not values or not all(isinstance(v, str) for v in values):
            raise OptionError("values", f"must be a non-empty list of strings, got {values!r}")
        compiled = []
        for v in values if regex else ():
            try:
                compiled.append(re.compile(v))
            except re.error as exc:  # not a ValueError: say which pattern, in the registry's terms
                raise OptionError("values", f"has a bad regex {v!r}: {exc}") from None
        return tuple(compiled)

    def __init__(self, key: str, values: Sequence[str], regex: bool = False, cache_max_size: int = 0,
                 invert_match: bool = False, name: str = "string_attribute") -> None:
        patterns = self.check(key, values, regex)
        self.key = key
        self.name = name
        self.invert_match = invert_match
        self.attribute_keys = frozenset((key,))
        self._exact: frozenset[str] | None = None
        self._patterns: tuple[re.Pattern[str], ...] = patterns
        if not regex:
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

    @staticmethod
    def check(key: str, min_value: float | None = None, max_value: float | None = None) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        _check_key(key)
        for label, bound in (("min_value", min_value), ("max_value", max_value)):
            if bound is not None and (not _is_number(bound) or math.isnan(bound)):
                raise OptionError(label, f"must be a number, got {bound!r}")
        if min_value is None and max_value is None:
            raise OptionError("min_value", "or max_value is needed: numeric_attribute needs min_value, "
                                           "max_value or both")
        if min_value is not None and max_value is not None and min_value > max_value:
            raise OptionError("min_value", f"must be <= max_value, got {min_value} > {max_value}")

    def __init__(self, key: str, min_value: float | None = None, max_value: float | None = None,
                 invert_match: bool = False, name: str = "numeric_attribute") -> None:
        self.check(key, min_value, max_value)
        self.key = key
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

    @staticmethod
    def check(key: str, value: bool) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        _check_key(key)
        if not isinstance(value, bool):  # required: upstream's silent default (false) is easy to get by accident
            raise OptionError("value", f"must be true or false, got {value!r}")

    def __init__(self, key: str, value: bool, invert_match: bool = False, name: str = "boolean_attribute") -> None:
        self.check(key, value)
        self.key = key
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
