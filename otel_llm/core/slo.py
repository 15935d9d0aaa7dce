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
    """Latency objectives in seconds; ``None`` means no objective on that measure."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        for key in _KEYS:
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"SLO {key} must be a positive number of seconds, got {value!r}")
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

    @classmethod
    def parse(cls, text: str) -> "SLO":
        """Parse ``"ttft=0.5,tpot=0.05,e2e=10"`` (seconds; ``ms`` suffix allowed)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in _KEYS:
                raise ValueError(f"bad SLO term {part!r}: expected one of ttft=, tpot=, e2e=")
            values[key] = _seconds(raw.strip())
        return cls(**values)


def _seconds(raw: str) -> float:
    try:
        if raw.endswith("ms"):
            return float(raw[:-2]) / 1000.0
        if raw.endswith("s"):
            return float(raw[:-1])
        return float(raw)
    except ValueError:
        raise ValueError(f"bad SLO value {raw!r}: expected seconds, e.g. 0.5 or 500ms") from None


@dataclass(frozen=True)
class SLOTable:
    """A default SLO plus per-model overrides (an override replaces the default whole)."""

    default: SLO = field(default_factory=SLO)
    per_model: Mapping[str, SLO] = field(default_factory=dict)

    def for_model(self, model: str | None) -> SLO:
        if model is not None:
            found = self.per_model.get(model)
            if found is not None:
                return found
        return self.default

    @property
    def empty(self) -> bool:
        return self.default == SLO() and not self.per_model

    @classmethod
    def parse(cls, text: str) -> "SLOTable":
        """Parse ``"ttft=0.5,tpot=0.05; llama-70b: ttft=2"``: a bare term list is the default."""
        default = SLO()
        per_model: dict[str, SLO] = {}
        for section in filter(None, (s.strip() for s in text.split(";"))):
            head, sep, rest = section.partition(":")
            if sep and "=" not in head:
                per_model[head.strip()] = SLO.parse(rest)
            else:
                default = SLO.parse(section)
        return cls(default, per_model)

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
        if isinstance(value, Mapping):
            items = dict(value)
            default = items.pop("*", SLO())
            return cls(default, items)
        raise TypeError(f"slo must be an SLO, a mapping of model to SLO, or a string, not {type(value).__name__}")
