"""Config name -> policy: the one registry, a table with one row per policy type.

Config entries have upstream ``tail_sampling``'s shape, ``{name: ..., type: ..., <type>: {...options}}``;
the option keys are upstream's where the concept is the same (``threshold_ms``, ``sampling_percentage``,
``status_codes``, ``spans_per_second``, ``key``/``values``/``invert_match``, ``min_spans``,
``and_sub_policy``, ``composite_sub_policy``, ...), plus ours (``slo``, ``latency_percentile``,
``error``, ``sdk_decision``, ``first_match``).

Two steps, each done once:
* ``parse_policies`` (at config load) checks every entry against its row - option keys, the type of each
  value as YAML gives it, then the policy class's own ``check`` (its rules live there, once, and its
  constructor applies the same ones) - and returns ``PolicySpec`` trees: validated, immutable, no state;
* ``build`` (when the gateway starts) turns specs into policies with the gateway's clock and SLOs.
Bad config raises ``PolicyConfigError`` naming the policy and the option.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..slo import SLO, SLOTable
from .attributes import BooleanAttributePolicy, NumericAttributePolicy, StringAttributePolicy
from .base import OptionError, Policy
from .composite import AndPolicy, CompositePolicy, DropPolicy, FirstMatchPolicy, NotPolicy
from .limits import BytesLimitingPolicy, RateLimitingPolicy
from .request import (AlwaysSample, ErrorPolicy, LatencyPercentilePolicy, ProbabilisticPolicy, RecordedReasonPolicy,
                      SLOPolicy)
from .trace import LatencyPolicy, SpanCountPolicy, StatusCodePolicy

Clock = Callable[[], float]


class PolicyConfigError(ValueError):
    pass


# -- option kinds: how a config value is checked (``where`` is "<type>.<key>", for the message) ---------------

def _number(v: Any, where: str) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PolicyConfigError(f"{where} must be a number, got {v!r}")
    return v


def _integer(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise PolicyConfigError(f"{where} must be an integer, got {v!r}")
    return v


def _flag(v: Any, where: str) -> bool:
    if not isinstance(v, bool):  # "false" as a string would be truthy
        raise PolicyConfigError(f"{where} must be true or false, got {v!r}")
    return v


def _key(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise PolicyConfigError(f"{where} must be a non-empty string, got {v!r}")
    return v


def _strings(v: Any, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise PolicyConfigError(f"{where} must be a non-empty list of strings, got {v!r}")
    bad = [x for x in v if not isinstance(x, str)]
    if bad:  # YAML reads 200 and true as numbers and booleans; a string attribute never equals those
        raise PolicyConfigError(f"{where} must be strings (quote numbers and booleans), got {bad!r}")
    return tuple(v)


def _list(v: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(v, list):
        raise PolicyConfigError(f"{where} must be a list")
    return tuple(v)


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise PolicyConfigError(f"{where} must be a string, got {v!r}")
    return v


def _one_policy(v: Any, where: str) -> "PolicySpec":
    if not isinstance(v, Mapping):
        raise PolicyConfigError(f"{where} must be one policy")
    return parse_policy(v)


def _policies(v: Any, where: str) -> "tuple[PolicySpec, ...]":
    if not isinstance(v, list) or not v:
        raise PolicyConfigError(f"{where} must be a non-empty list of policies")
    return tuple(parse_policy(e) for e in v)


_OMIT = object()


@dataclass(frozen=True)
class Option:
    """One config option of a policy type: its key, the constructor argument it feeds, how it is checked."""

    key: str
    param: str
    kind: Callable[[Any, str], Any]
    required: bool = False
    convert: Callable[[Any], Any] | None = None  # config unit -> the constructor's (ms -> s, percent -> share)
    default: Any = _OMIT  # passed when the key is absent (else the constructor's own default applies)


@dataclass(frozen=True)
class PolicyType:
    """One row: a config type name, the class it builds, its options."""

    name: str
    cls: type
    options: tuple[Option, ...] = ()
    strict: bool = True  # an unknown option key is an error (a misspelt ``invert_matches`` is not ignored)
    clock: bool = False  # the constructor takes the gateway's clock
    read: "Callable[[Mapping[str, Any], str], dict[str, Any]] | None" = None  # a custom reader of the entry
    arrange: "Callable[[dict[str, Any], str], dict[str, Any]] | None" = None  # options -> constructor arguments

    def param_key(self, param: str) -> str:
        """The config key of a constructor argument (to name it in an error)."""
        for o in self.options:
            if o.param == param:
                return o.key
        return param


@dataclass(frozen=True)
class PolicySpec:
    """A validated config entry: its row, name and constructor arguments (sub-policies as specs)."""

    type: PolicyType
    name: str
    args: tuple[tuple[str, Any], ...]

    def build(self, clock: Clock, default_slo: SLOTable | None) -> Policy:
        args = {}
        for param, value in self.args:
            if isinstance(value, PolicySpec):
                value = value.build(clock, default_slo)
            elif isinstance(value, tuple) and value and isinstance(value[0], PolicySpec):
                value = [v.build(clock, default_slo) for v in value]
            elif value is _DEFAULT_SLO:
                value = default_slo or SLOTable()  # an empty table never matches, as the docs say
            args[param] = value
        if self.type.clock:
            args["clock"] = clock
        return self.type.cls(name=self.name, **args)


_DEFAULT_SLO = object()  # the slo policy without an SLO of its own: the collector's top-level one, at build


def parse_policy(entry: Any) -> PolicySpec:
    """One config entry, validated."""
    if not isinstance(entry, Mapping):
        raise PolicyConfigError(f"each policy must be a mapping with name and type, got {entry!r}")
    name = str(entry.get("name") or entry.get("type") or "")
    kind = entry.get("type")
    row = TYPES.get(str(kind))
    if row is None:
        raise PolicyConfigError(f"policy {name!r}: unknown type {kind!r}; known: {', '.join(sorted(TYPES))}")
    try:
        args = row.read(entry, name) if row.read is not None else _read(row, entry)
        if row.arrange is not None:
            args = row.arrange(args, row.name)
        check = _CHECKS[row.name]
        if check is not None:
            fn, params = check
            fn(**{p: args[p] for p in params if p in args})
    except PolicyConfigError as exc:
        message = str(exc)
        raise PolicyConfigError(message if message.startswith("policy ") else f"policy {name!r}: {message}") from None
    except OptionError as exc:  # the class's own rules: name the config key
        raise PolicyConfigError(f"policy {name!r}: {row.name}.{row.param_key(exc.option)} {exc.problem}") from None
    return PolicySpec(row, name, tuple(args.items()))


def parse_policies(entries: Any) -> tuple[PolicySpec, ...]:
    """A config's ``policies`` list, validated: what the collector's config holds."""
    if not isinstance(entries, (list, tuple)):
        raise PolicyConfigError(f"policies must be a list, got {type(entries).__name__}")
    specs = tuple(parse_policy(e) for e in entries)
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise PolicyConfigError(f"duplicate policy names: {', '.join(sorted(dup))}")
    return specs


def build(specs: Sequence[PolicySpec], clock: Clock = time.monotonic,
          default_slo: SLOTable | None = None) -> list[Policy]:
    """The policies of validated specs, with the clock they read and the SLOs an ``slo`` policy without its own uses."""
    return [s.build(clock, default_slo) for s in specs]


def build_policy(entry: Any, clock: Clock = time.monotonic, default_slo: SLOTable | None = None) -> Policy:
    """One policy from one config entry (parse, then build)."""
    return parse_policy(entry).build(clock, default_slo)


def build_policies(entries: Any, clock: Clock = time.monotonic, default_slo: SLOTable | None = None) -> list[Policy]:
    """Policies from a config's ``policies`` list (parse, then build)."""
    return build(parse_policies(entries), clock, default_slo)


# -- reading an entry ---------------------------------------------------------------------------------------

def _options(entry: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    value = entry.get(kind) or {}
    if not isinstance(value, Mapping):
        raise PolicyConfigError(f"{kind!r} must be a mapping, got {type(value).__name__}")
    return value


def _read(row: PolicyType, entry: Mapping[str, Any]) -> dict[str, Any]:
    o = _options(entry, row.name)
    if row.strict:
        known = {opt.key for opt in row.options}
        unknown = set(o) - known
        if unknown:
            raise PolicyConfigError(f"unknown {row.name} keys {sorted(map(str, unknown))}; "
                                    f"known: {', '.join(sorted(known)) or 'none'}")
    args: dict[str, Any] = {}
    for opt in row.options:
        value = o.get(opt.key)
        where = f"{row.name}.{opt.key}"
        if value is None:
            if opt.required:
                raise PolicyConfigError(f"missing {where}")
            if opt.default is not _OMIT:
                args[opt.param] = opt.default
            continue
        value = opt.kind(value, where)
        args[opt.param] = opt.convert(value) if opt.convert is not None else value
    return args


def _percent(v: float) -> float:
    if not 0 <= v <= 100:
        raise PolicyConfigError(f"probabilistic.sampling_percentage must be within [0, 100], got {v}")
    return v / 100.0


def _read_slo(entry: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``slo: "ttft=0.5,tpot=0.05; model-a: ttft=1"`` or ``{default: {ttft: 0.5}, models: {model-a: {ttft: 1}}}``."""
    raw = entry.get("slo")
    if isinstance(raw, Mapping) and "slo" in raw and "default" not in raw:
        raw = raw["slo"]
    if raw in (None, {}, ""):
        return {"slos": _DEFAULT_SLO}
    try:
        if isinstance(raw, str):
            return {"slos": SLOTable.parse(raw)}
        if isinstance(raw, Mapping):
            default = SLO(**dict(raw.get("default") or {}))
            models = {str(m): SLO(**dict(v)) for m, v in dict(raw.get("models") or {}).items()}
            return {"slos": SLOTable(default, models)}
    except (TypeError, ValueError) as exc:
        raise PolicyConfigError(f"bad slo: {exc}") from None
    raise PolicyConfigError(f"slo must be a string or a mapping, got {raw!r}")


def _arrange_composite(args: dict[str, Any], kind: str) -> dict[str, Any]:
    subs: tuple[PolicySpec, ...] = args["policies"]
    by_name = {s.name: s for s in subs}
    order = list(args.get("order") or [s.name for s in subs])
    missing = [n for n in order if n not in by_name]
    if missing:
        raise PolicyConfigError(f"{kind}.policy_order names unknown sub-policies {missing}")
    alloc: dict[str, float] = {}
    for a in args.get("rate_allocation") or ():
        if isinstance(a, Mapping):
            percent = _number(a.get("percent", 0), f"{kind}.rate_allocation.percent")
            alloc[str(a.get("policy"))] = float(percent)
    return {"max_total_spans_per_second": args["max_total_spans_per_second"],
            "policies": tuple(by_name[n] for n in order), "percents": tuple(alloc.get(n, 0.0) for n in order)}


def _ms(v: float) -> float:
    return v / 1000.0


def _upper_ms(v: float) -> float | None:
    return None if v == 0 else v / 1000.0  # upstream: 0 means no upper bound


def _subs(key: str) -> Option:
    return Option(key, "policies", _policies, required=True)


_ROWS = (
    PolicyType("always_sample", AlwaysSample, strict=False),
    PolicyType("probabilistic", ProbabilisticPolicy, (
        Option("sampling_percentage", "rate", _number, required=True, convert=_percent),), strict=False),
    PolicyType("latency", LatencyPolicy, (
        Option("threshold_ms", "threshold", _number, required=True, convert=_ms),
        Option("upper_threshold_ms", "upper", _number, convert=_upper_ms)), strict=False),
    PolicyType("status_code", StatusCodePolicy, (Option("status_codes", "codes", _list, required=True),), strict=False),
    PolicyType("rate_limiting", RateLimitingPolicy, (
        Option("spans_per_second", "spans_per_second", _number, required=True, convert=int),),
        strict=False, clock=True),
    PolicyType("bytes_limiting", BytesLimitingPolicy, (
        Option("bytes_per_second", "bytes_per_second", _integer, required=True),
        Option("burst_capacity", "burst_capacity", _integer)), clock=True),
    PolicyType("string_attribute", StringAttributePolicy, (
        Option("key", "key", _key, required=True), Option("values", "values", _strings, default=None),
        Option("enabled_regex_matching", "regex", _flag), Option("cache_max_size", "cache_max_size", _integer),
        Option("invert_match", "invert_match", _flag))),
    PolicyType("numeric_attribute", NumericAttributePolicy, (
        Option("key", "key", _key, required=True), Option("min_value", "min_value", _number),
        Option("max_value", "max_value", _number), Option("invert_match", "invert_match", _flag))),
    PolicyType("boolean_attribute", BooleanAttributePolicy, (
        Option("key", "key", _key, required=True), Option("value", "value", _flag, default=None),
        Option("invert_match", "invert_match", _flag))),
    PolicyType("span_count", SpanCountPolicy, (
        Option("min_spans", "min_spans", _integer), Option("max_spans", "max_spans", _integer))),
    PolicyType("and", AndPolicy, (_subs("and_sub_policy"),), strict=False),
    PolicyType("drop", DropPolicy, (_subs("drop_sub_policy"),), strict=False),
    PolicyType("not", NotPolicy, (Option("not_sub_policy", "policy", _one_policy, required=True),), strict=False),
    PolicyType("composite", CompositePolicy, (
        Option("max_total_spans_per_second", "max_total_spans_per_second", _number, required=True, convert=int),
        Option("policy_order", "order", _list), _subs("composite_sub_policy"),
        Option("rate_allocation", "rate_allocation", _list)), strict=False, clock=True, arrange=_arrange_composite),
    PolicyType("first_match", FirstMatchPolicy, (_subs("policies"),), strict=False),
    # ours
    PolicyType("error", ErrorPolicy, strict=False),
    PolicyType("slo", SLOPolicy, read=_read_slo),
    PolicyType("latency_percentile", LatencyPercentilePolicy, (
        Option("quantile", "quantile", _number), Option("measure", "measure", _text),
        Option("min_samples", "min_samples", _integer), Option("alpha", "alpha", _number),
        Option("window", "window", _integer), Option("max_models", "max_models", _integer),
        Option("max_share", "max_share", _number))),
    PolicyType("sdk_decision", RecordedReasonPolicy, (
        Option("reasons", "reasons", _list, convert=lambda rs: tuple(str(r) for r in rs)),), strict=False),
)
TYPES: dict[str, PolicyType] = {row.name: row for row in _ROWS}


def _check_of(cls: type) -> tuple[Callable[..., Any], tuple[str, ...]] | None:
    """A class's ``check`` and the arguments it takes (a subset of the constructor's)."""
    check = getattr(cls, "check", None)
    if check is None:
        return None
    return check, tuple(inspect.signature(check).parameters)


_CHECKS = {row.name: _check_of(row.cls) for row in _ROWS}
