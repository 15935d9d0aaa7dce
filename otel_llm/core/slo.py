"""Service-level objectives and the check of one request against them.

A request is "good" (counts towards goodput) when it meets every SLO that applies to
its model at once. The same check runs in the SDK and in the collector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .. import semconv as sc
from .summary import RequestSummary

_KEYS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class SLO:
    """Latency objectives in seconds; ``None`` means no objective on that measure. ``goodput``: the target
    share of good requests (meeting every objective at once), e.g. 0.99; what the alert rules
    (views/alerts.py) burn against. It does not judge a request: only the thresholds do."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    goodput: float | None = None

    def __post_init__(self) -> None:
        for key in _KEYS:
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"SLO {key} must be a positive number of seconds, got {value!r}")
        if self.goodput is not None and not 0.0 < self.goodput < 1.0:
            raise ValueError(f"SLO goodput must be a share strictly between 0 and 1 (e.g. 0.99), got {self.goodput!r}")
        # the objectives that are set, once: the collector checks every request, usually against one or two
        object.__setattr__(self, "_limits", tuple((k, getattr(self, k)) for k in _KEYS if getattr(self, k) is not None))
        # and as a request span's attributes, built once: a kept request's span copies them
        object.__setattr__(self, "span_attributes", {sc.SLO_THRESHOLDS[k]: v for k, v in self._limits})  # type: ignore[attr-defined]

    def breaches(self, summary: RequestSummary) -> tuple[str, ...]:
        """Names of the objectives this request missed; a measure it lacks cannot breach."""
        out: tuple[str, ...] = ()
        for key, limit in self._limits:  # type: ignore[attr-defined]
            value = getattr(summary, key)
            if value is not None and value > limit:
                out += (key,)
        return out

    @property
    def objectives(self) -> tuple[str, ...]:
        """The latency objectives that are set (ttft, tpot, e2e), in that order."""
        return tuple(k for k, _ in self._limits)  # type: ignore[attr-defined]

    @classmethod
    def parse(cls, text: str) -> "SLO":
        """Parse ``"ttft=0.5,tpot=0.05,e2e=10,goodput=0.99"`` (seconds, ``ms`` suffix allowed; goodput a share,
        or a percentage with ``%``)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip().lower()
            if sep and key == GOODPUT:
                values[key] = _share(raw.strip())
                continue
            if not sep or key not in _KEYS:
                raise ValueError(f"bad SLO term {part!r}: expected one of ttft=, tpot=, e2e=, goodput=")
            values[key] = _seconds(raw.strip())
        return cls(**values)


GOODPUT = "goodput"


def _share(raw: str) -> float:
    try:
        return float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"bad SLO goodput {raw!r}: expected a share, e.g. 0.99 or 99%") from None


def _seconds(raw: str) -> float:
    try:
        if raw.endswith("ms"):
            return float(raw[:-2]) / 1000.0
        if raw.endswith("s"):
            return float(raw[:-1])
        return float(raw)
    except ValueError:
        raise ValueError(f"bad SLO value {raw!r}: expected seconds, e.g. 0.5 or 500ms") from None


TENANT_MARK = "@"  # a section head ``@team-a`` (a tenant) or ``model@team-a`` (a tenant on one model)


@dataclass(frozen=True)
class SLOTable:
    """A default SLO plus overrides per model, per tenant and per (model, tenant). An override replaces the
    default whole; the most specific one wins: ``model@tenant``, then ``@tenant``, then ``model``, then the
    default. A tenant's SLO wins over its model's because it is the contract with that team: a platform that
    wants a model's objective for every tenant sets no tenant SLO (or a ``model@tenant`` one)."""

    default: SLO = field(default_factory=SLO)
    per_model: Mapping[str, SLO] = field(default_factory=dict)
    per_tenant: Mapping[str, SLO] = field(default_factory=dict)
    per_model_tenant: Mapping[tuple[str, str], SLO] = field(default_factory=dict)

    def for_model(self, model: str | None) -> SLO:
        if model is not None:
            found = self.per_model.get(model)
            if found is not None:
                return found
        return self.default

    def for_request(self, model: str | None, tenant: str | None) -> SLO:
        """The SLO of a request of ``model`` from ``tenant`` (its label value): see the class's order."""
        if tenant is not None and (self.per_tenant or self.per_model_tenant):
            found = self.per_model_tenant.get((model, tenant)) if model is not None else None  # type: ignore[arg-type]
            if found is None:
                found = self.per_tenant.get(tenant)
            if found is not None:
                return found
        return self.for_model(model)

    @property
    def empty(self) -> bool:
        return self.default == SLO() and not self.per_model and not self.per_tenant and not self.per_model_tenant

    def scopes(self) -> list[tuple[str | None, str | None, SLO]]:
        """Every (model, tenant, SLO) the table declares, the default first as (None, None, SLO)."""
        return ([(None, None, self.default)] + [(m, None, s) for m, s in self.per_model.items()]
                + [(None, t, s) for t, s in self.per_tenant.items()]
                + [(m, t, s) for (m, t), s in self.per_model_tenant.items()])

    @classmethod
    def parse(cls, text: str) -> "SLOTable":
        """Parse ``"ttft=0.5,tpot=0.05,goodput=0.99; llama-70b: ttft=2; @team-a: tpot=0.03,goodput=0.999;
        llama-70b@team-b: e2e=20"``: a bare term list is the default; ``@tenant`` a tenant's, ``model@tenant``
        a tenant's on one model."""
        default = SLO()
        per_model: dict[str, SLO] = {}
        per_tenant: dict[str, SLO] = {}
        per_model_tenant: dict[tuple[str, str], SLO] = {}
        for section in filter(None, (s.strip() for s in text.split(";"))):
            head, sep, rest = section.partition(":")
            if sep and "=" not in head:
                model, mark, tenant = head.strip().rpartition(TENANT_MARK) if TENANT_MARK in head else (
                    head.strip(), "", "")
                model, tenant = model.strip(), tenant.strip()
                if mark and not tenant:
                    raise ValueError(f"bad SLO section {section!r}: a tenant after {TENANT_MARK!r}, e.g. @team-a:")
                if mark and model:
                    per_model_tenant[(model, tenant)] = SLO.parse(rest)
                elif mark:
                    per_tenant[tenant] = SLO.parse(rest)
                else:
                    per_model[model] = SLO.parse(rest)
            else:
                default = SLO.parse(section)
        return cls(default, per_model, per_tenant, per_model_tenant)

    @classmethod
    def coerce(cls, value: "SLOTable | SLO | Mapping[str, SLO] | str | None") -> "SLOTable":
        if value is None:
            return cls()
        if isinstance(value, SLOTable):
            return value
        if isinstance(value, SLO):
            return cls(value)
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, Mapping):  # "*": the default, "@t": a tenant's, "m@t": a tenant's on model m
            items = dict(value)
            default = items.pop("*", SLO())
            return cls.parse_keys(default, items)
        raise TypeError(f"slo must be an SLO, a mapping of model to SLO, or a string, not {type(value).__name__}")

    @classmethod
    def parse_keys(cls, default: SLO, items: Mapping[str, SLO]) -> "SLOTable":
        per_model: dict[str, SLO] = {}
        per_tenant: dict[str, SLO] = {}
        per_model_tenant: dict[tuple[str, str], SLO] = {}
        for key, slo in items.items():
            model, mark, tenant = key.rpartition(TENANT_MARK) if TENANT_MARK in key else (key, "", "")
            if mark and model:
                per_model_tenant[(model, tenant)] = slo
            elif mark:
                per_tenant[tenant] = slo
            else:
                per_model[model] = slo
        return cls(default, per_model, per_tenant, per_model_tenant)
