"""Config name -> policy: builds sampling policies from the upstream ``tail_sampling`` config shape.

Each entry is ``{name: ..., type: ..., <type>: {...options}}`` as upstream; the option keys are
upstream's where the concept is the same (``threshold_ms``, ``sampling_percentage``,
``status_codes``, ``spans_per_second``, ``key``/``values``/``invert_match``, ``min_spans``,
``and_sub_policy``, ``composite_sub_policy``, ...), plus
ours (``slo``, ``latency_percentile``, ``error``, ``sdk_decision``, ``first_match``).
Bad config raises ``PolicyConfigError`` naming the policy and the key.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from .policies import (AlwaysSample, AndPolicy, BooleanAttributePolicy, BytesLimitingPolicy, CompositePolicy,
                       DropPolicy, ErrorPolicy, FirstMatchPolicy, LatencyPercentilePolicy, LatencyPolicy, NotPolicy,
                       NumericAttributePolicy, Policy, ProbabilisticPolicy, RateLimitingPolicy, RecordedReasonPolicy,
                       SLOPolicy, SpanCountPolicy, StatusCodePolicy, StringAttributePolicy)
from .slo import SLO, SLOTable

Clock = Callable[[], float]


class PolicyConfigError(ValueError):
    pass


def _opts(entry: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = entry.get(key) or {}
    if not isinstance(value, Mapping):
        raise PolicyConfigError(f"policy {entry.get('name')!r}: {key!r} must be a mapping, got {type(value).__name__}")
    return value


def _num(opts: Mapping[str, Any], key: str, default: Any = None, *, where: str) -> Any:
    value = opts.get(key, default)
    if value is None:
        raise PolicyConfigError(f"policy {where!r}: missing {key!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyConfigError(f"policy {where!r}: {key!r} must be a number, got {value!r}")
    return value


def _slo_table(value: Any, where: str) -> SLOTable:
    """``"ttft=0.5,tpot=0.05; model-a: ttft=1"`` or ``{default: {ttft: 0.5}, models: {model-a: {ttft: 1}}}``."""
    try:
        if isinstance(value, str):
            return SLOTable.parse(value)
        if isinstance(value, Mapping):
            default = SLO(**dict(value.get("default") or {}))
            models = {str(m): SLO(**dict(v)) for m, v in dict(value.get("models") or {}).items()}
            return SLOTable(default, models)
    except (TypeError, ValueError) as exc:
        raise PolicyConfigError(f"policy {where!r}: bad slo: {exc}") from None
    raise PolicyConfigError(f"policy {where!r}: slo must be a string or a mapping, got {value!r}")


def build_policy(entry: Mapping[str, Any], clock: Clock = time.monotonic,
                 default_slo: SLOTable | None = None) -> Policy:
    """One policy from one config entry."""
    if not isinstance(entry, Mapping):
        raise PolicyConfigError(f"each policy must be a mapping with name and type, got {entry!r}")
    name = str(entry.get("name") or entry.get("type") or "")
    kind = entry.get("type")
    builder = _BUILDERS.get(str(kind))
    if builder is None:
        raise PolicyConfigError(f"policy {name!r}: unknown type {kind!r}; known: {', '.join(sorted(_BUILDERS))}")
    try:
        return builder(entry, name, clock, default_slo)
    except PolicyConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise PolicyConfigError(f"policy {name!r}: {exc}") from None


def build_policies(entries: Any, clock: Clock = time.monotonic, default_slo: SLOTable | None = None) -> list[Policy]:
    if not isinstance(entries, list):
        raise PolicyConfigError(f"policies must be a list, got {type(entries).__name__}")
    policies = [build_policy(e, clock, default_slo) for e in entries]
    names = [p.name for p in policies]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise PolicyConfigError(f"duplicate policy names: {', '.join(sorted(dup))}")
    return policies


def _subs(entry: Mapping[str, Any], key: str, sub: str, name: str, clock: Clock, slo: SLOTable | None) -> list[Policy]:
    items = _opts(entry, key).get(sub)
    if not isinstance(items, list) or not items:
        raise PolicyConfigError(f"policy {name!r}: {key}.{sub} must be a non-empty list of policies")
    return [build_policy(e, clock, slo) for e in items]


def _probabilistic(e, name, clock, slo):
    pct = _num(_opts(e, "probabilistic"), "sampling_percentage", where=name)
    if not 0 <= pct <= 100:
        raise PolicyConfigError(f"policy {name!r}: sampling_percentage must be within [0, 100], got {pct}")
    return ProbabilisticPolicy(pct / 100.0, name)


def _latency(e, name, clock, slo):
    o = _opts(e, "latency")
    upper = o.get("upper_threshold_ms")
    return LatencyPolicy(_num(o, "threshold_ms", where=name) / 1000.0,
                         None if upper in (None, 0) else _num(o, "upper_threshold_ms", where=name) / 1000.0, name)


def _status_code(e, name, clock, slo):
    codes = _opts(e, "status_code").get("status_codes")
    if not isinstance(codes, list):
        raise PolicyConfigError(f"policy {name!r}: status_code.status_codes must be a list")
    return StatusCodePolicy(codes, name)


def _rate_limiting(e, name, clock, slo):
    return RateLimitingPolicy(int(_num(_opts(e, "rate_limiting"), "spans_per_second", where=name)), clock, name)


def _bytes_limiting(e, name, clock, slo):
    kind = "bytes_limiting"
    o = _opts(e, kind)
    _only(o, kind, name, {"bytes_per_second", "burst_capacity"})
    rate, burst = _int(o, "bytes_per_second", kind, name), _int(o, "burst_capacity", kind, name)
    if rate is None:
        raise PolicyConfigError(f"policy {name!r}: missing {kind}.bytes_per_second")
    return _built(kind, name, lambda: BytesLimitingPolicy(rate, clock, burst, name))


def _slo(e, name, clock, slo):
    raw = e.get("slo")
    if isinstance(raw, Mapping) and "slo" in raw and "default" not in raw:
        raw = raw["slo"]
    # no SLO of its own: the collector's top-level one (an empty table never matches, which is stated in the docs)
    table = _slo_table(raw, name) if raw not in (None, {}, "") else (slo or SLOTable())
    return SLOPolicy(table, name)


def _percentile(e, name, clock, slo):
    o = dict(_opts(e, "latency_percentile"))
    known = {"quantile", "measure", "min_samples", "alpha", "window", "max_models", "max_share"}
    unknown = set(o) - known
    if unknown:
        raise PolicyConfigError(f"policy {name!r}: unknown latency_percentile keys {sorted(unknown)}")
    return LatencyPercentilePolicy(name=name, **o)


def _sdk_decision(e, name, clock, slo):
    reasons = _opts(e, "sdk_decision").get("reasons") or []
    if not isinstance(reasons, list):
        raise PolicyConfigError(f"policy {name!r}: sdk_decision.reasons must be a list")
    return RecordedReasonPolicy([str(r) for r in reasons], name)


def _not(e, name, clock, slo):
    sub = _opts(e, "not").get("not_sub_policy")
    if not isinstance(sub, Mapping):
        raise PolicyConfigError(f"policy {name!r}: not.not_sub_policy must be one policy")
    return NotPolicy(build_policy(sub, clock, slo), name)


def _composite(e, name, clock, slo):
    o = _opts(e, "composite")
    subs = _subs(e, "composite", "composite_sub_policy", name, clock, slo)
    by_name = {p.name: p for p in subs}
    order = o.get("policy_order") or [p.name for p in subs]
    missing = [n for n in order if n not in by_name]
    if missing:
        raise PolicyConfigError(f"policy {name!r}: policy_order names unknown sub-policies {missing}")
    alloc = {str(a.get("policy")): float(a.get("percent", 0)) for a in (o.get("rate_allocation") or [])
             if isinstance(a, Mapping)}
    total = int(_num(o, "max_total_spans_per_second", where=name))
    return CompositePolicy(total, [by_name[n] for n in order], [alloc.get(n, 0.0) for n in order], clock, name)


# --- attribute and span-count policies: options checked here, so a typo names the policy and the option ---


def _only(o: Mapping[str, Any], kind: str, name: str, known: set[str]) -> None:
    unknown = set(o) - known  # a misspelt option (``invert_matches``) would otherwise be silently ignored
    if unknown:
        raise PolicyConfigError(f"policy {name!r}: unknown {kind} keys {sorted(map(str, unknown))}; "
                                f"known: {', '.join(sorted(known))}")


def _key(o: Mapping[str, Any], kind: str, name: str) -> str:
    key = o.get("key")
    if key is None:
        raise PolicyConfigError(f"policy {name!r}: missing {kind}.key")
    if not isinstance(key, str) or not key:
        raise PolicyConfigError(f"policy {name!r}: {kind}.key must be a non-empty string, got {key!r}")
    return key


def _flag(o: Mapping[str, Any], option: str, kind: str, name: str) -> bool:
    value = o.get(option)
    if value is None:
        return False
    if not isinstance(value, bool):  # "false" as a string would be truthy
        raise PolicyConfigError(f"policy {name!r}: {kind}.{option} must be true or false, got {value!r}")
    return value


def _int(o: Mapping[str, Any], option: str, kind: str, name: str) -> int | None:
    value = o.get(option)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise PolicyConfigError(f"policy {name!r}: {kind}.{option} must be an integer, got {value!r}")
    return value


def _built(kind: str, name: str, make: Callable[[], Policy]) -> Policy:
    try:
        return make()
    except ValueError as exc:  # the constructor's own checks (bad regex, min > max): add where it was
        raise PolicyConfigError(f"policy {name!r}: {kind}: {exc}") from None


def _string_attribute(e, name, clock, slo):
    kind = "string_attribute"
    o = _opts(e, kind)
    _only(o, kind, name, {"key", "values", "enabled_regex_matching", "cache_max_size", "invert_match"})
    key = _key(o, kind, name)
    values = o.get("values")
    if not isinstance(values, list) or not values:
        raise PolicyConfigError(f"policy {name!r}: {kind}.values must be a non-empty list of strings, got {values!r}")
    bad = [v for v in values if not isinstance(v, str)]
    if bad:  # YAML reads 200 and true as numbers and booleans; a string attribute never equals those
        raise PolicyConfigError(f"policy {name!r}: {kind}.values must be strings (quote numbers and booleans), "
                                f"got {bad!r}")
    regex = _flag(o, "enabled_regex_matching", kind, name)
    cache = _int(o, "cache_max_size", kind, name) or 0
    invert = _flag(o, "invert_match", kind, name)
    return _built(kind, name, lambda: StringAttributePolicy(key, values, regex, cache, invert, name))


def _numeric_attribute(e, name, clock, slo):
    kind = "numeric_attribute"
    o = _opts(e, kind)
    _only(o, kind, name, {"key", "min_value", "max_value", "invert_match"})
    key = _key(o, kind, name)
    low, high = o.get("min_value"), o.get("max_value")
    for option, value in (("min_value", low), ("max_value", high)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise PolicyConfigError(f"policy {name!r}: {kind}.{option} must be a number, got {value!r}")
    if low is None and high is None:
        raise PolicyConfigError(f"policy {name!r}: {kind} needs min_value, max_value or both")
    invert = _flag(o, "invert_match", kind, name)
    return _built(kind, name, lambda: NumericAttributePolicy(key, low, high, invert, name))


def _boolean_attribute(e, name, clock, slo):
    kind = "boolean_attribute"
    o = _opts(e, kind)
    _only(o, kind, name, {"key", "value", "invert_match"})
    key = _key(o, kind, name)
    value = o.get("value")
    if not isinstance(value, bool):  # required: upstream's silent default (false) is easy to get by accident
        raise PolicyConfigError(f"policy {name!r}: {kind}.value must be true or false, got {value!r}")
    invert = _flag(o, "invert_match", kind, name)
    return _built(kind, name, lambda: BooleanAttributePolicy(key, value, invert, name))


def _span_count(e, name, clock, slo):
    kind = "span_count"
    o = _opts(e, kind)
    _only(o, kind, name, {"min_spans", "max_spans"})
    low, high = _int(o, "min_spans", kind, name), _int(o, "max_spans", kind, name)
    if low is None and high is None:  # neither bound keeps every trace: an always_sample in disguise
        raise PolicyConfigError(f"policy {name!r}: {kind} needs min_spans, max_spans or both")
    return _built(kind, name, lambda: SpanCountPolicy(low or 0, high, name))


_BUILDERS: dict[str, Callable[..., Policy]] = {
    "always_sample": lambda e, name, clock, slo: AlwaysSample(name),
    "probabilistic": _probabilistic,
    "latency": _latency,
    "status_code": _status_code,
    "rate_limiting": _rate_limiting,
    "bytes_limiting": _bytes_limiting,
    "string_attribute": _string_attribute,
    "numeric_attribute": _numeric_attribute,
    "boolean_attribute": _boolean_attribute,
    "span_count": _span_count,
    "and": lambda e, name, clock, slo: AndPolicy(_subs(e, "and", "and_sub_policy", name, clock, slo), name),
    "drop": lambda e, name, clock, slo: DropPolicy(_subs(e, "drop", "drop_sub_policy", name, clock, slo), name),
    "not": _not,
    "composite": _composite,
    "first_match": lambda e, name, clock, slo: FirstMatchPolicy(
        _subs(e, "first_match", "policies", name, clock, slo), name),
    # ours
    "error": lambda e, name, clock, slo: ErrorPolicy(name),
    "slo": _slo,
    "latency_percentile": _percentile,
    "sdk_decision": _sdk_decision,
}

POLICY_TYPES: tuple[str, ...] = tuple(sorted(_BUILDERS))
