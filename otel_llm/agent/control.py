"""Every message on the agent link, declared once, with named fields and a version.

What the frontend tells its agent and what the agent answers (agent/protocol.py says what travels how):

* per request, where the frontend is its requests' source (an engine off the one path:
  docs/design/enginecore-source.md): ``StartRecord`` (``START``), and its finish, the engine's own numbers
  (``FactsRecord``, ``FACTS``) or, for an engine without statistics, the frontend's summary
  (``FinishRecord``, ``FINISH``);
* control: ``ConfigRecord`` (an instrumentation's options and the exporters the agent builds, once per
  ``instrument()`` and again to a restarted agent), ``ReleaseRecord`` (the instrumentation ended),
  ``EngineRecord`` (an engine's shape for the step diagnosis), ``RingRecord`` (the frontend's first
  message: its shared-memory ring, or none), ``FlushRecord`` and ``StatsRecord`` (each answered by a
  ``ReplyRecord`` with the same token), ``ReadyRecord`` (the agent's first message: it is up).

(The Python frontend's ``RequestEnrichment`` on the one path is a request record of records.py, read by its
reader.) The wire form is records.py's with a tag of its own: one tag byte (``TAG``), one kind byte, then
``marshal`` of ``(version, {field: value})``. Built-in values only (no pickle), read back by name (no
positional unpacking), each value checked against its field's declared types (records.py's rules: a reader
ignores fields it does not know, a missing field with a default gets it, a version above the reader's is
refused; ``RecordError`` for anything else, a message of another form, e.g. a positional tuple, included).
Nested values (a request's events, token times, the summary's fields, the options) are checked where the
record is turned into what it carries (agent/protocol.py for a request's, ``setup_of`` and ``engine_of``
here for the control records').

The options travel as ``core.config.Config``'s fields by name (``config_fields``/``config_from``): a field
added there travels with no change here; its type is read from ``Config``'s annotations, and the three that
are not built-in values (the SLO table, the tenant source, a detail level) have their wire form below.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from ..core.config import OPTIONS, Config, Detail
from ..core.diagnosis.anatomy import EngineFacts
from ..core.diagnosis.roofline import ModelShape
from ..core.slo import SLO, SLOTable
from ..core.tenant import TenantSource
from .destinations import Destinations
from .declared import ATTRIBUTE_VALUES, Codec, RecordError, attribute_value

TAG = 0xC1  # the first byte (records.py's request records start with 0xD0, the doorbell is one 0x00 byte)
# the second byte: which record
START, FINISH, CONFIG, ENGINE, FLUSH, STATS, READY, REPLY, FACTS, RING, RELEASE = range(1, 12)
MAX_CONTROL = 1 << 20  # a message's bytes (a finish's token times, a resource's attributes, an SLO table ...)

_NONE = type(None)
_STR = (str,)
_OPT_STR = (str, _NONE)
_NUM = (int, float)
_OPT_NUM = (int, float, _NONE)
_INT = (int,)
_OPT_INT = (int, _NONE)
_BOOL = (bool,)
_SEQ = (list, tuple)
_OPT_SEQ = (list, tuple, _NONE)
_SPAN_TRANSPORTS = ("http", "grpc")


# -- a request's start and finish (the frontend as its requests' source) -----------------------------

@dataclass(slots=True)
class StartRecord:
    """``START``: a request the frontend took (core.timeline.RequestTimeline's facts at its start)."""

    VERSION: ClassVar[int] = 1

    request_id: str
    arrival: float  # wall clock, seconds since the epoch
    model: str | None = None
    operation: str = "text_completion"
    provider: str | None = None
    kind: int = 0  # its span's kind, OpenTelemetry's SpanKind value (0: INTERNAL, 1: SERVER)
    # the parent span context (none: trace_id None)
    trace_id: bytes | None = None  # 16 bytes, big-endian
    span_id: int = 0
    trace_flags: int = 0
    remote: bool = False
    trace_state: str = ""  # W3C tracestate header
    response_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)  # request attributes (span attribute values)
    input_tokens: int | None = None
    lora_name: str | None = None
    lora_id: int | None = None
    steps_give_tokens: bool = False  # its token times come from the engine's steps (not stamped)
    prompt_text: str | None = None  # captured content (capture_content only)
    group_id: str | None = None  # n > 1: the user request this sequence belongs to
    group_size: int = 0  # n, as the user asked
    group_expected: int = 0  # sequences tracked (n, less those refused over max_requests)
    choice_index: int | None = None


@dataclass(slots=True)
class FactsRecord:
    """``FACTS``: a finish as the engine's own numbers (core.finish_facts.FinishFacts and its EngineStats,
    field by field): the summary is made in the agent."""

    VERSION: ClassVar[int] = 1

    request_id: str
    reason: str
    end: float  # wall clock of the output batch that finished it
    arrival: float  # the frontend's arrival (wall), where the engine has none
    events: list[tuple[int, float]] = field(default_factory=list)  # (kind, engine monotonic stamp) pairs
    cache_sources: tuple[int, int] | None = None  # cached prompt tokens: (local prefix cache, KV connector)
    cached_tokens: int | None = None
    output_characters: int | None = None
    output_text: str | None = None  # captured content (capture_content only)
    # what the start said, for the metrics of a finish whose start never reached the agent
    model: str | None = None
    operation: str = "text_completion"
    provider: str | None = None
    input_tokens: int | None = None
    # the engine's statistics (EngineStats; 0: a stamp not taken): wall clock, then engine monotonic
    engine_arrival: float = 0.0
    queued: float = 0.0
    scheduled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0
    first_token_latency: float = 0.0  # seconds, as the engine measured it
    generation_tokens: int = 0
    preemptions: int | None = None  # None: the engine release does not count them
    first_output: float = 0.0  # wall clock: when the frontend received its first and last output (0.0: none)
    last_output: float = 0.0


@dataclass(slots=True)
class FinishRecord:
    """``FINISH``: a finish as the frontend's summary (an engine without statistics; stamped token times)."""

    VERSION: ClassVar[int] = 1

    request_id: str
    summary: dict[str, Any]  # core.summary.RequestSummary's fields by name (gaps: made in the agent)
    tracked: bool = True  # False: a request the frontend did not track (over max_requests): metrics only
    reason: str | None = None
    error_type: str | None = None
    events: list[tuple[int, float]] = field(default_factory=list)
    token_ts: list[float] = field(default_factory=list)  # engine monotonic stamps of its outputs
    multi_token_steps: dict[int, int] | None = None  # index in token_ts -> tokens, only when > 1
    token_window: dict[str, Any] | None = None  # core.step_tokens.TokenWindow's fields by name
    cache_sources: tuple[int, int] | None = None
    output_text: str | None = None
    spec: list[int] | None = None  # speculative decoding: verify steps, draft tokens, accepted drafts
    first_output: float | None = None  # wall clock
    last_output: float | None = None


# -- control -----------------------------------------------------------------------------------------------

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
class ReleaseRecord:
    """``RELEASE``: the instrumentation ended: the agent sends what it holds and drops its pipeline."""

    VERSION: ClassVar[int] = 1


@dataclass(slots=True)
class EngineRecord:
    """``ENGINE``: an engine built in the frontend (core.diagnosis.anatomy.EngineFacts)."""

    VERSION: ClassVar[int] = 1

    on_cuda: bool
    devices: int = 1
    max_loras: int | None = None
    kv_cache: dict[str, Any] = field(default_factory=dict)  # step-span attributes (kv_cache_facts)
    model: dict[str, Any] | None = None  # the roofline's ModelShape, field by field (None: unknown)


@dataclass(slots=True)
class RingRecord:
    """``RING``: the frontend's first message, with the ring's memory file descriptor where it has one: the
    shared-memory ring (otel_llm/shm_ring.py) every later message goes through, or None (packets)."""

    VERSION: ClassVar[int] = 1

    announcement: bytes | None = None  # shm_ring.RingWriter.announcement()


@dataclass(slots=True)
class FlushRecord:
    """``FLUSH``: send what you hold within ``timeout`` seconds; answered by a ``ReplyRecord`` (``ok``)."""

    VERSION: ClassVar[int] = 1

    token: int
    timeout: float  # seconds, at most MAX_FLUSH_S


MAX_FLUSH_S = 3600.0  # the longest flush a frontend asks for (a longer timeout is cut to it; the agent refuses one)


@dataclass(slots=True)
class StatsRecord:
    """``STATS``: your counts; answered by a ``ReplyRecord`` (``stats``)."""

    VERSION: ClassVar[int] = 1

    token: int


@dataclass(slots=True)
class ReadyRecord:
    """``READY``: the agent's first message, when it is up (its step socket bound)."""

    VERSION: ClassVar[int] = 1

    pid: int


@dataclass(slots=True)
class ReplyRecord:
    """``REPLY``: the agent's answer to the ``FlushRecord`` or ``StatsRecord`` with the same ``token``."""

    VERSION: ClassVar[int] = 1

    token: int
    ok: bool = False  # a flush: everything sent in time
    stats: dict[str, Any] | None = None  # stats: the agent's counts (ints, and its errors by site)


Record = (StartRecord | FactsRecord | FinishRecord | ConfigRecord | ReleaseRecord | EngineRecord | RingRecord
          | FlushRecord | StatsRecord | ReadyRecord | ReplyRecord)

_KINDS: dict[int, type] = {START: StartRecord, FACTS: FactsRecord, FINISH: FinishRecord, CONFIG: ConfigRecord,
                           RELEASE: ReleaseRecord, ENGINE: EngineRecord, RING: RingRecord, FLUSH: FlushRecord,
                           STATS: StatsRecord, READY: ReadyRecord, REPLY: ReplyRecord}
# each field's accepted types on the wire (checked before a record is made; nested values where the record is
# turned into what it carries)
_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    StartRecord: {"request_id": _STR, "arrival": _NUM, "model": _OPT_STR, "operation": _STR,
                  "provider": _OPT_STR, "kind": _INT, "trace_id": (bytes, _NONE), "span_id": _INT,
                  "trace_flags": _INT, "remote": _BOOL, "trace_state": _STR, "response_id": _OPT_STR,
                  "attributes": (dict,), "input_tokens": _OPT_INT, "lora_name": _OPT_STR, "lora_id": _OPT_INT,
                  "steps_give_tokens": _BOOL, "prompt_text": _OPT_STR, "group_id": _OPT_STR,
                  "group_size": _INT, "group_expected": _INT, "choice_index": _OPT_INT},
    FactsRecord: {"request_id": _STR, "reason": _STR, "end": _NUM, "arrival": _NUM, "events": _SEQ,
                  "cache_sources": _OPT_SEQ, "cached_tokens": _OPT_INT, "output_characters": _OPT_INT,
                  "output_text": _OPT_STR, "model": _OPT_STR, "operation": _STR, "provider": _OPT_STR,
                  "input_tokens": _OPT_INT, "engine_arrival": _NUM, "queued": _NUM, "scheduled": _NUM,
                  "first_token": _NUM, "last_token": _NUM, "first_token_latency": _NUM,
                  "generation_tokens": _INT, "preemptions": _OPT_INT, "first_output": _NUM,
                  "last_output": _NUM},
    FinishRecord: {"request_id": _STR, "summary": (dict,), "tracked": _BOOL, "reason": _OPT_STR,
                   "error_type": _OPT_STR, "events": _SEQ, "token_ts": _SEQ, "multi_token_steps": (dict, _NONE),
                   "token_window": (dict, _NONE), "cache_sources": _OPT_SEQ, "output_text": _OPT_STR,
                   "spec": _OPT_SEQ, "first_output": _OPT_NUM, "last_output": _OPT_NUM},
    ConfigRecord: {"options": (dict,), "spans": _SEQ, "metrics": _SEQ, "resource": (dict,), "schema_url": _STR},
    ReleaseRecord: {},
    EngineRecord: {"on_cuda": _BOOL, "devices": _INT, "max_loras": _OPT_INT, "kv_cache": (dict,),
                   "model": (dict, _NONE)},
    RingRecord: {"announcement": (bytes, _NONE)},
    FlushRecord: {"token": _INT, "timeout": _NUM},
    StatsRecord: {"token": _INT},
    ReadyRecord: {"pid": _INT},
    ReplyRecord: {"token": _INT, "ok": _BOOL, "stats": (dict, _NONE)},
}
CODEC = Codec(TAG, _KINDS, _TYPES, MAX_CONTROL, "agent link record",
              "not a record of the agent link (a message of another form)")


# -- the messages ----------------------------------------------------------------------------------------

def config_message(config: Config, destinations: Destinations) -> bytes:
    return encode(ConfigRecord(config_fields(config), [tuple(s) for s in destinations.spans],
                               [tuple(m) for m in destinations.metrics], dict(destinations.resource),
                               destinations.schema_url))


def release_message() -> bytes:
    """The instrumentation ended: the agent sends what it holds and drops its pipeline."""
    return encode(ReleaseRecord())


def engine_message(facts: EngineFacts) -> bytes:
    model = facts.model
    return encode(EngineRecord(bool(facts.on_cuda), int(facts.devices), facts.max_loras, dict(facts.kv_cache),
                               {f.name: getattr(model, f.name) for f in fields(ModelShape)}
                               if model is not None else None))


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
        a = attribute_value(v)
        if a is None:
            raise RecordError(f"ConfigRecord.resource[{k!r:.40}]: {type(v).__name__}")
        resource[k] = a
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
        if not isinstance(k, str) or not isinstance(v, ATTRIBUTE_VALUES):
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
            _check(where, value, accepted(hint))
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


def accepted(hint: Any) -> tuple[type, ...]:
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

def encode(record: Record) -> bytes:
    """The wire form of ``record``; RecordError where it is longer than ``MAX_CONTROL`` (a per-request one,
    built by ``frame``, is shortened by its sender instead: agent/link.py)."""
    cls = type(record)
    data = CODEC.frame(CODEC.kind_of[cls], cls.VERSION, CODEC.fields_of(record))
    if len(data) > MAX_CONTROL:
        raise RecordError(f"{cls.__name__} of {len(data)} bytes")
    return data


def frame(kind: int, version: int, values: dict[str, Any]) -> bytes:
    """The wire form of a record of ``kind`` whose fields are ``values`` by name. A request's start and finish
    are framed straight from what the frontend holds, without making the record first (per request; the
    names are the record's, tests/agent/test_link_records.py holds them to it)."""
    return CODEC.frame(kind, version, values)


def decode(data: bytes) -> Record:
    """The record in ``data``; RecordError for anything else: another tag (a positional tuple of an older
    frontend included), kind, version, a field of the wrong type, a missing required field. Fields this
    reader does not know are ignored (agent/declared.py)."""
    return CODEC.decode(data)


def _check(where: str, value: Any, accepted: tuple[type, ...]) -> None:
    # bool is an int to isinstance: refused where only numbers are declared
    if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
        raise RecordError(f"{where}: {type(value).__name__}")
