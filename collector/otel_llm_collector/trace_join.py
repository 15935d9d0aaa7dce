"""Processor ``trace_join``: a server request trace without a caller, put into the trace of its client call.

vLLM's Rust frontend passes no trace context to the engine (``EngineCoreRequest.trace_headers`` carries no
``traceparent``), so the request span the EngineCore's records yield is the root of its own trace. The caller's
openai span carries the response id the client received (``gen_ai.response.id``, ``cmpl-X``); the server span
carries the request's external id under the same key. The gateway sees both: it rewrites the server trace into the
client's (every span's trace id; the server root's parent becomes the client span; links that point into the
server trace point into the client's), before the tail decision, so the policies decide one trace over both
halves (kept whole when either side would be kept).

Ids: under vLLM's Python frontend the engine's request id is the external id plus ``-`` and 8 random characters,
and a completion's i-th prompt runs as ``cmpl-X-{i}``; a server id is tried as it is, then without those suffixes
(``candidates``). One client call may so be joined by several server traces.

Both halves wait in one bounded table (oldest forgotten first, counted), for at most ``wait`` seconds of the
gateway's clock, in either arrival order: a server trace whose client never came then goes on alone (its own trace
id), and so does a client span. Spans of a waiting server trace that arrive later wait with it; spans of other
traces that link into it (engine steps) wait with it too, so their links can be rewritten, and spans linking into a
server trace already joined (remembered in a bounded table) are rewritten as they pass. A span that links into a
server trace before that trace's request span arrived keeps its link as sent.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import OrderedDict
from typing import Any, Callable

from otel_llm import semconv as sc
from otel_llm.otlp.view import SPAN_KIND_CLIENT, SpanView, rejoin_span, value_of

from .spans import ENCODED, REQUEST, ROOT, TRACE_ID, Extracted, SpanRecord
from .telemetry import GatewayMetrics

RESPONSE_ID = sc.RESPONSE_ID
DEFAULT_WAIT = 10.0  # seconds: a client's batch exporter sends every ~5 s; its span ends after the last chunk
_RANDOM_SUFFIX = re.compile(r"-[0-9A-Za-z]{8}$")
_PROMPT_SUFFIX = re.compile(r"-\d+$")


def candidates(response_id: str) -> list[str]:
    """The client response ids a server request's id may belong to, most specific first."""
    out = [response_id]
    base = _RANDOM_SUFFIX.sub("", response_id)
    if base != response_id:
        out.append(base)
    for rid in list(out):
        stripped = _PROMPT_SUFFIX.sub("", rid)
        if stripped != rid and stripped not in out:
            out.append(stripped)
    return out


@dataclasses.dataclass(slots=True)
class _Server:
    trace_id: bytes
    root_span_id: bytes
    keys: list[str]
    arrived: float
    spans: list[SpanRecord]
    attributes: dict[str, list[Any]] | None


@dataclasses.dataclass(slots=True)
class _Client:
    response_id: str
    trace_id: bytes
    span_id: bytes
    arrived: float
    spans: list[SpanRecord]  # the client span while it waits; emptied when it goes on
    attributes: dict[str, list[Any]] | None


class TraceJoin:
    def __init__(self, telemetry: GatewayMetrics, clock: Callable[[], float], wait: float = DEFAULT_WAIT,
                 max_pending: int = 100_000) -> None:
        self._t = telemetry
        self._clock = clock
        self._wait = wait
        self._max = max_pending
        # one table for both halves, in arrival order: the oldest is forgotten first, and expires first
        self._pending: OrderedDict[tuple[str, bytes], _Server | _Client] = OrderedDict()
        self._servers: dict[str, list[_Server]] = {}  # candidate response id -> waiting server traces
        self._clients: dict[str, _Client] = {}  # response id -> client call (it stays until it expires)
        self._held: dict[bytes, _Server] = {}  # server trace id -> its waiting half
        self._waiting_clients: dict[bytes, int] = {}  # trace id -> client spans of it waiting here
        self._waiting_linked: dict[bytes, int] = {}  # trace id -> its spans waiting with a server trace they link to
        self._joined: OrderedDict[bytes, tuple[bytes, bytes, bytes]] = OrderedDict()  # server tid -> (client tid, client span, server root)
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def holds(self, trace_id: bytes) -> bool:
        """Spans of ``trace_id`` wait here (not yet handed to the tail sampler)."""
        return trace_id in self._held or trace_id in self._waiting_clients or trace_id in self._waiting_linked

    # -- receive path --------------------------------------------------------------------------

    def process(self, batch: Extracted) -> Extracted:
        """The batch's spans that go on now (rewritten where joined), with those released by it."""
        with self._lock:
            out: list[SpanRecord] = []
            attrs: dict[bytes, dict[str, list[Any]]] = dict(batch.attributes or {})
            ids = batch.attributes or {}
            now = self._clock()
            joined = forgotten = 0
            new_servers: dict[bytes, _Server] = {}
            clients: list[tuple[SpanRecord, str, bytes]] = []
            # 1. find the halves: request spans without a parent, and client calls, with a response id
            for rec in batch.spans:
                tid = rec[TRACE_ID]
                if tid in self._held or tid not in ids or RESPONSE_ID not in ids[tid]:
                    continue
                facts = rec[REQUEST]
                if facts is not None and not facts.parented and rec[ROOT]:
                    view = SpanView.FromString(rec[ENCODED])
                    rid = _response_id(view)
                    if rid is not None and tid not in new_servers:
                        new_servers[tid] = _Server(tid, view.span_id, candidates(rid), now, [], None)
                elif facts is None:
                    view = SpanView.FromString(rec[ENCODED])
                    if view.kind == SPAN_KIND_CLIENT:
                        rid = _response_id(view)
                        if rid is not None:
                            clients.append((rec, rid, view.span_id))
            for tid, server in new_servers.items():
                server.attributes = attrs.pop(tid, None)
                self._held[tid] = server
            # 2. route the spans: a waiting server trace's own spans and spans linking into it wait with it;
            # spans of (or linking into) a joined server trace are rewritten
            client_recs = {id(rec) for rec, _, _ in clients}
            held, joined_map = self._held, self._joined
            for rec in batch.spans:
                tid = rec[TRACE_ID]
                server = held.get(tid)
                if server is not None:
                    server.spans.append(rec)
                    continue
                if id(rec) in client_recs:
                    continue
                if tid in joined_map:  # a straggler of a joined server trace
                    out.append(self._rewrite(rec))
                    continue
                target = _linked(rec[ENCODED], tid, held, joined_map) if held or joined_map else None
                if target is None:
                    out.append(rec)
                elif target in held:
                    held[target].spans.append(rec)
                    self._waiting_linked[tid] = self._waiting_linked.get(tid, 0) + 1
                else:
                    out.append(self._rewrite(rec))
            for tid, server in new_servers.items():
                forgotten += self._remember(("s", tid), server, out, attrs)
                for key in server.keys:
                    self._servers.setdefault(key, []).append(server)
            for rec, rid, span_id in clients:
                client = _Client(rid, rec[TRACE_ID], span_id, now, [rec], attrs.get(rec[TRACE_ID]))
                self._waiting_clients[client.trace_id] = self._waiting_clients.get(client.trace_id, 0) + 1
                old = self._clients.get(rid)
                if old is not None:  # the same response id again: the later call waits
                    self._pending.pop(("c", rid.encode()), None)
                    self._release_client(old, out, attrs)
                self._clients[rid] = client
                forgotten += self._remember(("c", rid.encode()), client, out, attrs)
            # 3. join: the new halves with their waiting partners
            for rec, rid, _ in clients:
                client = self._clients.get(rid)
                if client is None:  # forgotten already (a table of a few entries)
                    continue
                for server in list(self._servers.get(rid, ())):
                    if server.trace_id in self._held:
                        self._join(server, client, out, attrs)
                        joined += 1
            for server in new_servers.values():
                for key in server.keys:
                    client = self._clients.get(key)
                    if client is not None and server.trace_id in self._held:
                        self._join(server, client, out, attrs)
                        joined += 1
                        break
            self._expire(now, out, attrs)
        if joined:
            self._t.inc("trace_join_joined", joined)
        if forgotten:
            self._t.inc("trace_join_forgotten", forgotten)
        return Extracted(out, [r[REQUEST] for r in out if r[REQUEST] is not None], 0, None, attrs or None)

    def expire(self) -> Extracted:
        """The halves that waited ``wait`` seconds, going on alone (the gateway calls this before each decision)."""
        out: list[SpanRecord] = []
        attrs: dict[bytes, dict[str, list[Any]]] = {}
        with self._lock:
            self._expire(self._clock(), out, attrs)
        return Extracted(out, [r[REQUEST] for r in out if r[REQUEST] is not None], 0, None, attrs or None)

    def drain(self) -> Extracted:
        """Everything waiting, going on as it is (at shutdown)."""
        out: list[SpanRecord] = []
        attrs: dict[bytes, dict[str, list[Any]]] = {}
        with self._lock:
            self._expire(float("inf"), out, attrs)
        return Extracted(out, [r[REQUEST] for r in out if r[REQUEST] is not None], 0, None, attrs or None)

    # -- inside --------------------------------------------------------------------------------

    def _remember(self, key: tuple[str, bytes], half: _Server | _Client, out: list, attrs: dict) -> int:
        self._pending[key] = half
        if len(self._pending) <= self._max:
            return 0
        _, oldest = self._pending.popitem(last=False)
        self._forget(oldest, out, attrs)
        return 1

    def _forget(self, half: _Server | _Client, out: list, attrs: dict) -> None:
        """A half that goes on alone."""
        if isinstance(half, _Server):
            if self._held.pop(half.trace_id, None) is not None:
                self._release_server(half, out, attrs, None)
            self._unlist(half)
        else:
            if self._clients.get(half.response_id) is half:
                del self._clients[half.response_id]
            self._release_client(half, out, attrs)

    def _unlist(self, server: _Server) -> None:
        for key in server.keys:
            waiting = self._servers.get(key)
            if waiting is not None:
                waiting[:] = [s for s in waiting if s is not server]
                if not waiting:
                    del self._servers[key]

    def _expire(self, now: float, out: list, attrs: dict) -> None:
        pending = self._pending
        while pending:
            key, half = next(iter(pending.items()))
            if half.arrived + self._wait > now:
                break
            del pending[key]
            if isinstance(half, _Server) and half.trace_id in self._held:
                self._t.inc("trace_join_alone", side="server")
            elif isinstance(half, _Client) and half.spans:
                self._t.inc("trace_join_alone", side="client")
            self._forget(half, out, attrs)

    def _release_client(self, client: _Client, out: list, attrs: dict) -> None:
        if not client.spans:
            return
        out.extend(client.spans)
        if client.attributes:
            _merge(attrs, client.trace_id, client.attributes)
        client.spans = []
        n = self._waiting_clients.pop(client.trace_id, 1) - 1
        if n > 0:
            self._waiting_clients[client.trace_id] = n

    def _release_server(self, server: _Server, out: list, attrs: dict, into: bytes | None) -> None:
        linked = self._waiting_linked
        for rec in server.spans:
            tid = rec[TRACE_ID]
            if tid != server.trace_id and tid in linked:
                if linked[tid] > 1:
                    linked[tid] -= 1
                else:
                    del linked[tid]
            out.append(self._rewrite(rec) if into is not None or self._joined else rec)
        if server.attributes:
            _merge(attrs, into or server.trace_id, server.attributes)
        server.spans = []

    def _join(self, server: _Server, client: _Client, out: list, attrs: dict) -> None:
        del self._held[server.trace_id]
        self._pending.pop(("s", server.trace_id), None)
        self._unlist(server)
        self._joined[server.trace_id] = (client.trace_id, client.span_id, server.root_span_id)
        while len(self._joined) > self._max:
            self._joined.popitem(last=False)
        self._release_client(client, out, attrs)
        self._release_server(server, out, attrs, client.trace_id)

    def _rewrite(self, rec: SpanRecord) -> SpanRecord:
        """``rec`` with its trace id, root parent and links moved into the client traces they were joined to."""
        moved = rejoin_span(rec[ENCODED], self._joined)
        if moved is None:
            return rec
        encoded, tid, parented = moved
        facts = rec[REQUEST]
        if facts is not None:
            facts = dataclasses.replace(facts, trace_id=tid, parented=parented)
        return (tid, rec[1], encoded, rec[3], rec[4], rec[5], not parented, facts)


def _response_id(view: Any) -> str | None:
    encoded = view.attributes[RESPONSE_ID] if RESPONSE_ID in view.attributes else None
    value = value_of(encoded) if encoded is not None else None
    return value if isinstance(value, str) and value else None


_TRACE_ID_FIELD = b"\n\x10"  # field 1 (trace_id), length 16: how a Span and a Span.Link begin


def _linked(raw: bytes, own: bytes, held: dict, joined: dict) -> bytes | None:
    """A waiting or joined server trace id that the encoded span links to (a scan for 16-byte field-1 values:
    a link's trace id is one; a candidate only counts when it is a trace id waiting or joined here)."""
    i = raw.find(_TRACE_ID_FIELD)
    while i >= 0:
        t = raw[i + 2:i + 18]
        if t != own and (t in held or t in joined):
            return t
        i = raw.find(_TRACE_ID_FIELD, i + 2)
    return None


def _merge(attrs: dict, tid: bytes, values: dict[str, list[Any]]) -> None:
    into = attrs.get(tid)
    if into is None:
        attrs[tid] = values
    else:
        for k, vs in values.items():
            into.setdefault(k, []).extend(v for v in vs if v not in into.get(k, ()))
