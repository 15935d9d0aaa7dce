"""OTLP/HTTP receiver: ``POST /v1/traces``, protobuf or JSON, optionally gzip, on a threading HTTP server.
``/v1/metrics`` and ``/v1/logs`` (protobuf) go to the gateway's metrics and logs pipelines under the same
limits, admission and deadlines (404 when the config runs no such pipeline).

Bad input gets a 4xx with a ``google.rpc.Status`` body (in the request's content type)
saying why, and is counted by reason. The body size is checked before reading it (OTLP/JSON
has its own, smaller cap), and gzip is inflated incrementally with an output cap, so neither a
large body nor a gzip bomb can take more than ``max_request_body_size`` of memory.

Slow clients: the request line and headers must arrive within ``read_header_timeout`` and the body
within ``read_timeout`` after them - whole-request deadlines enforced by a watchdog that shuts the
socket down, whatever the client's pace (a per-read timeout restarts with every byte). A processing
slot (``max_concurrent_requests``, 503 + Retry-After beyond it) is taken only once the body is in, so
clients still sending hold none. Connections are capped (``max_connections``; the next one gets a 503
and is closed) and so are header bytes (``max_header_bytes``, 431). Every refusal is counted in
``receiver_bad_requests{transport="http", reason}``; a client that disconnects or times out is counted,
never logged with a traceback. Parsing happens outside the gateway's pipeline lock.

Connections and processing slots are shared per peer (``fairness.PeerSlots``): a peer - the token's tenant
with ``auth``, else the source address - may use free capacity; when the connections are full, a newcomer
takes the slot of an idle keep-alive connection, else of a body arriving below ``min_data_rate``, of the
peer furthest above its fair share (or of its own peer): that connection is shut down and counted
(``evicted_idle``, ``evicted_slow``). A connection is idle while it waits for a request's headers, receiving
while its body arrives, live from its headers to its response (never taken). ``trusted_peers`` are held to
the caps only. With ``auth`` a connection also waits in a small unauthenticated pool (shared the same way)
until its token is checked, then is charged to its tenant. OTLP/JSON bodies are parsed in a worker process
(``json_workers``), each peer within a byte budget (429 ``json_budget``).

With ``tls`` the port is HTTPS only (TLS >= 1.2; ``client_ca_file`` makes a client certificate
mandatory). The handshake runs on the connection's own thread, never in the accept loop, so a
plaintext client, a failed handshake or a client that never finishes one costs one thread for
at most the socket timeout; each is counted as ``receiver_bad_requests{reason="tls"}``.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from otel_llm.otlp import messages
from otel_llm.otlp.json_codec import OtlpJsonError, parse_request

from ..auth import BearerAuth
from ..config import HttpReceiverConfig, TLSServerConfig
from ..fairness import BUSY, IDLE, LIVE, PEER_SHARE, RECEIVING, ByteBudgets, Clock, Peer, PeerSlots, Slot, \
    TrustedPeers
from ..storage import StorageFull
from ..telemetry import GatewayMetrics
from . import REFUSED_MESSAGE, SIGNAL_PATHS, Ingest, Parse, SignalIngest
from . import compression
from .json_workers import JsonParser, JsonWorkersBusy, ParsedJson
from .watchdog import Deadline, Watchdog

log = logging.getLogger("otel_llm_collector")

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SOCKET_TIMEOUT_S = 10.0  # the TLS handshake's, and a backstop on each read and write
_CHUNK = 1 << 16
_BUSY_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
               b"Connection: close\r\n\r\n")


class BadRequest(Exception):
    def __init__(self, status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.headers = status, reason, message, headers


def inflate(body: bytes, limit: int) -> bytes:
    """gunzip with an output cap (gzip-bomb safe)."""
    try:
        return compression.inflate(body, limit)
    except compression.InflateError as exc:
        raise BadRequest(413 if exc.reason == "gzip_too_large" else 400, exc.reason, exc.message) from None


class _HeaderLimit:
    """Stands in for ``rfile`` while the headers are read: at most ``left`` bytes of them."""

    def __init__(self, rfile: object, left: int) -> None:
        self._rfile, self.left, self.exceeded = rfile, left, False

    def readline(self, size: int = -1) -> bytes:
        if self.left <= 0:
            self.exceeded = True
            raise http.client.LineTooLong("header block")
        line = self._rfile.readline(min(size, self.left + 1) if size >= 0 else self.left + 1)  # type: ignore[attr-defined]
        self.left -= len(line)
        if self.left < 0:
            self.exceeded = True
            raise http.client.LineTooLong("header block")
        return line


@dataclass
class _Conn:
    """What one connection holds: its slot in the connection cap (charged to its source address, with auth to
    its tenant once the token is checked) and, with auth until then, a slot in the unauthenticated pool."""

    address: str
    slot: Slot
    unauthenticated: Slot | None = None
    authenticated: bool = False

    @property
    def peer(self) -> Peer:
        return self.slot.peer

    @property
    def taken(self) -> bool:
        """The connection's slot was taken for another peer's newcomer (it is being shut down)."""
        return self.slot.evicted is not None or (self.unauthenticated is not None
                                                 and self.unauthenticated.evicted is not None)


def _shutdown(sock: socket.socket) -> Callable[[str], None]:
    def shutdown(_reason: str) -> None:
        try:  # the plain socket's shutdown (an SSLSocket's would unwrap under its reader's feet)
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # already closed
    return shutdown


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    tls: ssl.SSLContext | None = None
    telemetry: GatewayMetrics | None = None

    def __init__(self, *args: object, cfg: HttpReceiverConfig, clock: Clock = time.monotonic,
                 **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.trusted = TrustedPeers(cfg.trusted_peers)
        self.slots = PeerSlots(cfg.max_connections, cfg.min_data_rate, clock=clock)
        # with auth, a connection is confined to this pool (shared by source address) until its token is
        # checked, so connections that never present one cannot take the connection cap
        self.unauthenticated = PeerSlots(cfg.max_unauthenticated_connections, cfg.min_data_rate, clock=clock) \
            if cfg.auth is not None else None
        self._conns: dict[socket.socket, _Conn] = {}  # open connections (at most max_connections entries)
        self._conns_lock = threading.Lock()

    @property
    def connections(self) -> int:
        return self.slots.in_use

    def _count(self, reason: str) -> None:
        if self.telemetry is not None:
            self.telemetry.inc("receiver_bad_requests", transport="http", reason=reason)

    def _admit(self, address: str, request: socket.socket) -> tuple[_Conn | None, str]:
        """A connection's slots (taking an idle or slow one of another connection when full, counted), or None
        and the refusal reason. The connection is idle until its first request's headers are in."""
        peer = self.trusted.peer(address)
        admitted: list[_Conn] = []

        def evict(reason: str) -> None:  # either slot taken: shut the connection down, give back the other one
            _shutdown(request)(reason)
            for conn in admitted:
                self.slots.release(conn.slot)
                if conn.unauthenticated is not None and self.unauthenticated is not None:
                    self.unauthenticated.release(conn.unauthenticated)

        got = self.slots.acquire(peer, IDLE, evict)  # charged to its source address (to its tenant later)
        if got.slot is None:
            return None, _CONNECTION_REFUSAL[got.refused or BUSY]
        if got.evicted:
            self._count(got.evicted)
        conn = _Conn(address, got.slot)
        if self.unauthenticated is not None and not peer.trusted:
            pool = self.unauthenticated.acquire(peer, IDLE, evict)
            if pool.slot is None:
                self.slots.release(got.slot)
                return None, "unauthenticated_pool" if pool.refused == BUSY else PEER_SHARE
            if pool.evicted:
                self._count(pool.evicted)
            conn.unauthenticated = pool.slot
        admitted.append(conn)
        return conn, ""

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        conn, why = self._admit(_address(client_address), request)
        if conn is None:  # refuse in the accept loop without blocking it: one non-blocking write, then close
            self._count(why)
            if not isinstance(request, ssl.SSLSocket):
                try:
                    request.setblocking(False)
                    request.send(_BUSY_REPLY)
                except OSError:
                    pass
            self.shutdown_request(request)
            return
        with self._conns_lock:
            self._conns[request] = conn
        try:
            super().process_request(request, client_address)
        except Exception:  # a thread could not start: give the connection back
            self._release(request)
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def connection(self, request: socket.socket) -> _Conn | None:
        with self._conns_lock:
            return self._conns.get(request)

    def authenticated(self, conn: _Conn, tenant: str) -> bool:
        """A connection's token named ``tenant``: charge its slot to the tenant and leave the unauthenticated
        pool. False when the connection's slot was taken meanwhile (it is being shut down)."""
        peer = Peer(conn.address, tenant, conn.peer.trusted)
        if conn.authenticated and conn.peer == peer:
            return not conn.taken
        if not self.slots.bind(conn.slot, peer):
            return False
        conn.authenticated = True
        if conn.unauthenticated is not None and self.unauthenticated is not None:
            self.unauthenticated.release(conn.unauthenticated)
            conn.unauthenticated = None
        return True

    def mark(self, conn: _Conn, state: str) -> bool:
        """The connection is now idle, receiving a body or live; False when its slot was taken meanwhile."""
        ok = self.slots.mark(conn.slot, state)
        if conn.unauthenticated is not None and self.unauthenticated is not None:
            ok = self.unauthenticated.mark(conn.unauthenticated, state) and ok
        return ok

    def _release(self, request: socket.socket) -> None:
        with self._conns_lock:
            conn = self._conns.pop(request, None)
        if conn is None:
            return
        self.slots.release(conn.slot)
        if conn.unauthenticated is not None and self.unauthenticated is not None:
            self.unauthenticated.release(conn.unauthenticated)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that resets, times out or vanishes is ordinary: counted, not a traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (OSError, ValueError)):  # ConnectionError, TimeoutError, SSLError, closed file
            self._count("disconnected")
            return
        self._count("internal")
        log.error("OTLP/HTTP handler failed: %s: %s", type(exc).__name__, exc)

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = super().get_request()
        if self.tls is not None:  # no handshake here: this is the accept loop, one slow client would stall it
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if isinstance(request, ssl.SSLSocket):  # on the connection's thread
            try:
                request.settimeout(SOCKET_TIMEOUT_S)
                request.do_handshake()
            except (OSError, ValueError):  # SSLError is an OSError: plaintext client, no or bad client cert, timeout
                self._count("tls")
                return  # the caller (process_request_thread) closes the socket
        super().finish_request(request, client_address)


_CONNECTION_REFUSAL = {BUSY: "too_many_connections", PEER_SHARE: PEER_SHARE}


def _address(client_address: object) -> str:
    return str(client_address[0]) if isinstance(client_address, tuple) and client_address else "unknown"


def server_context(tls: TLSServerConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=tls.client_ca_file)
    return ctx


class HttpReceiver:
    def __init__(self, cfg: HttpReceiverConfig, ingest: Ingest, telemetry: GatewayMetrics,
                 parse: Parse = messages.parse_request, signals: dict[str, SignalIngest] | None = None,
                 clock: Clock = time.monotonic) -> None:
        """``ingest`` parses nothing itself and takes the gateway's pipeline lock only around processing;
        ``parse`` validates a protobuf body (``MalformedRequest``: refused) into what ``ingest`` takes."""
        self.cfg = cfg
        self.ingest = ingest
        self.parse = parse
        self.signals = signals or {}  # /v1/metrics, /v1/logs: the pipelines the gateway runs for them
        self.telemetry = telemetry
        # processing slots (bodies in, being parsed and ingested): every one is live, so none is ever taken;
        # any peer may use them while free (processing is short: holding them takes a stream of real requests)
        self.slots = PeerSlots(cfg.max_concurrent_requests, cfg.min_data_rate, clock=clock)
        self.auth = BearerAuth(cfg.auth) if cfg.auth is not None else None
        self.watchdog = Watchdog()
        receiver = self

        class Handler(_Handler):
            owner = receiver

        tls = server_context(cfg.tls) if cfg.tls is not None else None  # before binding: a bad cert binds nothing
        self._server = _Server((cfg.host, cfg.port), Handler, cfg=cfg, clock=clock)
        self._server.tls, self._server.telemetry = tls, telemetry
        self.json = JsonParser(cfg.json_workers) if cfg.json_workers else None
        self.json_budget = ByteBudgets(cfg.json_bytes_per_peer_per_second, max(cfg.json_bytes_per_peer_per_second,
                                                                                   cfg.max_json_body_bytes))
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return self._server.connections

    @property
    def connection_slots(self) -> PeerSlots:
        return self._server.slots

    @property
    def unauthenticated_slots(self) -> PeerSlots | None:
        return self._server.unauthenticated

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.watchdog.stop()
        if self.json is not None:
            self.json.close()


class _Handler(BaseHTTPRequestHandler):
    owner: HttpReceiver
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S
    server_version = "otel-llm-collector"
    _head: Deadline | None = None
    _conn: _Conn | None = None
    _signal: str | None = "traces"

    def _state(self, state: str) -> bool:
        """Tell the connection pools what this connection does now; False when its slot was taken."""
        if self._conn is None:
            self._conn = self.server.connection(self.request)  # type: ignore[attr-defined]
        return self._conn is not None and self.server.mark(self._conn, state)  # type: ignore[attr-defined]

    def handle_one_request(self) -> None:
        """One request; its line and headers under ``read_header_timeout`` (which also ends idle keep-alives)."""
        owner = self.owner
        if not self._state(IDLE):  # taken for another peer's newcomer while it answered
            self.close_connection = True
            return
        self._head = owner.watchdog.arm(self.connection, owner.cfg.read_header_timeout, "header_timeout")
        self.raw_requestline = b""
        try:
            super().handle_one_request()
        finally:
            owner.watchdog.disarm(self._head)
        if self._head.expired and self.raw_requestline:  # a request had started: count it (an idle close is not)
            self.owner.telemetry.inc("receiver_bad_requests", transport="http", reason="header_timeout")
            self.close_connection = True

    def parse_request(self) -> bool:
        limit = _HeaderLimit(self.rfile, self.owner.cfg.max_header_bytes - len(self.raw_requestline))
        rfile, self.rfile = self.rfile, limit  # type: ignore[assignment]
        try:
            ok = super().parse_request()  # LineTooLong -> a 431 reply, ok False
        finally:
            self.rfile = rfile
        if limit.exceeded:
            self.owner.telemetry.inc("receiver_bad_requests", transport="http", reason="headers_too_large")
        if ok and self._head is not None:
            self.owner.watchdog.disarm(self._head)
            if self._head.expired:  # the deadline cut the headers short
                self.close_connection = True
                return False
        if ok and not self._state(LIVE):  # taken while idle: the request came too late to keep it
            self.close_connection = True
            return False
        return ok

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # counted in telemetry instead of one stderr line per request

    def _reply(self, status: int, content_type: str, body: bytes, close: bool = False,
               extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, err: BadRequest, json_reply: bool, close: bool = False,
               extra: dict[str, str] | None = None) -> None:
        self.owner.telemetry.inc("receiver_bad_requests", transport="http", reason=err.reason)
        body = messages.error_status(_GRPC_CODE.get(err.status, 3), err.message, as_json=json_reply)
        ctype = JSON if json_reply else PROTOBUF
        if err.status == 503:
            extra = {**(extra or {}), "Retry-After": "1"}
        self._reply(err.status, ctype, body, close, extra)

    def _refuse(self, status: int, reason: str, message: str, extra: dict[str, str] | None = None) -> None:
        """A request we answer without reading its body: close the connection afterwards."""
        self._error(BadRequest(status, reason, message), json_reply=JSON in (self.headers.get("Content-Type") or ""),
                    close=True, extra=extra)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._refuse(405, "method", f"use POST {PATH}")

    do_PUT = do_DELETE = do_PATCH = do_GET

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        self._signal = "traces" if path == PATH else SIGNAL_PATHS.get(path)
        if self._signal is None:
            return self._refuse(404, "path", f"unknown path {self.path[:100]!r}; traces go to {PATH}, metrics to "
                                             "/v1/metrics, logs to /v1/logs")
        if self._signal != "traces" and self._signal not in self.owner.signals:
            return self._refuse(404, "no_pipeline", f"this gateway runs no {self._signal} pipeline "
                                                    f"(service.pipelines); traces go to {PATH}")
        auth = self.owner.auth
        server: _Server = self.server  # type: ignore[assignment]
        conn = server.connection(self.request)
        if conn is None:  # cannot happen: every served connection was admitted
            return self._refuse(500, "internal", "connection not admitted")
        if auth is not None:
            tenant = auth.tenant(self.headers.get(auth.header))
            if tenant is None:
                return self._refuse(401, "unauthenticated", "missing or wrong bearer token",
                                    {"WWW-Authenticate": "Bearer"})
            if not server.authenticated(conn, tenant):  # its slot was taken meanwhile: it is being shut down
                self.close_connection = True
                return None
        self._post(conn.peer)

    def _post(self, peer: Peer) -> None:
        cfg = self.owner.cfg
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        is_json = ctype == JSON
        if ctype not in (PROTOBUF, JSON):
            return self._refuse(415, "content_type",
                                f"unsupported Content-Type {ctype!r}; use {PROTOBUF} or {JSON}")
        if is_json and self._signal != "traces":
            return self._refuse(415, "content_type", f"OTLP/JSON is taken for traces only; send {self._signal} as "
                                                     f"{PROTOBUF} (the SDKs' default)")
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip", "none"):
            return self._refuse(415, "content_encoding", f"unsupported Content-Encoding {encoding!r}; use gzip")
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length") is None:
            return self._refuse(411, "length_required", "a Content-Length is required (chunked bodies are refused)")
        try:
            length = int(self.headers["Content-Length"])
            if length < 0:
                raise ValueError
        except ValueError:
            return self._refuse(400, "bad_length", "Content-Length is not a non-negative integer")
        limit = cfg.max_json_body_bytes if is_json else cfg.max_body_bytes
        if length > limit:
            self._drain(length)  # so the client reads our 413 rather than a reset connection
            kind = "an OTLP/JSON" if is_json else "a"
            return self._refuse(413, "too_large", f"body of {length} bytes exceeds the limit of {limit} for {kind} body")
        body = self._read_body(length)
        if body is None:
            return
        got = self.owner.slots.acquire(peer)  # only now: a client still sending holds no slot
        if got.slot is None:
            return self._error(BadRequest(503, got.refused or BUSY, "too many concurrent requests; retry later"),
                               is_json)
        try:
            if len(body) < length:
                raise BadRequest(400, "truncated", f"body ended after {len(body)} of {length} bytes")
            if encoding == "gzip":
                body = inflate(body, limit)
            message = REFUSED_MESSAGE
            if self._signal != "traces":  # metrics, logs: protobuf only, handed to their pipeline whole
                try:
                    rejected, message = self.owner.signals[self._signal](body, "http", peer)
                except messages.MalformedRequest as exc:
                    raise BadRequest(400, "malformed_protobuf", str(exc)) from None
            elif is_json:
                wait = self.owner.json_budget.take(peer, len(body))
                if wait > 0:
                    raise BadRequest(429, "json_budget", f"OTLP/JSON byte budget spent; retry in {wait:.1f} s",
                                     {"Retry-After": str(max(1, math.ceil(wait)))})
                request = self._parse_json(body)
                raw = None
                if isinstance(request, ParsedJson):  # parsed in a worker process: read here as protobuf is
                    raw = request.protobuf
                    try:
                        request = self._parse(raw, False)
                    except BadRequest as err:  # still the client's JSON that was wrong
                        raise BadRequest(400, "malformed_json", err.message) from None
            else:
                raw = body
                request = self._parse(body, False)  # outside the pipeline lock: a big body stalls nobody
            if self._signal == "traces":
                rejected = self.owner.ingest(request, "http", raw, peer)
        except BadRequest as err:
            return self._error(err, is_json, extra=err.headers)
        except StorageFull:  # the write-ahead log's disk budget is spent: nothing was taken, the client retries
            return self._error(BadRequest(503, "storage_full", "the gateway's disk budget is spent; retry later"),
                               is_json)
        except Exception as exc:  # noqa: BLE001 - a processing bug must not take the receiver down
            return self._error(BadRequest(500, "internal", f"processing failed: {type(exc).__name__}"), is_json)
        finally:
            self.owner.slots.release(got.slot)
        self._reply(200, JSON if is_json else PROTOBUF, messages.response(rejected, message, as_json=is_json))

    def _read_body(self, length: int) -> bytes | None:
        """The body, read under ``read_timeout`` (the whole body, not each read); None when the client was
        too slow or went away (counted; the connection is closed). Memory grows with what arrives, not with
        what the client declared."""
        owner = self.owner
        deadline = owner.watchdog.arm(self.connection, owner.cfg.read_timeout, "read_timeout")
        # The watchdog owns the body's deadline. The socket's own timeout (a backstop per read) would cut a
        # client that pauses longer than it between two chunks while still inside ``read_timeout``, and
        # count it as disconnected: while the body arrives, it is the whole deadline.
        self.connection.settimeout(max(self.timeout, owner.cfg.read_timeout))
        parts, left = [], length
        conn = self._conn if self._state(RECEIVING) else None
        try:
            while left > 0 and conn is not None:
                chunk = self.rfile.read1(min(left, _CHUNK))
                if not chunk:
                    break
                parts.append(chunk)
                left -= len(chunk)
                conn.slot.received += len(chunk)
        except (OSError, ValueError) as exc:
            if conn is not None and conn.taken:  # shut down to give its slot to a newcomer: counted there
                self.close_connection = True
                return None
            late = isinstance(exc, TimeoutError) and "read_timeout"
            owner.telemetry.inc("receiver_bad_requests", transport="http",
                                reason=deadline.expired or late or "disconnected")
            self.close_connection = True
            return None
        finally:
            owner.watchdog.disarm(deadline)
            self._restore_timeout()
        if conn is None or not self._state(LIVE):  # taken while slow: counted as evicted_slow by the taker
            self.close_connection = True
            return None
        if deadline.expired:
            owner.telemetry.inc("receiver_bad_requests", transport="http", reason=deadline.expired)
            self.close_connection = True
            return None
        if left and not parts:  # nothing at all: the client went away
            owner.telemetry.inc("receiver_bad_requests", transport="http", reason="disconnected")
            self.close_connection = True
            return None
        return b"".join(parts)

    def _restore_timeout(self) -> None:
        try:
            self.connection.settimeout(self.timeout)
        except OSError:  # already closed by the watchdog
            pass

    def _drain(self, length: int, cap: int = 64 << 20) -> None:
        """Discard up to ``cap`` bytes of an unwanted body in small chunks (constant memory)."""
        left = min(length, cap)
        deadline = self.owner.watchdog.arm(self.connection, self.owner.cfg.read_timeout, "read_timeout")
        self.connection.settimeout(max(self.timeout, self.owner.cfg.read_timeout))  # as in _read_body
        try:
            while left > 0:
                chunk = self.rfile.read1(min(left, _CHUNK))
                if not chunk:
                    break
                left -= len(chunk)
        except (OSError, ValueError):
            pass
        finally:
            self.owner.watchdog.disarm(deadline)
            self._restore_timeout()

    def _parse_json(self, body: bytes) -> object:
        """OTLP/JSON in a worker process (its parse holds a GIL, not ours), or here without workers."""
        parser = self.owner.json
        if parser is None:
            return self._parse(body, True)
        try:
            done = parser.parse(body)
        except JsonWorkersBusy as exc:
            raise BadRequest(503, "busy", str(exc)) from None
        if done.error is not None:
            raise BadRequest(400, "malformed_json", done.error)
        return done

    def _parse(self, body: bytes, is_json: bool) -> object:
        if is_json:
            try:
                return parse_request(body)
            except OtlpJsonError as exc:
                raise BadRequest(400, "malformed_json", str(exc)) from None
            except (RecursionError, ValueError, TypeError, OverflowError, MemoryError) as exc:
                # nested too deep for the parser, or a value the OTLP classes refuse: still the client's input
                raise BadRequest(400, "malformed_json", f"cannot parse OTLP/JSON: {type(exc).__name__}") from None
        try:
            return self.owner.parse(body)
        except messages.MalformedRequest as exc:
            raise BadRequest(400, "malformed_protobuf", str(exc)) from None


# HTTP status -> google.rpc.Code, for the Status body
_GRPC_CODE = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}
