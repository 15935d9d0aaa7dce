"""The frontend's control messages to its agent (``CONFIG``, ``ENGINE``), declared once, with named fields.

``ConfigRecord``: an instrumentation's options and the exporters the agent builds (once per
``instrument()``, and again to a restarted agent); ``EngineRecord``: an engine's shape for the step
diagnosis. Both cross a process boundary, so no pickle: a message is ``marshal`` of
``(kind, version, {field: value})`` with built-in values only, read back by name, each value checked
against its field's declared types (records.py's rules: a reader ignores fields it does not know, a missing
field with a default gets it, a version above the reader's is refused; ``RecordError`` for anything else).
``(CONFIG, version, None)`` says the instrumentation ended.

The options travel as ``core.config.Config``'s fields by name (``config_fields``/``config_from``): a field
added there travels with no change here; its type is read from ``Config``'s annotations, and the three that
are not built-in values (the SLO table, the tenant source, a detail level) have their wire form below.
"""

from __future__ import annotations

import marshal
import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from ..core.config import OPTIONS, Config, Detail
from ..core.diagnosis.anatomy import EngineFacts
from ..core.diagnosis.roofline import ModelShape
from ..core.slo import SLO, SLOTable
from ..core.tenant import TenantSource
from . import bounded_marshal
from .destinations import Destinations
from .protocol import CONFIG, ENGINE
from .records import RecordError

MAX_CONTROL = 1 << 20  # a message's bytes (a resource's attributes, an SLO table per model ...)

_NONE = type(None)
_NUM = (int, float)
_OPT_NUM = (int, float, _NONE)
_SPAN_TRANSPORTS = ("http", "grpc")


@dataclass(slots=True)
class ConfigRecord:
    """``CONFIG``: what an instrumentation hands its agent."""

    VERSION: ClassVar[int] = 1

    options: dict[str, Any]  # Config's fields by name, in their wire form (config_fields)
    spans: list[tuple[str, float | None]]  # per span processor: transport (http, grpc), batch delay s (None: at once)
    metrics: list[tuple[str, float]]  # per metric reader: transport, export interval in ms
    resource: dict[str, Any] = field(default_factory=dict)  # the resource's attributes
    schema_url: str = ""


@dataclass(slots=True)
class EngineRecord:
    """``ENGINE``: an engine built in the frontend (core.diagnosis.anatomy.EngineFacts)."""

    VERSION: ClassVar[int] = 1

    on_cuda: bool
    devices: int = 1
    max_loras: int | None = None
    kv_cache: dict[str, Any] = field(default_factory=dict)  # step-span attributes (kv_cache_facts)
    model: dict[str, Any] | None = None  # the roofline's ModelShape, field by field (None: unknown)


_KINDS: dict[int, type] = {CONFIG: ConfigRecord, ENGINE: EngineRecord}
_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    ConfigRecord: {"options": (dict,), "spans": (list, tuple), "metrics": (list, tuple), "resource": (dict,),
                   "schema_url": (str,)},
    EngineRecord: {"on_cuda": (bool,), "devices": (int,), "max_loras": (int, _NONE), "kv_cache": (dict,),
                   "model": (dict, _NONE)},
}
_NAMES = {cls: tuple(f.name for f in fields(cls)) for cls in _KINDS.values()}
_ATTRIBUTE_VALUES = (str, bool, int, float)


# -- the messages ----------------------------------------------------------------------------------------

def config_message(config: Config, destinations: Destinations) -> bytes:
    return _encode(ConfigRecord(config_fields(config), [tuple(s) for s in destinations.spans],
                                [tuple(m) for m in destinations.metrics], dict(destinations.resource),
                                destinations.schema_url))


def release_message() -> bytes:
    """The instrumentation ended: the agent sends what it holds and drops its pipeline."""
    return marshal.dumps((CONFIG, ConfigRecord.VERSION, None))


def engine_message(facts: EngineFacts) -> bytes:
    model = facts.model
    return _encode(EngineRecord(bool(facts.on_cuda), int(facts.devices), facts.max_loras, dict(facts.kv_cache),
                                {f.name: getattr(model, f.name) for f in fields(ModelShape)}
                                if model is not None else None))


def read(m: tuple) -> ConfigRecord | EngineRecord | None:
    """The record of a control message (unpacked by ``protocol.unpack``); None for a ``CONFIG`` that ends
    the instrumentation. RecordError for anything else."""
    if len(m) != 3 or not isinstance(m[1], int) or isinstance(m[1], bool):
        raise RecordError("control message of another shape")
    kind, version, values = m
    cls = _KINDS.get(kind) if isinstance(kind, int) else None
    if cls is None:
        raise RecordError(f"control message of unknown kind {kind}")
    if version > cls.VERSION or version < 1:
        raise RecordError(f"{cls.__name__} version {version}, this reader knows up to {cls.VERSION}")
    if values is None and cls is ConfigRecord:
        return None
    if not isinstance(values, dict):
        raise RecordError(f"{cls.__name__} of another shape")
    types = _TYPES[cls]
    known = {}
    for name, value in values.items():
        accepted = types.get(name) if isinstance(name, str) else None
        if accepted is None:
            continue  # a field a newer writer added
        _check(f"{cls.__name__}.{name}", value, accepted)
        known[name] = value
    try:
        return cls(**known)
    except TypeError as exc:  # a required field missing
        raise RecordError(f"{cls.__name__}: {exc}") from None


def setup_of(r: ConfigRecord) -> tuple[Config, Destinations]:
    """The options and destinations a ``ConfigRecord`` carries, each value checked (RecordError)."""
    spans = []
    for item in r.spans:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and item[0] in _SPAN_TRANSPORTS):
            raise RecordError(f"ConfigRecord.spans: {item!r:.80}")
        _check("ConfigRecord.spans delay", item[1], _OPT_NUM)
        spans.append((item[0], item[1]))
    metrics = []
    for item in r.metrics:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and item[0] in _SPAN_TRANSPORTS):
            raise RecordError(f"ConfigRecord.metrics: {item!r:.80}")
        _check("ConfigRecord.metrics interval", item[1], _NUM)
        metrics.append((item[0], float(item[1])))
    resource = {}
    for k, v in r.resource.items():
        if not isinstance(k, str):
            raise RecordError("ConfigRecord.resource: a key that is not a string")
        if isinstance(v, (list, tuple)):
            if not all(isinstance(x, _ATTRIBUTE_VALUES) for x in v):
                raise RecordError(f"ConfigRecord.resource[{k!r:.40}]: not attribute values")
            v = tuple(v)
        elif not isinstance(v, _ATTRIBUTE_VALUES):
            raise RecordError(f"ConfigRecord.resource[{k!r:.40}]: {type(v).__name__}")
        resource[k] = v
    return config_from(r.options), Destinations(spans, metrics, resource, r.schema_url)


def engine_of(r: EngineRecord) -> EngineFacts:
    """The ``EngineFacts`` an ``EngineRecord`` carries (RecordError for a model shape that is not one)."""
    model = None
    if r.model is not None:
        shape = {}
        for f in fields(ModelShape):
            if f.name in r.model:
                value = r.model[f.name]
                _check(f"EngineRecord.model.{f.name}", value, (bool,) if f.type in ("bool", bool) else (int,))
                shape[f.name] = value
        try:
            model = ModelShape(**shape)
        except TypeError as exc:
            raise RecordError(f"EngineRecord.model: {exc}") from None
    kv_cache = {}
    for k, v in r.kv_cache.items():
        if not isinstance(k, str) or not isinstance(v, _ATTRIBUTE_VALUES):
            raise RecordError("EngineRecord.kv_cache: not an attribute")
        kv_cache[k] = v
    return EngineFacts(model, r.on_cuda, r.devices, r.max_loras, kv_cache)


# -- Config, field by field ------------------------------------------------------------------------------

def config_fields(config: Config) -> dict[str, Any]:
    """``config``'s fields by name, as built-in values."""
    out: dict[str, Any] = {}
    for f in fields(Config):
        value = getattr(config, f.name)
        if isinstance(value, SLOTable):
            value = _slo_table(value)
        elif isinstance(value, TenantSource):
            value = (value.kind, value.header, value.fixed)
        elif isinstance(value, Detail):
            value = int(value)
        out[f.name] = value
    return out


def config_from(options: dict[str, Any]) -> Config:
    """The ``Config`` of ``config_fields``: each known field checked against its declared type and then by its
    option's own parser (its range, its choices), as a value given in code would be; a field this reader
    does not know is ignored, a field not sent keeps its default."""
    hints = _config_hints()
    values: dict[str, Any] = {}
    for name, value in options.items():
        hint = hints.get(name) if isinstance(name, str) else None
        if hint is None:
            continue
        where = f"ConfigRecord.options.{name}"
        if hint is SLOTable:
            values[name] = _slo_table_from(where, value)
        elif hint is TenantSource:
            if not (isinstance(value, (list, tuple)) and len(value) == 3
                    and all(isinstance(x, (str, _NONE)) for x in value)):
                raise RecordError(f"{where}: not a tenant source")
            values[name] = TenantSource(*value)
        elif hint is Detail:
            _check(where, value, (int,))
            try:
                values[name] = Detail(value)
            except ValueError:
                raise RecordError(f"{where}: no detail {value}") from None
        else:
            _check(where, value, _accepted(hint))
            values[name] = value
        if values[name] is not None:
            try:
                values[name] = _PARSERS[name](values[name])
            except (TypeError, ValueError) as exc:
                raise RecordError(f"{where}: {exc}") from None
    return Config(**values)


_PARSERS = {o.name: o.parse for o in OPTIONS}


def _config_hints() -> dict[str, Any]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in fields(Config)}


def _accepted(hint: Any) -> tuple[type, ...]:
    """The built-in types a field's annotation allows (``float`` takes an int, as Python's numbers do)."""
    args = typing.get_args(hint) or (hint,)
    out: list[type] = []
    for a in args:
        out.append(_NONE if a is None else a)
        if a is float:
            out.append(int)
    return tuple(out)


def _slo_table(t: SLOTable) -> dict[str, Any]:
    return {"default": _slo(t.default), "per_model": {m: _slo(s) for m, s in t.per_model.items()},
            "per_tenant": {k: _slo(s) for k, s in t.per_tenant.items()},
            "per_model_tenant": [(m, k, _slo(s)) for (m, k), s in t.per_model_tenant.items()]}


def _slo(s: SLO) -> tuple:
    return (s.ttft, s.tpot, s.e2e, s.goodput)


def _slo_from(where: str, value: Any) -> SLO:
    if not (isinstance(value, (list, tuple)) and len(value) == 4):
        raise RecordError(f"{where}: not an SLO")
    for x in value:
        _check(where, x, _OPT_NUM)
    try:
        return SLO(*value)
    except ValueError as exc:
        raise RecordError(f"{where}: {exc}") from None


def _slo_table_from(where: str, value: Any) -> SLOTable:
    if not isinstance(value, dict):
        raise RecordError(f"{where}: not an SLO table")
    per_model, per_tenant = value.get("per_model", {}), value.get("per_tenant", {})
    pairs = value.get("per_model_tenant", [])
    if not (isinstance(per_model, dict) and isinstance(per_tenant, dict) and isinstance(pairs, (list, tuple))):
        raise RecordError(f"{where}: not an SLO table")
    if not all(isinstance(k, str) for k in (*per_model, *per_tenant)):
        raise RecordError(f"{where}: a key that is not a string")
    by_pair = {}
    for item in pairs:
        if not (isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[0], str)
                and isinstance(item[1], str)):
            raise RecordError(f"{where}: not a (model, tenant, SLO)")
        by_pair[(item[0], item[1])] = _slo_from(where, item[2])
    return SLOTable(_slo_from(where, value.get("default", (None,) * 4)),
                    {m: _slo_from(where, s) for m, s in per_model.items()},
                    {k: _slo_from(where, s) for k, s in per_tenant.items()}, by_pair)


# -- the wire ----------------------------------------------------------------------------------------------

def decode(data: bytes) -> ConfigRecord | EngineRecord | None:
    """The control record in ``data`` (``read``'s answer); RecordError for anything else."""
    if len(data) > MAX_CONTROL:
        raise RecordError(f"control message of {len(data)} bytes")
    try:
        m = bounded_marshal.loads(data)  # (a length past the end is refused before it is allocated)
    except (EOFError, ValueError, TypeError) as exc:
        raise RecordError(f"control message unreadable: {exc}") from None
    if not isinstance(m, tuple) or not m:
        raise RecordError("control message of another shape")
    return read(m)


def _encode(record: ConfigRecord | EngineRecord) -> bytes:
    kind = CONFIG if isinstance(record, ConfigRecord) else ENGINE
    data = marshal.dumps((kind, record.VERSION, {name: getattr(record, name) for name in _NAMES[type(record)]}))
    if len(data) > MAX_CONTROL:
        raise RecordError(f"{type(record).__name__} of {len(data)} bytes")
    return data


def _check(where: str, value: Any, accepted: tuple[type, ...]) -> None:
    # bool is an int to isinstance: refused where only numbers are declared
    if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
        raise RecordError(f"{where}: {type(value).__name__}")
