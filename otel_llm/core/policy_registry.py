"""Config name -> policy: builds sampling policies from the upstream ``tail_sampling`` config shape.

Each entry is ``{name: ..., type: ..., <type>: {...options}}`` as upstream; the option keys are
upstream's where the concept is the same (``threshold_ms``, ``sampling_percentage``,
``status_codes``, ``spans_per_second``, ``and_sub_policy``, ``composite_sub_policy``, ...), plus
ours (``slo``, ``latency_percentile``, ``error``, ``sdk_decision``, ``first_match``).
Bad config raises ``PolicyConfigError`` naming the policy and the key.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from .policies import (AlwaysSample, AndPolicy, CompositePolicy, DropPolicy, ErrorPolicy, FirstMatchPolicy,
                       LatencyPercentilePolicy, LatencyPolicy, NotPolicy, Policy, ProbabilisticPolicy,
                       RateLimitingPolicy, RecordedReasonPolicy, SLOPolicy, StatusCodePolicy)
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


_BUILDERS: dict[str, Callable[..., Policy]] = {
    "always_sample": lambda e, name, clock, slo: AlwaysSample(name),
    "probabilistic": _probabilistic,
    "latency": _latency,
    "status_code": _status_code,
    "rate_limiting": _rate_limiting,
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
