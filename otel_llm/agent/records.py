"""The per-request records that cross to the agent, declared once, with named fields.

The engine process says when each request started and how it finished: ``RequestStart`` when the engine
took the request, ``RequestFinish`` when it let it go. They travel on the engine's step socket beside the
step records (one datagram each, never the step ring: they are per request, not per step), and the agent
joins them with the step records into request timelines (docs/design/enginecore-source.md). Where a Python
frontend serves the requests it adds, once a request, what only it knows: ``RequestEnrichment``, sent on
its agent link when it lets the request go, joined on the engine's request id.
``SinkCounts`` travels the same way, wherever an agent reads the engine's steps: what the engine's sink
could not deliver (the agent's ``stats()``: ``engine_steps_dropped``, ``engine_requests_dropped``).

The wire form: one tag byte (``TAG``), one kind byte, then ``marshal`` of ``(version, {field: value})``,
read by the one reader of every record that crosses to the agent (declared.py).
Built-in values only (no pickle), read back by name (no positional unpacking); every value is checked
against its field's declared types before a record is made, since the bytes come from another process.

Adding a field (the verdict's, an SLO's, a tenant's ...): declare it in the dataclass below **with a
default** and its types in ``_TYPES``; set it where the engine's hook builds the record; read it in the
agent. A reader that does not know a field ignores it; a record without a field gets the default. Bump
``VERSION`` only when a field's meaning changes or a field goes: a reader refuses versions above its own.
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .declared import ATTRIBUTE_VALUES, Codec, RecordError, attribute_value

TAG = 0xD0  # the first byte (step records start with step_wire.VERSION, control records with 0xC0)
START, FINISH, SINK_COUNTS, ENRICH, BATCH = 1, 2, 3, 4, 5  # the second byte: which record (BATCH: several, one datagram)
MAX_RECORD = 128 << 10  # a longer one is refused by the reader (a start's headers are bounded below it)
MAX_HEADERS = 16  # trace headers kept per request (traceparent, tracestate, baggage ...)
MAX_TEXT = 4096  # characters kept of a header value or an id
MAX_ATTRIBUTES = 64  # request attributes kept of an enrichment

_STR = (str,)
_OPT_STR = (str, type(None))
_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_INT = (int,)
_OPT_INT = (int, type(None))
_BOOL = (bool,)
_MAP = (dict,)
_OPT_MAP = (dict, type(None))


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
    enriched: bool = False  # a Python frontend sends this request's RequestEnrichment: the agent waits for it


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
    enriched: bool = False  # as in RequestStart (a finish whose start was lost still waits for it)
    client_index: int = 0  # as in RequestStart: an agent keeps the enriched records of its own API server


@dataclass(slots=True)
class SinkCounts:
    """What an engine process's sink could not deliver to this agent so far (cumulative, so a lost one costs
    nothing: the next says it all). Sent when a count changed: at the sink's rescan (about once a second
    while steps flow) and after the next request record that got through. Not per request: a control record."""

    VERSION: ClassVar[int] = 1

    pid: int  # the engine process (its counts replace the ones it sent before)
    steps_dropped: int = 0  # step (and control) records a full ring or socket refused, or left unread
    requests_dropped: int = 0  # request records (starts, finishes) a full or closed socket refused


@dataclass(slots=True)
class RequestEnrichment:
    """What only a Python frontend knows of a request, sent once when it lets the request go (vLLM:
    ``OutputProcessor._update_stats_from_finished`` or an abort). Joined in the agent with the engine's
    records of the same ``request_id``; nothing here is per token."""

    VERSION: ClassVar[int] = 1

    request_id: str  # the engine's id (vLLM's Python frontend: the external id plus "-" and 8 characters)
    operation: str  # gen_ai.operation.name as the frontend served it (chat, text_completion, embeddings ...)
    server: bool = False  # served over HTTP (a SERVER span); False: offline (INTERNAL)
    parent: dict[str, str] | None = None  # the parent trace context, W3C headers (traceparent, tracestate)
    response_id: str | None = None  # the id the client got
    model: str | None = None  # the served model name, as the frontend names it
    attributes: dict[str, Any] = field(default_factory=dict)  # request attributes only it knows (route,
    # stream, requested model, server address and port, tenant, disaggregated role ...)
    reason: str | None = None  # its finish reason (a stop string it found: "stop", where the engine saw an abort)
    output_tokens: int | None = None  # tokens it received (vLLM's num_generation_tokens)
    output_characters: int | None = None  # detokenized characters
    first_output: float = 0.0  # wall clock: when it received the first output (0.0: none)
    last_output: float = 0.0  # wall clock: when it received the last one (0.0: none, an abort)
    end: float = 0.0  # wall clock: when it let the request go (where vLLM's e2e ends)
    prompt_text: str | None = None  # captured content (capture_content only)
    output_text: str | None = None
    group_id: str | None = None  # n > 1: the user request this sequence belongs to
    group_size: int = 0  # n, as the user asked
    group_expected: int = 0  # sequences tracked (n, less those refused over max_requests)
    choice_index: int | None = None


_KINDS: dict[int, type] = {START: RequestStart, FINISH: RequestFinish, SINK_COUNTS: SinkCounts,
                         ENRICH: RequestEnrichment}

# each field's accepted types on the wire (checked before a record is made)
_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    RequestStart: {"request_id": _STR, "arrival": _NUM, "queued": _NUM, "prompt_tokens": _INT,
                   "external_id": _OPT_STR, "model": _OPT_STR, "trace_headers": _OPT_MAP, "sampling": _MAP,
                   "lora_name": _OPT_STR, "lora_id": _OPT_INT, "client_index": _INT, "enriched": _BOOL},
    RequestFinish: {"request_id": _STR, "reason": _STR, "arrival": _NUM, "queued": _NUM, "end": _NUM,
                    "end_wall": _NUM, "prompt_tokens": _INT, "output_tokens": _INT, "preemptions": _INT,
                    "external_id": _OPT_STR, "model": _OPT_STR, "enriched": _BOOL,
                    "client_index": _INT},
    SinkCounts: {"pid": _INT, "steps_dropped": _INT, "requests_dropped": _INT},
    RequestEnrichment: {"request_id": _STR, "operation": _STR, "server": _BOOL, "parent": _OPT_MAP,
                        "response_id": _OPT_STR, "model": _OPT_STR, "attributes": _MAP, "reason": _OPT_STR,
                        "output_tokens": _OPT_INT, "output_characters": _OPT_INT, "first_output": _NUM,
                        "last_output": _NUM, "end": _NUM, "prompt_text": _OPT_STR, "output_text": _OPT_STR,
                        "group_id": _OPT_STR, "group_size": _INT, "group_expected": _INT,
                        "choice_index": _OPT_INT},
}
_MAX_SAMPLING = 32  # sampling parameters kept of a start
_SCALAR_TYPES = frozenset(ATTRIBUTE_VALUES)
_STR_ONLY = frozenset(_STR)
_BYTES_ONLY = frozenset((bytes,))
MAX_BATCH = 4 * MAX_RECORD  # a batch's bytes (its sender cuts batches at a quarter of this, or one record)
CODEC = Codec(TAG, _KINDS, _TYPES, MAX_RECORD, "request record", "not a request record")


Record = RequestStart | RequestFinish | SinkCounts | RequestEnrichment


def encode(record: Record) -> bytes:
    """The wire form. An enrichment whose captured content would make it longer than ``MAX_RECORD`` goes
    without the content (the request still counts; its spans lack the text)."""
    kind = CODEC.kind_of[type(record)]
    values = CODEC.fields_of(record)
    if kind == START:  # bounded here too, so a request with huge headers still fits a record
        values["trace_headers"] = _headers(values["trace_headers"])
    elif kind == ENRICH:
        values["parent"] = _headers(values["parent"])
        values["attributes"] = _attributes(values["attributes"])
        return encode_enrichment(values)
    return CODEC.frame(kind, record.VERSION, values)


def encode_enrichment(values: dict[str, Any]) -> bytes:
    """``encode`` of a ``RequestEnrichment`` given as its fields' values by name, for a Python frontend's
    hot path (once a request): no dataclass, no pass over the fields. A field at its default may be left out
    (the reader fills it in). The caller bounds what ``encode`` bounds: ``parent`` by ``bound_headers``,
    ``attributes`` to at most ``MAX_ATTRIBUTES`` span attribute values with keys and strings of at most
    ``MAX_TEXT`` characters. Longer than ``MAX_RECORD`` with its captured content: sent without it."""
    data = CODEC.frame(ENRICH, RequestEnrichment.VERSION, values)
    if len(data) > MAX_RECORD:
        values = {**values, "prompt_text": None, "output_text": None}
        data = CODEC.frame(ENRICH, RequestEnrichment.VERSION, values)
    return data


def batch(items: list[bytes]) -> bytes:
    """Several encoded records as one datagram: a datagram socket queues at most ``net.unix.max_dgram_qlen``
    datagrams (10 by default) however small, so a burst of requests sent one datagram each loses most. Where
    steps go as datagrams (no ring), a batch may also hold the step records a full socket held back, in the
    order sent (step_transport.SocketSink._put; the reader tells the two apart by their first byte)."""
    return bytes((TAG, BATCH)) + marshal.dumps(tuple(items))


def unbatch(data: bytes) -> list[bytes]:
    """The encoded records of a ``batch`` (each still to ``decode``); RecordError for anything else."""
    if len(data) < 3 or data[0] != TAG or data[1] != BATCH:
        raise RecordError("not a batch of request records")
    if len(data) > MAX_BATCH:
        raise RecordError(f"batch of request records of {len(data)} bytes")
    items = CODEC.loads(data)
    if not isinstance(items, tuple) or not _BYTES_ONLY.issuperset(map(type, items)):
        raise RecordError("batch of request records of another shape")
    return list(items)


def decode(data: bytes) -> Record:
    """The record in ``data``; RecordError for anything else (another tag, kind, version, a field of the
    wrong type, a missing required field). Fields this reader does not know are ignored; the headers, sampling
    parameters and attributes are bounded as ``encode`` bounds them."""
    cls, values = CODEC.read(data)  # (the dict marshal made for this call: it becomes the record's fields)
    if cls is RequestStart:
        values["trace_headers"] = _headers(values.get("trace_headers"))
        sampling = values.get("sampling")
        if sampling and not _plain(sampling, _MAX_SAMPLING):
            values["sampling"] = {str(k): a for k, v in list(sampling.items())[:_MAX_SAMPLING]
                                  if (a := attribute_value(v)) is not None}
    elif cls is RequestEnrichment:
        values["parent"] = _headers(values.get("parent"))
        attributes = values.get("attributes")  # (a record of at most MAX_TEXT bytes has no longer string)
        if attributes and not (len(data) <= MAX_TEXT and _plain(attributes, MAX_ATTRIBUTES)):
            values["attributes"] = _attributes(attributes)
    return CODEC.make(cls, values)


def _plain(values: dict, most: int) -> bool:
    """``values`` is already what the sampling's filter (and ``_attributes``, where none of its strings is
    longer than ``MAX_TEXT``) would make of it: at most ``most`` items, string keys, span attribute values
    (declared.attribute_value: a tuple of scalars only)."""
    if len(values) > most or not _STR_ONLY.issuperset(map(type, values)):
        return False
    found = values.values()
    if _SCALAR_TYPES.issuperset(map(type, found)):
        return True
    return all(type(v) in _SCALAR_TYPES or type(v) is tuple and _SCALAR_TYPES.issuperset(map(type, v))
               for v in found)


def _headers(headers: dict | None) -> dict[str, str] | None:
    if not headers:
        return None
    out = {}
    for k, v in list(headers.items())[:MAX_HEADERS]:
        if isinstance(k, str) and isinstance(v, str):
            out[k[:MAX_TEXT].lower()] = v[:MAX_TEXT]
    return out or None


bound_headers = _headers  # W3C headers as a record carries them (at most MAX_HEADERS, MAX_TEXT characters)


def _attributes(attrs: dict) -> dict[str, Any]:
    """Span attribute values only (declared.attribute_value), at most ``MAX_ATTRIBUTES``."""
    out = {}
    for k, v in list(attrs.items())[:MAX_ATTRIBUTES]:
        if isinstance(k, str) and (a := attribute_value(v)) is not None:
            out[k[:MAX_TEXT]] = a[:MAX_TEXT] if isinstance(a, str) else a
    return out


