"""The per-request records an engine process sends its agent, declared once, with named fields.

Where no Python frontend holds the requests (vLLM's Rust frontend, ``vllm serve --headless``), the engine
process itself says when each request started and how it finished: ``RequestStart`` when the engine took
the request, ``RequestFinish`` when it let it go. They travel on the engine's step socket beside the step
records (one datagram each, never the step ring: they are per request, not per step), and the agent joins
them with the step records into request timelines (docs/design/enginecore-source.md). ``SinkCounts``
travels the same way, wherever an agent reads the engine's steps: what the engine's sink could not deliver
(the agent's ``stats()``: ``engine_steps_dropped``, ``engine_requests_dropped``).

The wire form: one tag byte (``TAG``), one kind byte, then ``marshal`` of ``(version, {field: value})``.
Built-in values only (no pickle), read back by name (no positional unpacking); every value is checked
against its field's declared types before a record is made, since the bytes come from another process.

Adding a field (the verdict's, an SLO's, a tenant's ...): declare it in the dataclass below **with a
default** and its types in ``_TYPES``; set it where the engine's hook builds the record; read it in the
agent. A reader that does not know a field ignores it; a record without a field gets the default. Bump
``VERSION`` only when a field's meaning changes or a field goes: a reader refuses versions above its own.
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

TAG = 0xD0  # the first byte (step records start with step_wire.VERSION, control records with 0xC0)
START, FINISH, SINK_COUNTS = 1, 2, 3  # the second byte: which record
MAX_RECORD = 128 << 10  # a longer one is refused by the reader (a start's headers are bounded below it)
MAX_HEADERS = 16  # trace headers kept per request (traceparent, tracestate, baggage ...)
MAX_TEXT = 4096  # characters kept of a header value or an id

_STR = (str,)
_OPT_STR = (str, type(None))
_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_INT = (int,)
_OPT_INT = (int, type(None))
_MAP = (dict,)
_OPT_MAP = (dict, type(None))


class RecordError(ValueError):
    """Bytes that are not a request record of a version this reader knows."""


@dataclass(slots=True)
class RequestStart:
    """An engine took a request (vLLM: ``Scheduler.add_request``, with the ``EngineCoreRequest``'s facts)."""

    VERSION: ClassVar[int] = 1

    request_id: str  # the engine's id (vLLM: the frontend's id plus "-" and 8 random characters)
    arrival: float  # wall clock (epoch seconds): when the frontend received it, as the frontend stamped it
    queued: float  # engine monotonic (the step records' clock): when the engine took it
    prompt_tokens: int
    external_id: str | None = None  # the id the client sees (vLLM's ``external_req_id``: cmpl-X, chatcmpl-X)
    model: str | None = None  # the served model name
    trace_headers: dict[str, str] | None = None  # what the frontend forwarded (W3C traceparent ...), or None
    sampling: dict[str, Any] = field(default_factory=dict)  # GenAI request attributes (core/request_params.py)
    lora_name: str | None = None
    lora_id: int | None = None
    client_index: int = 0  # which API server sent it (vLLM's client_index)


@dataclass(slots=True)
class RequestFinish:
    """An engine let a request go (finished, aborted or failed). Stands on its own: a start lost to a full
    socket still gives the request's metrics (its end-to-end time, token counts, outcome)."""

    VERSION: ClassVar[int] = 1

    request_id: str
    reason: str  # the engine's finish reason: stop, length, abort, error, repetition ...
    arrival: float  # wall clock, as in RequestStart
    queued: float  # engine monotonic, as in RequestStart (0.0: unknown)
    end: float  # engine monotonic: when the engine let it go
    end_wall: float  # wall clock at the same moment (the agent converts the monotonic stamps with the pair)
    prompt_tokens: int
    output_tokens: int
    preemptions: int = 0
    external_id: str | None = None
    model: str | None = None


@dataclass(slots=True)
class SinkCounts:
    """What an engine process's sink could not deliver to this agent so far (cumulative, so a lost one costs
    nothing: the next says it all). Sent when a count changed: at the sink's rescan (about once a second
    while steps flow) and after the next request record that got through. Not per request: a control record."""

    VERSION: ClassVar[int] = 1

    pid: int  # the engine process (its counts replace the ones it sent before)
    steps_dropped: int = 0  # step (and control) records a full ring or socket refused, or left unread
    requests_dropped: int = 0  # request records (starts, finishes) a full or closed socket refused


_KINDS: dict[int, type] = {START: RequestStart, FINISH: RequestFinish, SINK_COUNTS: SinkCounts}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}

# each field's accepted types on the wire (checked before a record is made)
_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    RequestStart: {"request_id": _STR, "arrival": _NUM, "queued": _NUM, "prompt_tokens": _INT,
                   "external_id": _OPT_STR, "model": _OPT_STR, "trace_headers": _OPT_MAP, "sampling": _MAP,
                   "lora_name": _OPT_STR, "lora_id": _OPT_INT, "client_index": _INT},
    RequestFinish: {"request_id": _STR, "reason": _STR, "arrival": _NUM, "queued": _NUM, "end": _NUM,
                    "end_wall": _NUM, "prompt_tokens": _INT, "output_tokens": _INT, "preemptions": _INT,
                    "external_id": _OPT_STR, "model": _OPT_STR},
    SinkCounts: {"pid": _INT, "steps_dropped": _INT, "requests_dropped": _INT},
}
_SAMPLING_VALUES = (str, int, float, bool, tuple)
_NAMES = {cls: tuple(f.name for f in fields(cls)) for cls in _KINDS.values()}  # read once, not per record


Record = RequestStart | RequestFinish | SinkCounts


def encode(record: Record) -> bytes:
    cls = type(record)
    kind = _KIND_OF[cls]
    values = {name: getattr(record, name) for name in _NAMES[cls]}
    if kind == START:  # bounded here too, so a request with huge headers still fits a record
        values["trace_headers"] = _headers(values["trace_headers"])
    return bytes((TAG, kind)) + marshal.dumps((record.VERSION, values))


def decode(data: bytes) -> Record:
    """The record in ``data``; RecordError for anything else (another tag, kind, version, a field of the
    wrong type, a missing required field). Fields this reader does not know are ignored."""
    if len(data) < 3 or data[0] != TAG:
        raise RecordError("not a request record")
    if len(data) > MAX_RECORD:
        raise RecordError(f"request record of {len(data)} bytes")
    cls = _KINDS.get(data[1])
    if cls is None:
        raise RecordError(f"request record of unknown kind {data[1]}")
    try:
        body = marshal.loads(bytes(data[2:]))
    except (EOFError, ValueError, TypeError) as exc:
        raise RecordError(f"request record unreadable: {exc}") from None
    if not (isinstance(body, tuple) and len(body) == 2 and isinstance(body[0], int) and isinstance(body[1], dict)):
        raise RecordError("request record of another shape")
    version, values = body
    if version > cls.VERSION or version < 1:
        raise RecordError(f"{cls.__name__} version {version}, this reader knows up to {cls.VERSION}")
    types = _TYPES[cls]
    known = {}
    for name, value in values.items():
        accepted = types.get(name)
        if accepted is None:
            continue  # a field a newer writer added
        if not isinstance(value, accepted) or isinstance(value, bool) and bool not in accepted:
            raise RecordError(f"{cls.__name__}.{name}: {type(value).__name__}")
        known[name] = value
    if cls is RequestStart:
        known["trace_headers"] = _headers(known.get("trace_headers"))
        known["sampling"] = {str(k): v for k, v in list(known.get("sampling", {}).items())[:32]
                             if isinstance(v, _SAMPLING_VALUES)}
    try:
        return cls(**known)
    except TypeError as exc:  # a required field missing
        raise RecordError(f"{cls.__name__}: {exc}") from None


def _headers(headers: dict | None) -> dict[str, str] | None:
    if not headers:
        return None
    out = {}
    for k, v in list(headers.items())[:MAX_HEADERS]:
        if isinstance(k, str) and isinstance(v, str):
            out[k[:MAX_TEXT].lower()] = v[:MAX_TEXT]
    return out or None
