"""What the processors read from one export request, extracted once, and the encoding back to OTLP.

Each span is kept as its own encoded bytes, not as a live protobuf object: a buffered upb
message keeps its whole received request (its arena) alive, which cost ~1.2 KB per buffered
span; the bytes cost their length plus ~90 B. The receivers validate and read a request in one pass in C
(``read_request``: ``fast/_wire.c``, where built), or else validate it with the full classes and read it through
``otel_llm.otlp.view``; either way those bytes are the span as received (no re-encoding) and a span's attributes
arrive as a key -> encoded value map built in C (the one-pass reader keeps only the keys read here). Resource
and scope stay encoded too, once per ``ScopeSpans`` (a ``Group`` shared by its spans). On export the kept
spans are framed back into an ``ExportTraceServiceRequest`` at the byte level (``encode_request``), regrouped
under their resource and scope, schema URLs included.

Attribute values are decoded only for spans that carry request latencies (ours or the engines'
native ones) or a client's time to first chunk; every other span costs a few key lookups. A
request span's encoded map goes to ``fast.summary``'s reader (``from_attributes`` over encoded values,
built from the core's tables, decoding only what it reads, in one pass): the derivation exists once, in
the core. A span's status is read only when it is not empty (UNSET, the common case, costs nothing). A span with request latencies is a request span whatever its kind; otherwise a
CLIENT span with ``gen_ai.response.time_to_first_chunk`` is a client call (``ttft_join``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

from otel_llm import semconv as sc
from otel_llm.core.summary import ATTRIBUTE_SLOTS, CONVERTERS, RequestSummary, native_provider_of
from otel_llm.otlp import encode
from otel_llm.otlp.messages import ExportTraceServiceRequest, parse_request
from otel_llm.otlp.view import (SERVICE_NAME, SPAN_KIND_CLIENT, RequestView, SpanView, any_value, decode_spans,
                                is_error, read_resource, scope_name, typed_decoders, value_of)

from .fast import wire
from .fast.summary import summary_reader

# keys whose presence marks a request span (see RequestSummary.from_attributes)
_TRIGGERS = (sc.LATENCY_E2E, sc.LATENCY_TTFT, sc.VLLM_TTFT, sc.VLLM_E2E)
_NO_TRACE = b"\0" * 16
_NO_SPAN = b"\0" * 8
_TTFC = sc.RESPONSE_TIME_TO_FIRST_CHUNK
_REASON = sc.SAMPLING_REASON
_CLIENT = SPAN_KIND_CLIENT

__all__ = ["any_value", "attributes", "extract", "encode_request", "read_request", "spans_of", "Received"]


def attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    """Full-class ``KeyValue`` messages as a dict (tests and tools; the receive path reads ``otlp.view``'s map)."""
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass(frozen=True, slots=True)
class Group:
    """The resource and scope a span was received under, encoded once per ``ScopeSpans``."""

    resource: tuple[bytes, str]  # (encoded Resource, ResourceSpans.schema_url)
    scope: tuple[bytes, str]  # (encoded InstrumentationScope, ScopeSpans.schema_url)
    service: str


@dataclass(slots=True)
class RequestFacts:
    """A request span's derived summary: what llm_metrics records and the policies read."""

    trace_id: bytes
    service: str
    summary: RequestSummary
    source: str  # "otel_llm" (our llm.latency.*) or "native" (vLLM / TensorRT-LLM llm_request)
    reason: str | None  # llm.sampling.reason recorded by the SDK
    parented: bool = False  # the span has a parent: a caller (a traced client) may report on it too


# One received span, as a plain tuple (built per span on the hot path, so no object per span):
# (trace_id, group, encoded span, start_ns, end_ns, error, root, request facts if a request span else None)
SpanRecord = tuple[bytes, Group, bytes, int, int, bool, bool, "RequestFacts | None"]
TRACE_ID, GROUP, ENCODED, START, END, ERROR, ROOT, REQUEST = range(8)


@dataclass(slots=True)
class ClientFacts:
    """A streamed client call's time to first chunk (``gen_ai.response.time_to_first_chunk``)."""

    trace_id: bytes
    service: str
    model: str | None
    ttfc: float


@dataclass(slots=True)
class Extracted:
    """Everything taken from one export request."""

    spans: list[SpanRecord]
    requests: list[RequestFacts]
    rejected: int = 0  # spans without a valid trace id, span id or parent span id
    clients: list[ClientFacts] | None = None
    # trace id -> attribute key -> values, for the keys asked for (``extract(keys=...)``); None when none were
    attributes: dict[bytes, dict[str, list[Any]]] | None = None
    rejected_by: dict[str, int] | None = None  # reason (invalid_trace_id, ...) -> spans; None when none


# a request span whose latency is +-inf or NaN is refused (partial success, counted under this reason): a
# percentile or SLO policy, a histogram's sum cannot hold such a value
NON_FINITE_REASON = "non_finite_latency"
_LATENCY_FIELDS = ("ttft", "tpot", "e2e", "queue", "prefill", "decode", "max_gap")
_NON_FINITE: Any = object()  # marks the request facts of a span refused for a non-finite latency


def finite(summary: RequestSummary) -> bool:
    """Whether every latency a summary carries is a finite number."""
    for name in _LATENCY_FIELDS:
        v = getattr(summary, name)
        if v is not None and not math.isfinite(v):
            return False
    return True


MAX_VALUES_PER_KEY = 64  # distinct values kept per attribute key and trace: a policy needs one match, not all


def request_facts(trace_id: bytes, service: str, attrs: Mapping[str, Any], parented: bool = False) -> RequestFacts | None:
    """A request span's summary (the core's derivation), source and recorded sampling reason."""
    summary = RequestSummary.from_attributes(attrs)
    if summary is None:
        return None
    reason = attrs.get(sc.SAMPLING_REASON)
    source = "otel_llm" if sc.LATENCY_E2E in attrs or sc.LATENCY_TTFT in attrs else "native"
    return RequestFacts(trace_id, service, summary, source, reason if isinstance(reason, str) else None, parented)


def _encoded_request_facts(trace_id: bytes, service: str, encoded: Mapping[str, bytes],
                           parented: bool) -> RequestFacts | None:
    """``request_facts`` over a span's encoded attribute map (the receive path): same result."""
    summary = _read_summary(encoded)
    if summary is None:
        return None
    # `in` then [], not .get(): a upb map's get is a Python-level mixin (twice the cost of `in` on a miss)
    reason = value_of(encoded[_REASON]) if _REASON in encoded else None
    source = "otel_llm" if sc.LATENCY_E2E in encoded or sc.LATENCY_TTFT in encoded else "native"
    return RequestFacts(trace_id, service, summary, source, reason if isinstance(reason, str) else None, parented)


TYPED = typed_decoders(CONVERTERS)  # decoders of encoded values into RequestSummary fields, by kind
_read_summary = summary_reader(value_of, TYPED)
_is_error = is_error


def _wanted_keys() -> frozenset[str]:
    """The attribute keys ``extract`` reads from a span (the one-pass reader keeps only these, plus the policies'
    keys): the triggers, the client-call keys, the summary reader's table, and the keys the core's derivation
    reads from a native (vLLM / TensorRT-LLM) request span, recorded by running it on a probe (so a key added
    there is followed)."""
    read: set[str] = set()

    class Probe(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            read.add(key)
            if key in (sc.VLLM_TTFT, sc.VLLM_E2E):
                return 1.0
            raise KeyError(key)

        def __iter__(self) -> Any:
            return iter(())

        def __len__(self) -> int:
            return 0

    RequestSummary.from_attributes(Probe())
    return frozenset(read) | frozenset(ATTRIBUTE_SLOTS) | frozenset(_TRIGGERS) | {_TTFC, _REASON, sc.REQUEST_MODEL}


WANTED = _wanted_keys()
ONE_PASS = wire.AVAILABLE  # the receivers validate and read in one pass (fast/_wire.c); else the two passes


@dataclass(frozen=True, slots=True)
class Received:
    """A request validated and read by the one-pass reader (``fast.wire.read``): what ``extract`` takes from it."""

    resources: list  # [(encoded Resource, schema_url, [(encoded scope, schema_url, [span tuple, ...])])]
    wanted: frozenset[str]  # the attribute keys kept
    raw: bytes


@lru_cache(maxsize=16)
def _wanted(keys: frozenset[str]) -> frozenset[str]:
    return WANTED | keys


def read_request(raw: bytes, keys: frozenset[str] = frozenset(),
                 one_pass: bool | None = None) -> "ExportTraceServiceRequest | Received":
    """Validate a request's bytes as received: ``MalformedRequest`` with the reason when upb would refuse them.

    One pass in C when the extension is built (``one_pass`` None: ``ONE_PASS``), returning what ``extract`` reads
    (``keys``: the policies' attribute keys, kept too); else the full OTLP classes (``messages.parse_request``)."""
    if ONE_PASS if one_pass is None else one_pass:
        wanted = _wanted(keys)
        return Received(wire.read(raw, wanted), wanted, raw)
    return parse_request(raw)


def extract(request: "ExportTraceServiceRequest | Received", raw: bytes | None = None,
            keys: frozenset[str] = frozenset()) -> Extracted:
    """Every span with a valid (16-byte) trace id, encoded, and the request spans' summaries.

    ``request``: what ``read_request`` returned (the one-pass reading), or a parsed request (read again
    through ``otel_llm.otlp.view``). ``raw``: the request's bytes as received, when the receiver has them (saves
    encoding it again). ``keys``: attribute keys whose values (on spans and their resources) to collect per
    trace, for the attribute policies; nothing is collected without them."""
    if type(request) is Received:
        if keys <= request.wanted:
            return _extract_read(request.resources, keys)
        raw = request.raw  # read for other keys than it kept (not the gateway's case): through the view
    return _extract_view(request.SerializeToString() if raw is None else raw, keys)


# The two readers below apply the same rules to the same values, one over fast.wire.read's tuples, one over the
# view's messages (the two-pass fallback, as it was before the one-pass path: building tuples from the view
# cost it 10-25%). Change both together: tests/collector/test_wire_onepass.py checks that they agree on
# thousands of inputs.

def _extract_read(resources: list, keys: frozenset[str]) -> Extracted:
    """``extract`` over the one-pass reading (``fast.wire.read``)."""
    spans: list[SpanRecord] = []
    requests: list[RequestFacts] = []
    clients: list[ClientFacts] | None = None
    rejected = 0
    rejected_by: dict[str, int] | None = None
    triggers = _TRIGGERS
    found: dict[bytes, dict[str, list[Any]]] | None = {} if keys else None
    resource_values: list[tuple[str, Any]] = []
    for resource, resource_url, scopes in resources:
        service, resource_values = read_resource(resource, keys)
        resource_key = (resource, resource_url)
        for scope, scope_url, scope_spans in scopes:
            group = Group(resource_key, (scope, scope_url), service)
            native_provider = native_provider_of(scope_name(scope)) if scope else None
            for encoded, tid, sid, parent, kind, start, end, error, attrs in scope_spans:
                if len(tid) != 16 or tid == _NO_TRACE:
                    why = "invalid_trace_id"  # the OTLP spec: a span without a valid trace id is invalid
                elif len(sid) != 8 or sid == _NO_SPAN:
                    why = "invalid_span_id"
                elif parent and len(parent) != 8:  # a strict backend refuses the whole batch for one of these
                    why = "invalid_parent_span_id"
                else:
                    why = None
                if why is not None:
                    rejected += 1
                    rejected_by = rejected_by if rejected_by is not None else {}
                    rejected_by[why] = rejected_by.get(why, 0) + 1
                    continue
                facts = None
                if attrs:
                    for key in triggers:
                        if key in attrs:
                            facts = _encoded_request_facts(tid, service, attrs, bool(parent))
                            if facts is not None and not finite(facts.summary):
                                facts = _NON_FINITE
                            elif facts is not None:
                                if facts.summary.provider is None and facts.source == "native":
                                    facts.summary.provider = native_provider  # the engine's tracer's scope
                                requests.append(facts)
                            break
                    else:
                        if _TTFC in attrs and kind == _CLIENT:
                            ttfc, model = value_of(attrs[_TTFC]), attrs.get(sc.REQUEST_MODEL)
                            model = value_of(model) if model is not None else None
                            if isinstance(ttfc, float):
                                (clients := clients if clients is not None else []).append(
                                    ClientFacts(tid, service, model if isinstance(model, str) else None, ttfc))
                    if facts is _NON_FINITE:  # refused here, so no processor or policy ever reads the value
                        rejected += 1
                        rejected_by = rejected_by if rejected_by is not None else {}
                        rejected_by[NON_FINITE_REASON] = rejected_by.get(NON_FINITE_REASON, 0) + 1
                        continue
                    if found is not None:
                        _collect(found, tid, [(k, value_of(attrs[k])) for k in keys if k in attrs] + resource_values)
                elif found is not None:
                    _collect(found, tid, resource_values)
                spans.append((tid, group, encoded, start, end, error, not parent, facts))
    return Extracted(spans, requests, rejected, clients, found, rejected_by)


def _extract_view(raw: bytes, keys: frozenset[str]) -> Extracted:
    """``extract`` over ``otel_llm.otlp.view``'s reading of a validated request."""
    view = RequestView.FromString(raw)
    spans: list[SpanRecord] = []
    requests: list[RequestFacts] = []
    clients: list[ClientFacts] | None = None
    rejected = 0
    rejected_by: dict[str, int] | None = None
    triggers, read_span = _TRIGGERS, SpanView.FromString
    found: dict[bytes, dict[str, list[Any]]] | None = {} if keys else None
    resource_values: list[tuple[str, Any]] = []
    for rs in view.resource_spans:
        resource = rs.resource
        service, resource_values = read_resource(resource, keys)
        resource_key = (resource, rs.schema_url)
        for ss in rs.scope_spans:
            group = Group(resource_key, (ss.scope, ss.schema_url), service)
            native_provider = native_provider_of(scope_name(ss.scope)) if ss.scope else None
            for encoded in ss.spans:
                span = read_span(encoded)
                tid = span.trace_id
                parent = span.parent_span_id
                if len(tid) != 16 or tid == _NO_TRACE:
                    why = "invalid_trace_id"  # the OTLP spec: a span without a valid trace id is invalid
                elif len(sid := span.span_id) != 8 or sid == _NO_SPAN:
                    why = "invalid_span_id"
                elif parent and len(parent) != 8:  # a strict backend refuses the whole batch for one of these
                    why = "invalid_parent_span_id"
                else:
                    why = None
                if why is not None:
                    rejected += 1
                    rejected_by = rejected_by if rejected_by is not None else {}
                    rejected_by[why] = rejected_by.get(why, 0) + 1
                    continue
                facts = None
                attrs = span.attributes
                if attrs:
                    for key in triggers:
                        if key in attrs:
                            facts = _encoded_request_facts(tid, service, attrs, bool(parent))
                            if facts is not None and not finite(facts.summary):
                                facts = _NON_FINITE
                            elif facts is not None:
                                if facts.summary.provider is None and facts.source == "native":
                                    facts.summary.provider = native_provider  # the engine's tracer's scope
                                requests.append(facts)
                            break
                    else:
                        if _TTFC in attrs and span.kind == _CLIENT:
                            ttfc, model = value_of(attrs[_TTFC]), attrs.get(sc.REQUEST_MODEL)
                            model = value_of(model) if model is not None else None
                            if isinstance(ttfc, float):
                                (clients := clients if clients is not None else []).append(
                                    ClientFacts(tid, service, model if isinstance(model, str) else None, ttfc))
                    if facts is _NON_FINITE:  # refused here, so no processor or policy ever reads the value
                        rejected += 1
                        rejected_by = rejected_by if rejected_by is not None else {}
                        rejected_by[NON_FINITE_REASON] = rejected_by.get(NON_FINITE_REASON, 0) + 1
                        continue
                if found is not None:
                    _collect(found, tid, [(k, value_of(attrs[k])) for k in keys if k in attrs] + resource_values)
                status = span.status
                spans.append((tid, group, encoded, span.start_time_unix_nano, span.end_time_unix_nano,
                              bool(status) and _is_error(status), not parent, facts))
    return Extracted(spans, requests, rejected, clients, found, rejected_by)


def merge_values(into: dict[str, list[Any]], pairs: Iterable[tuple[str, Any]]) -> None:
    """Add (key, value) pairs to a trace's attribute values: distinct (True is not 1), at most ``MAX_VALUES_PER_KEY``."""
    for key, value in pairs:
        values = into.get(key)
        if values is None:
            into[key] = [value]
        elif len(values) < MAX_VALUES_PER_KEY and not any(type(v) is type(value) and v == value for v in values):
            values.append(value)


def _collect(found: dict[bytes, dict[str, list[Any]]], tid: bytes, pairs: list[tuple[str, Any]]) -> None:
    if pairs:
        per = found.get(tid)
        merge_values(per if per is not None else found.setdefault(tid, {}), pairs)


encode_request = encode.encode_request  # the shared framing (RequestFrame.request's, regrouped)


def spans_of(items: Sequence[tuple[Group, bytes]]) -> list:
    """The items decoded back to ``Span`` messages (for tests and debugging, not the hot path)."""
    return decode_spans(raw for _, raw in items)
