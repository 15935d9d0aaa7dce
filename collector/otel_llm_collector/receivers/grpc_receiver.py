"""OTLP/gRPC receiver: ``TraceService/Export`` on an asyncio gRPC server in its own thread; ``MetricsService``
and ``LogsService`` beside it, through the same handler, for the pipelines the gateway runs for them.

Waiting for a client costs no thread: the server runs on an event loop, and a call's message is
awaited under ``read_timeout`` (a server-side receive deadline: a client that opens a call and
sends its message late gets DEADLINE_EXCEEDED, counted as ``reason="read_timeout"``). A received
message is parsed (outside the gateway's pipeline lock) and ingested on the loop's thread (``workers: 0``,
the default and the fastest: no hand-off) or on a pool of ``workers`` threads. The method is served as client-streaming so the handler runs as soon as
the call starts (a unary client sends one message; that is the same on the wire), which is what lets
it put a deadline on the message. Calls in flight are capped (``max_concurrent_requests``; beyond it
RESOURCE_EXHAUSTED, counted as ``reason="busy"``), and connections are closed after
``keepalive.server_parameters.max_connection_age`` (+ ``max_connection_age_grace``), upstream's keys.

The request arrives as raw bytes (identity deserializer) so that a malformed body becomes a counted
``INVALID_ARGUMENT`` with the parser's reason, and an oversized one a counted ``RESOURCE_EXHAUSTED``.
gRPC's own inflation is off: a compressed message is inflated here with an output cap (a gzip bomb is a
counted ``gzip_too_large``), and gRPC's hard cap is 4 x ours, so every refusal below it has its reason.

Calls are shared per peer (``fairness.PeerSlots``): a peer - the token's tenant with ``auth``, else the
source address - may use free capacity. When ``max_concurrent_requests`` are in flight, a new call takes
the slot of a call still waiting for its message (below ``min_data_rate`` for at least a second) of the
peer furthest above its fair share, or of its own peer; that call ends RESOURCE_EXHAUSTED and is counted
(``reason="evicted_slow"``). With nothing to take, the new call gets RESOURCE_EXHAUSTED (``peer_share`` or
``busy``). A call whose message is in is never taken. ``trusted_peers`` (the load-balancing tier) are held to
the cap only. The token is checked before a slot is taken.

With ``tls`` the port is TLS only (gRPC's own handshake; ``client_ca_file`` makes a client certificate
mandatory). With ``auth`` a call must carry ``authorization: Bearer <token>`` metadata (UNAUTHENTICATED
otherwise, counted as ``reason="unauthenticated"``).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio
from otel_llm.otlp import messages

from ..auth import BearerAuth
from ..config import GrpcReceiverConfig, TLSServerConfig, read_pem
from ..fairness import LIVE, PEER_SHARE, RECEIVING, Clock, Peer, PeerSlots, Slot, TrustedPeers
from ..storage import StorageFull
from ..telemetry import GatewayMetrics
from . import REFUSED_MESSAGE, SIGNAL_SERVICES, Ingest, Parse, SignalIngest
from .compression import InflateError, inflate_message

SERVICE = messages.SERVICE
HARD_CAP_FACTOR = 4


class _Refused(Exception):
    """``reason`` None: counted elsewhere (a call whose slot was taken is counted by the call that took it)."""

    def __init__(self, code: grpc.StatusCode, reason: str | None, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class GrpcReceiver:
    def __init__(self, cfg: GrpcReceiverConfig, ingest: Ingest, telemetry: GatewayMetrics,
                 parse: Parse = messages.parse_request, signals: dict[str, SignalIngest] | None = None,
                 clock: Clock = time.monotonic) -> None:
        self._cfg = cfg
        self._signals = signals or {}  # MetricsService, LogsService: the pipelines the gateway runs for them
        self._ingest = ingest
        self._parse = parse  # validates the bytes (MalformedRequest: refused) into what ``ingest`` takes
        self._t = telemetry
        self._auth = BearerAuth(cfg.auth) if cfg.auth is not None else None
        self._in_flight = 0
        self.trusted = TrustedPeers(cfg.trusted_peers)
        # calls in flight, shared by peers (the token's tenant, else the source address) under contention
        self.slots = PeerSlots(cfg.max_concurrent_requests, cfg.min_data_rate, clock=clock)
        self._pool = (ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="otlp-grpc")
                      if cfg.workers else None)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="otlp-grpc-loop", daemon=True)
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._bind(), self._loop).result(30)
        except BaseException:
            self._close_loop()
            raise

    async def _bind(self) -> int:
        cfg = self._cfg
        # gRPC's own refusals reach no handler (uncounted) and, for a gzip bomb, raced our abort of the same
        # call (a logged ExecuteBatchError). So gRPC does not inflate (we do, with an output cap: a bomb is a
        # counted gzip_too_large) and its hard cap is HARD_CAP_FACTOR x ours: an oversized message reaches the
        # handler and is a counted too_large; only one above the hard cap is refused by gRPC itself.
        options = [("grpc.max_receive_message_length", HARD_CAP_FACTOR * cfg.max_message_bytes + (64 << 10)),
                   ("grpc.so_reuseport", 0), ("grpc.per_message_decompression", 0)]
        if cfg.max_connection_age > 0:
            options += [("grpc.max_connection_age_ms", int(cfg.max_connection_age * 1000)),
                        ("grpc.max_connection_age_grace_ms", int(cfg.max_connection_age_grace * 1000))]
        # gRPC's own cap, a backstop above ours (its refusals reach no handler, so they cannot be counted)
        self._server = grpc.aio.server(maximum_concurrent_rpcs=cfg.max_concurrent_requests * 2, options=options)
        handler = grpc.stream_unary_rpc_method_handler(self._export, request_deserializer=None,
                                                       response_serializer=None)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        for signal in self._signals:  # the same admission, deadlines and limits; another pipeline
            h = grpc.stream_unary_rpc_method_handler(functools.partial(self._export, signal=signal),
                                                     request_deserializer=None, response_serializer=None)
            self._server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(SIGNAL_SERVICES[signal], {"Export": h}),))
        address = f"{cfg.host}:{cfg.port}"
        try:
            port = (self._server.add_insecure_port(address) if cfg.tls is None
                    else self._server.add_secure_port(address, _credentials(cfg.tls)))
        except RuntimeError as exc:  # grpc.aio raises where the sync server returned 0
            raise OSError(f"cannot bind OTLP/gRPC receiver to {cfg.host}:{cfg.port}: {exc}") from None
        if not port:
            raise OSError(f"cannot bind OTLP/gRPC receiver to {cfg.host}:{cfg.port}")
        return port

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.start(), self._loop).result(30)

    def stop(self, grace: float = 1.0) -> None:
        if not self._thread.is_alive():  # stopped already (the loop no longer runs coroutines)
            return
        try:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop).result(grace + 30)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    @property
    def in_flight(self) -> int:
        """Calls being served now (waiting for their message included)."""
        return self._in_flight

    async def _export(self, requests, context: grpc.aio.ServicerContext, signal: str = "traces") -> bytes:
        cfg = self._cfg
        self._in_flight += 1  # on the event loop's thread only: no lock needed
        slot: Slot | None = None
        message: asyncio.Future | None = None
        try:
            address = peer_address(context.peer())
            tenant = None
            if self._auth is not None:  # the token is in the call's headers: checked before any slot is taken
                tenant = self._auth.tenant(_metadata(context, self._auth.header))
                if tenant is None:
                    raise _Refused(grpc.StatusCode.UNAUTHENTICATED, "unauthenticated", "missing or wrong bearer token")
            loop = asyncio.get_running_loop()
            taken: asyncio.Future = loop.create_future()

            def evict(reason: str) -> None:  # on this loop's thread (acquire runs here), or from another
                loop.call_soon_threadsafe(lambda: taken.done() or taken.set_result(reason))

            got = self.slots.acquire(self.trusted.peer(address, tenant), RECEIVING, evict)
            if got.slot is None:
                raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, got.refused or "busy",
                               "this peer holds its fair share of the concurrent calls; retry later"
                               if got.refused == PEER_SHARE else "too many concurrent calls; retry later")
            if got.evicted:
                self._t.inc("receiver_bad_requests", transport="grpc", reason=got.evicted)
            slot = got.slot
            peer: Peer = slot.peer
            message = asyncio.ensure_future(requests.__anext__())
            message.add_done_callback(_retrieve)  # a read that ends with the aborted call is not an error
            done, _ = await asyncio.wait((message, taken), timeout=cfg.read_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if message not in done:
                message.cancel()
                if taken.done():
                    raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, None,
                                   "the call's message did not come; its slot was given to another call")
                raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "read_timeout",
                               f"the request message did not arrive within {cfg.read_timeout:g} s")
            try:
                raw = message.result()
            except StopAsyncIteration:
                # no message: the client cancelled or reset the stream (or sent one above gRPC's hard cap,
                # which gRPC answers itself; the call's state does not tell the two apart)
                raise _Refused(grpc.StatusCode.CANCELLED, "disconnected", "no request message") from None
            if not self.slots.mark(slot, LIVE):  # taken in the same instant its message came
                raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, None,
                               "the call's message came late; its slot was given to another call")
            if len(raw) > cfg.max_message_bytes:
                raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "too_large",
                               f"message of {len(raw)} bytes exceeds the limit of {cfg.max_message_bytes}")
            if self._pool is None:  # workers: 0 - process on the event loop's thread (no hand-off)
                rejected, why = self._process(raw, peer, signal)
            else:
                rejected, why = await asyncio.get_running_loop().run_in_executor(self._pool, self._process, raw,
                                                                                 peer, signal)
        except _Refused as r:
            if r.reason is not None:
                self._t.inc("receiver_bad_requests", transport="grpc", reason=r.reason)
            await context.abort(r.code, r.message)
        except asyncio.CancelledError:  # the client went away or the connection was closed
            self._t.inc("receiver_bad_requests", transport="grpc", reason="disconnected")
            raise
        finally:
            self._in_flight -= 1
            if message is not None and not message.done():
                message.cancel()
            self.slots.release(slot)
        return messages.response(rejected, why)  # why: the refused items' message (traces or metrics)

    def _process(self, raw: bytes, peer: Peer | None = None, signal: str = "traces") -> tuple[int, str]:
        """On a worker thread: inflate, parse (no lock held), then ingest (which takes the pipeline lock)."""
        try:
            raw = inflate_message(raw, self._cfg.max_message_bytes)
        except InflateError as exc:
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED if exc.reason == "gzip_too_large"
                           else grpc.StatusCode.INVALID_ARGUMENT, exc.reason, exc.message) from None
        try:
            if signal != "traces":
                return self._signals[signal](raw, "grpc", peer)
            request = self._parse(raw)
        except messages.MalformedRequest as exc:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "malformed", str(exc)) from None
        try:
            return self._ingest(request, "grpc", raw, peer), REFUSED_MESSAGE
        except StorageFull:  # the write-ahead log's disk budget is spent: nothing was taken, the client retries
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "storage_full",
                           "the gateway's disk budget is spent; retry later") from None
        except Exception as exc:  # noqa: BLE001 - a processing bug must not take the receiver down
            raise _Refused(grpc.StatusCode.INTERNAL, "internal", f"processing failed: {type(exc).__name__}") from None


def _retrieve(f: asyncio.Future) -> None:
    if not f.cancelled():
        f.exception()


def peer_address(peer: str | None) -> str:
    """gRPC's peer string (``ipv4:127.0.0.2:5123``, ``ipv6:[::1]:5123``, ``unix:...``) -> the address."""
    if not peer:
        return "unknown"
    kind, _, rest = urllib.parse.unquote(peer).partition(":")  # recent gRPC escapes the brackets
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] if rest.startswith("[") else rest
        return host.strip("[]") or rest
    return kind or "unknown"


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str | bytes | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v
    return None


def _credentials(tls: TLSServerConfig) -> grpc.ServerCredentials:
    client_ca = read_pem(tls.client_ca_file)
    return grpc.ssl_server_credentials([(read_pem(tls.key_file), read_pem(tls.cert_file))],
                                       root_certificates=client_ca, require_client_auth=client_ca is not None)
