"""One greedy client must not lock the others out: shares of connections and calls that bite only under
contention (max-min: idle, then slow slots yield), series budgets per tenant and source, refusals by their
reason, non-finite latencies refused, OTLP/JSON parsed elsewhere.

Clients bind distinct loopback source addresses (127.0.0.2 squats, 127.0.0.3 or 127.0.0.1 is honest). Each
attack fills its pool before every honest export, the clock the shares read is a fake one the test
advances, and the assertions are about what the gateway decided (how many exports it accepted, which
reason it counted), never how fast.
"""

from __future__ import annotations

import logging
import math
import os
import struct
import threading
import time
import zlib
from typing import Callable

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from collector_testkit import FakeClock, export_request, loopback_config, request_attrs, span, wait_for
from peer_clients import METHOD, ConnectionSquatter, Forwarder, http_export, keep_alive_clients
from otel_llm.otlp.json_codec import dumps
from otel_llm_collector.auth import BearerAuth
from otel_llm_collector.config import CollectorConfig, ConfigError
from otel_llm_collector.fairness import GRACE_S, IDLE, LIVE, RECEIVING, ByteBudgets, Peer, PeerSlots, TrustedPeers
from otel_llm_collector.gateway import Gateway

GOOD = export_request(span(1, 1, attrs=request_attrs())).SerializeToString()
SQUATTER, HONEST = "127.0.0.2", "127.0.0.3"
HONEST_EXPORTS = 100


def bad(g: Gateway, transport: str, reason: str) -> float:
    return g.telemetry.value("receiver_bad_requests", transport=transport, reason=reason)


def gateway(http: dict | None = None, grpc_: dict | None = None, clock: Callable[[], float] = time.monotonic,
            **over) -> Gateway:
    protocols = {"grpc": None if grpc_ is None else {"endpoint": "127.0.0.1:0", **grpc_},
                 "http": None if http is None else {"endpoint": "127.0.0.1:0", **http}}
    cfg = loopback_config(receivers={"otlp": {"protocols": protocols}}, processors={"tail_sampling": None}, **over)
    return Gateway(cfg, clock=clock, manual_ticks=True).start()


TOKENS = {"extensions": {"bearertokenauth": {"tokens": ["squatter-token", "honest-token"]}}}
AUTH = {"auth": {"authenticator": "bearertokenauth"}}


# -- connections --------------------------------------------------------------------------------------
#
# Each attack fills the pool before every honest export (asserted), and the clock the shares read is a
# fake one the test advances past the grace before each export: what is idle or slow is what the test says,
# not what the machine's speed makes it.

SMALL_POOL = 16  # connections (or calls) a receiver holds here: the attacks fill it with tens of sockets
ATTACKERS = 24


def _contended(g: Gateway, clock: FakeClock, pool, honest) -> int:
    """HONEST_EXPORTS calls of ``honest()``, each after the pool was full and the clock passed the grace."""
    ok = 0
    for _ in range(HONEST_EXPORTS):
        assert wait_for(lambda: pool.in_use >= pool.capacity), "the attack did not fill the pool"
        clock.advance(2 * GRACE_S)
        ok += honest()
    return ok


def _squat(body: bytes = b"") -> tuple[dict, Callable[[Gateway], ConnectionSquatter]]:
    http = {"max_connections": SMALL_POOL}
    return http, lambda g: ConnectionSquatter(g.http.port, SQUATTER, n=ATTACKERS, send=body)


SLOW_BODY = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
             b"Content-Length: 100000\r\n\r\n\x0a")  # one byte of a declared 100 KB body; the rest never comes


@pytest.mark.parametrize("honest_source", [HONEST, SQUATTER], ids=["other_address", "same_address"])
@pytest.mark.parametrize("attack", ["idle", "slow_body"])
def test_an_honest_client_gets_its_exports_through_a_full_pool_of_idle_or_slow_connections(
        attack: str, honest_source: str) -> None:
    clock = FakeClock()
    http, squat = _squat(SLOW_BODY if attack == "slow_body" else b"")
    g = gateway(http=http, clock=clock)
    squatter = squat(g)
    try:
        pool = g.http.connection_slots
        ok = _contended(g, clock, pool, lambda: http_export(g.http.port, GOOD, honest_source) == 200)
        assert ok >= 0.99 * HONEST_EXPORTS, f"{ok} of {HONEST_EXPORTS} honest exports succeeded"
        reason = "evicted_idle" if attack == "idle" else "evicted_slow"
        assert bad(g, "http", reason) >= HONEST_EXPORTS  # each honest connection took an attacker's slot
        assert pool.in_use <= pool.capacity and pool.peers <= 2
    finally:
        squatter.close()
        g.shutdown()


CHURN_STEP_S = 0.01  # fake seconds that pass with each reconnect of the churning squatter


def _decisions(g: Gateway) -> float:
    """Connections the HTTP receiver has decided on so far, less those given back: each new one either took a
    free slot (``in_use`` grows), took a held one or was refused (a counter grows)."""
    return g.http.connection_slots.in_use + sum(
        bad(g, "http", r) for r in ("evicted_idle", "evicted_slow", "peer_share", "too_many_connections"))


def _until(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    """``wait_for`` polled finely: the lockstep churn below waits on the gateway a thousand times."""
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.001)
    return cond()


def test_a_squatter_that_reopens_each_cut_connection_cannot_keep_its_slots_young() -> None:
    """The squatter holds more connections than the pool and reopens each one the moment it is cut, while the
    clock advances only with its reconnects (10 ms each): a reconnect that took the squatter's own idle slot used
    to start that slot's idle time again, so its 16 slots cycled every ~160 ms, each younger than the grace, and
    an honest client found nothing it may take. Here the honest exports interleave with the churn; the clock
    never jumps for them. The test thread drives both in lockstep (each reconnect decided by the gateway before
    the next; after each export, one reconnect of every cut connection), so what is old is what the gateway's
    own rule made old, not how the machine scheduled a thread. (From the squatter's own address the two are one
    peer: which of its connections goes first is the unit test's below.)"""
    clock = FakeClock()
    g = gateway(http={"max_connections": SMALL_POOL}, clock=clock)
    squatter = ConnectionSquatter(g.http.port, SQUATTER, n=ATTACKERS, run=False,
                                  before_reopen=lambda: clock.advance(CHURN_STEP_S))
    pool = g.http.connection_slots
    honest = Peer(HONEST)

    def reopen() -> None:
        decided = _decisions(g)
        assert squatter.reopen_one(), "no squatter connection was cut"
        assert _until(lambda: _decisions(g) > decided), "the gateway did not decide on a reconnect"

    try:
        assert wait_for(lambda: _decisions(g) >= ATTACKERS), "the squatter's connections were not decided"
        # churning: its surplus is refused until the first slots pass the grace (100 reconnects), then each
        # reconnect takes one of its own
        while bad(g, "http", "evicted_idle") < 4 * SMALL_POOL:
            assert squatter.reopens < 1000, "the squatter is not churning"
            reopen()
        ok = 0
        for _ in range(HONEST_EXPORTS):
            assert pool.in_use >= pool.capacity, "the squatter did not fill the pool"
            ok += http_export(g.http.port, GOOD, HONEST) == 200
            assert _until(lambda: pool.held_by(honest) == 0), "the honest connection was not given back"
            for _ in range(ATTACKERS - SMALL_POOL + 1):  # every cut connection once: the free slot, the surplus
                reopen()
        refusals = {r: bad(g, "http", r) for r in ("evicted_idle", "peer_share", "too_many_connections")}
        assert ok >= 0.99 * HONEST_EXPORTS, f"{ok} of {HONEST_EXPORTS} honest exports succeeded ({refusals})"
        assert squatter.reopens > HONEST_EXPORTS  # it churned throughout, not only when the honest client came
        assert pool.in_use <= pool.capacity and pool.peers <= 2
    finally:
        squatter.close()
        g.shutdown()


def test_a_slot_a_peer_takes_from_itself_keeps_the_age_of_the_one_it_replaced() -> None:
    """Idle and slow alike: cycling its own slots leaves a peer's slots as old as they were, until one of
    them serves a request; a slot taken from another peer starts fresh."""
    now = [0.0]
    slots = PeerSlots(2, min_rate=100, grace=1.0, clock=lambda: now[0])
    a, b = Peer("10.0.0.1"), Peer("10.0.0.2")
    held = [slots.acquire(a, IDLE).slot for _ in range(2)]
    assert all(held) and slots.mark(held[1], RECEIVING)  # a body that sent nothing yet
    for step in range(1, 400):  # a reconnects every 10 ms, each time taking its own oldest idle or slow slot
        now[0] = step * 0.01
        got = slots.acquire(a, IDLE)
        assert got.slot is not None or now[0] < 1.0, f"refused at {now[0]:.2f} s: its slots were refreshed"
        if got.slot is not None:
            assert slots.mark(got.slot, IDLE if step % 2 else RECEIVING)  # its handler starts; half send a byte
            held = [s for s in held if not s.released] + [got.slot]
    assert slots.held_by(a) == len(held) == 2
    assert all(s.origin is not None and now[0] - s.origin >= 1.0 for s in held)  # as old as those replaced
    other = slots.acquire(b, IDLE)
    assert other.slot is not None and other.evicted in ("evicted_idle", "evicted_slow")
    assert other.slot.origin is None  # taken from another peer: its grace starts now
    mine = next(s for s in held if not s.released)
    for state in (LIVE, RECEIVING, LIVE):  # a request's headers, its body, its processing
        assert slots.mark(mine, state)
        assert mine.origin is not None and now[0] - mine.origin >= 1.0  # not served yet: as old as it was
    now[0] += 0.5
    assert slots.mark(mine, IDLE) and mine.since == now[0] and mine.origin is None  # served: idle from now
    assert slots.acquire(a).refused == "peer_share"  # served: in its grace again
    # within a peer, a slot old on its own time goes before one that is old only by the age it took over (a
    # connection just opened in place of its peer's may be an honest one about to send its request)
    own = PeerSlots(2, min_rate=100, grace=1.0, clock=lambda: now[0])
    slow, idle = own.acquire(a, RECEIVING).slot, own.acquire(a, IDLE).slot
    now[0] += 2.0
    fresh = own.acquire(a, IDLE)  # takes the idle one, inheriting its age
    assert fresh.evicted == "evicted_idle" and idle is not None and idle.released and fresh.slot is not None
    assert own.acquire(a, IDLE).evicted == "evicted_slow" and slow is not None and slow.released
    assert not fresh.slot.released


def test_300_idle_connections_on_the_default_pool_leave_a_client_of_the_same_address_its_exports() -> None:
    """The squat the fixed shares were built for, at the default capacity (256 connections), from the honest
    client's own address: the fixed per-address share gave that client nothing."""
    clock = FakeClock()
    g = gateway(http={}, clock=clock)
    squatter = ConnectionSquatter(g.http.port, SQUATTER, n=300)
    try:
        pool = g.http.connection_slots
        ok = _contended(g, clock, pool, lambda: http_export(g.http.port, GOOD, SQUATTER) == 200)
        assert ok >= 0.99 * HONEST_EXPORTS, f"{ok} of {HONEST_EXPORTS} honest exports succeeded"
        assert pool.capacity == 256 and bad(g, "http", "evicted_idle") >= HONEST_EXPORTS
    finally:
        squatter.close()
        g.shutdown()


def test_100_honest_keep_alive_clients_on_one_address_get_their_exports_through() -> None:
    """A host running many instrumented processes is one peer: with nothing else contending it may use the
    whole receiver (the fixed shares refused a third of these exports)."""
    g = gateway(http={})
    clients, rounds = 100, 3
    try:
        results, _ = keep_alive_clients(g.http.port, GOOD, HONEST, clients, rounds)
        sent = clients * rounds
        assert len(results) == clients and sum(results) >= 0.99 * sent, f"{sum(results)} of {sent} succeeded"
        for reason in ("peer_share", "too_many_connections", "evicted_idle", "evicted_slow", "busy"):
            assert bad(g, "http", reason) == 0, reason
    finally:
        g.shutdown()


def test_with_auth_unauthenticated_connections_wait_in_a_small_pool() -> None:
    clock = FakeClock()
    g = gateway(http={**AUTH, "max_unauthenticated_connections": SMALL_POOL}, extensions=TOKENS["extensions"],
                clock=clock)
    squatter = ConnectionSquatter(g.http.port, SQUATTER, n=ATTACKERS)
    try:
        pool = g.http.unauthenticated_slots
        assert pool is not None
        ok = _contended(g, clock, pool, lambda: http_export(g.http.port, GOOD, HONEST, "honest-token") == 200)
        assert ok >= 0.99 * HONEST_EXPORTS, f"{ok} of {HONEST_EXPORTS} honest exports succeeded"
        assert g.http.connections <= pool.capacity + 1  # the squatter never got past the pool
        assert bad(g, "http", "evicted_idle") >= HONEST_EXPORTS
    finally:
        squatter.close()
        g.shutdown()


def test_a_tenant_uses_free_connections_and_yields_its_idle_ones_under_contention() -> None:
    import http.client

    clock = FakeClock()
    g = gateway(http={"max_connections": 4, **AUTH}, extensions=TOKENS["extensions"], clock=clock)
    held = []

    def post(c: http.client.HTTPConnection, token: str) -> int:
        c.request("POST", "/v1/traces", body=GOOD, headers={"Content-Type": "application/x-protobuf",
                                                              "Authorization": f"Bearer {token}"})
        r = c.getresponse()
        r.read()
        return r.status

    try:
        for _ in range(4):  # keep-alive connections of one tenant, each past its token check: all of them fit
            c = http.client.HTTPConnection("127.0.0.1", g.http.port, timeout=10)
            assert post(c, "squatter-token") == 200
            held.append(c)
        slots = g.http.connection_slots
        assert slots.held_by(Peer("127.0.0.1", "token-1")) == 4 and bad(g, "http", "peer_share") == 0
        clock.advance(2 * GRACE_S)  # now they are idle keep-alives
        assert http_export(g.http.port, GOOD, token="honest-token") == 200  # another tenant, same address
        assert bad(g, "http", "evicted_idle") == 1
        assert wait_for(lambda: slots.held_by(Peer("127.0.0.1", "token-1")) == 3)
    finally:
        for c in held:
            c.close()
        g.shutdown()


def test_trusted_peers_are_held_to_the_cap_only() -> None:
    clock = FakeClock()
    g = gateway(http={"max_connections": 8, "trusted_peers": [SQUATTER, "10.0.0.0/8"]}, clock=clock)
    try:
        squatter = ConnectionSquatter(g.http.port, SQUATTER, n=8, max_reopens=0)
        try:
            assert wait_for(lambda: g.http.connections == 8)
            clock.advance(2 * GRACE_S)
            # the load-balancing tier's idle connections are never taken: the newcomer finds the cap full
            assert http_export(g.http.port, GOOD, HONEST) in (0, 503)
            assert bad(g, "http", "too_many_connections") == 1 and bad(g, "http", "evicted_idle") == 0
        finally:
            squatter.close()
    finally:
        g.shutdown()


# -- gRPC calls --------------------------------------------------------------------------------------

def _hold_calls(channel: grpc.Channel, n: int, metadata=None):
    release = threading.Event()

    def never():
        release.wait(60)
        yield GOOD

    stream = channel.stream_unary(METHOD, request_serializer=None, response_deserializer=None)
    return release, [stream.future(never(), timeout=60, metadata=metadata) for _ in range(n)]


def _honest_call(channel: grpc.Channel, metadata=None) -> int:
    call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    try:
        ExportTraceServiceResponse.FromString(call(GOOD, timeout=10, metadata=metadata))
        return 1
    except grpc.RpcError:
        return 0


@pytest.mark.parametrize("same_address", [False, True], ids=["other_address", "same_address"])
def test_stalled_grpc_calls_yield_their_slots_to_an_honest_call(same_address: bool) -> None:
    clock = FakeClock()
    g = gateway(grpc_={"max_concurrent_requests": SMALL_POOL}, clock=clock)
    forwarder = Forwarder(g.grpc.port, SQUATTER)
    honest = grpc.insecure_channel(g.grpc_endpoint)  # from 127.0.0.1
    squat = honest if same_address else grpc.insecure_channel(forwarder.endpoint)
    releases, futures = [], []
    pool = g.grpc.slots

    def stall(n: int) -> None:  # the squatter keeps the pool full: one more stalled call for each it lost
        release, fs = _hold_calls(squat, n)
        releases.append(release)
        futures.extend(fs)

    try:
        stall(SMALL_POOL + 8)  # the 8 beyond the pool are refused at once (the clock has not moved)
        assert wait_for(lambda: bad(g, "grpc", "peer_share") + bad(g, "grpc", "busy") >= 8)
        ok = 0
        for _ in range(HONEST_EXPORTS):
            assert wait_for(lambda: pool.in_use >= pool.capacity), "the stalled calls did not fill the pool"
            clock.advance(2 * GRACE_S)
            ok += _honest_call(honest)
            stall(1)
        assert ok >= 0.99 * HONEST_EXPORTS, f"{ok} of {HONEST_EXPORTS} honest calls succeeded"
        assert bad(g, "grpc", "evicted_slow") >= HONEST_EXPORTS
    finally:
        for r in releases:
            r.set()
        for f in futures:
            f.cancel()
        squat.close()
        honest.close()
        forwarder.close()
        g.shutdown()


def test_with_auth_a_call_is_charged_to_its_tenant() -> None:
    clock = FakeClock()
    g = gateway(grpc_={"max_concurrent_requests": 8, **AUTH}, extensions=TOKENS["extensions"], clock=clock)
    ch = grpc.insecure_channel(g.grpc_endpoint)  # both tenants from the same address
    release, futures = _hold_calls(ch, 8, metadata=(("authorization", "Bearer squatter-token"),))
    try:
        assert wait_for(lambda: g.grpc.slots.held_by(Peer("127.0.0.1", "token-1")) == 8)  # free: it may take all
        clock.advance(2 * GRACE_S)
        ok = sum(_honest_call(ch, metadata=(("authorization", "Bearer honest-token"),)) for _ in range(4))
        # the first took a stalled call of the other tenant; the rest found the slot it gave back free
        assert ok == 4 and bad(g, "grpc", "evicted_slow") == 1
        assert g.grpc.slots.held_by(Peer("127.0.0.1", "token-1")) == 7
        with pytest.raises(grpc.RpcError) as no_token:  # refused before taking a slot
            ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)(GOOD, timeout=10)
        assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        release.set()
        for f in futures:
            f.cancel()
        ch.close()
        g.shutdown()


# -- series budgets ----------------------------------------------------------------------------------

def _flood(g: Gateway, source: str, token: str | None = None) -> None:
    """2,000 junk models over 10 service names, from ``source``."""
    for s in range(10):
        spans = [span(1000 + s * 200 + i, 1, attrs=request_attrs(model=f"junk-{s}-{i}")) for i in range(200)]
        assert http_export(g.http.port, export_request(*spans, service=f"flood-{s}").SerializeToString(),
                           source, token) == 200


def _victim_series(g: Gateway, token: str | None = None) -> int:
    spans = [span(9000 + i, 1, attrs=request_attrs(model=f"victim-model-{i}")) for i in range(5)]
    assert http_export(g.http.port, export_request(*spans, service="victim").SerializeToString(), HONEST,
                       token) == 200
    text = g.exposition().decode()
    return sum(f'gen_ai_request_model="victim-model-{i}"' in text for i in range(5))


def test_rotating_service_names_leaves_the_victim_service_its_series() -> None:
    g = gateway(http={})
    try:
        _flood(g, SQUATTER)
        assert _victim_series(g) == 5
        assert g.telemetry.value("llm_metrics_overflow_requests", budget="source", tenant="") > 0
    finally:
        g.shutdown()


def test_series_refusals_are_counted_by_tenant() -> None:
    g = gateway(http=AUTH, extensions=TOKENS["extensions"])
    try:
        _flood(g, SQUATTER, "squatter-token")
        assert _victim_series(g, "honest-token") == 5
        refused = {b: g.telemetry.value("llm_metrics_overflow_requests", budget=b, tenant="token-1")
                   for b in ("total", "service", "tenant", "source")}
        # the tenant's budget (200) holds 199 label sets and its first service's overflow label set; that service
        # refused its last 100 itself, the tenant's budget everything after
        assert refused == {"total": 0, "service": 100, "tenant": 1701, "source": 0}
        assert g.telemetry.value("llm_metrics_overflow_requests", budget="tenant", tenant="token-2") == 0
    finally:
        g.shutdown()


def test_a_trusted_peer_is_not_held_to_the_source_budget() -> None:
    g = gateway(http={"trusted_peers": [SQUATTER]})
    try:
        _flood(g, SQUATTER)  # 2,000 label sets from the load-balancing tier: max_series (500) bites, not 200
        assert g.telemetry.value("llm_metrics_overflow_requests", budget="source", tenant="") == 0
        # 496 label sets and the overflow label sets of the first 4 services fill max_series (500)
        assert g.telemetry.total("llm_metrics_overflow_requests") == 2000 - (g.config.labels.max_series - 4)
        assert g.telemetry.value("llm_metrics_overflow_requests", budget="total", tenant="") > 0
    finally:
        g.shutdown()


# -- refusals by reason, no traceback, non-finite latencies ------------------------------------------

def _gzip_bomb(inflated: int) -> bytes:
    """A valid gzip member of ``inflated`` zero bytes (a multiple of 1 MiB) without compressing them all: after
    a full flush the compressor has no history, so each further 1 MiB of zeros compresses to the same bytes."""
    chunk = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    segment = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(inflated >> 20):
        crc = zlib.crc32(chunk, crc)
    final = c.flush()[:-8]  # the last (empty) block; the trailer is rewritten for the whole
    return head + segment * ((inflated >> 20) - 1) + final + struct.pack("<II", crc, inflated & 0xFFFFFFFF)


def test_grpc_refusals_are_counted_by_their_reason_without_a_traceback(caplog, capfd) -> None:
    g = gateway(grpc_={})
    ch = grpc.insecure_channel(g.grpc_endpoint, options=[("grpc.max_send_message_length", -1)])
    call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    caplog.set_level(logging.DEBUG)
    try:
        codes = []
        for body, compression in [(b"\x0a" + bytes(10 << 20), None),  # a 10 MiB message
                                  (bytes(64 << 20), grpc.Compression.Gzip)]:  # gRPC's own gzip of zeros
            with pytest.raises(grpc.RpcError) as err:
                call(body, timeout=30, compression=compression)
            codes.append(err.value.code())
        bomb = _gzip_bomb(1 << 30)  # 1 GiB of zeros as ~1 MB of gzip
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as err:
                call(bomb, timeout=30)
            codes.append(err.value.code())
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5
        release, futures = _hold_calls(ch, 1)
        assert wait_for(lambda: g.grpc.in_flight == 1)
        futures[0].cancel()  # a client that gives up
        assert wait_for(lambda: bad(g, "grpc", "disconnected") == 1)
        release.set()
        assert bad(g, "grpc", "too_large") == 1
        assert bad(g, "grpc", "gzip_too_large") == 4
        assert bad(g, "grpc", "malformed") == 0
        assert ExportTraceServiceResponse.FromString(call(GOOD, timeout=10)) is not None  # and it serves on
    finally:
        ch.close()
        g.shutdown()
    out, err_text = capfd.readouterr()
    logged = caplog.text + out + err_text
    assert "Traceback" not in logged and "ExecuteBatchError" not in logged


def test_a_non_finite_latency_is_refused_and_counted_before_any_policy_sees_it() -> None:
    cfg = loopback_config(receivers={"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": None}}})
    with Gateway(cfg, manual_ticks=True) as g, grpc.insecure_channel(g.grpc_endpoint) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        body = export_request(span(5, 1, attrs=request_attrs(e2e=math.inf)),
                              span(6, 1, attrs=request_attrs(ttft=math.nan)),
                              span(7, 1, attrs=request_attrs())).SerializeToString()
        reply = ExportTraceServiceResponse.FromString(call(body, timeout=10))
        assert reply.partial_success.rejected_spans == 2
        assert g.telemetry.value("receiver_refused_spans", transport="grpc", reason="non_finite_latency") == 2
        g.sampler.decide_all()
        assert g.telemetry.total("sampling_policy_errors") == 0
        assert g.telemetry.total("llm_metrics_requests") == 1


# -- OTLP/JSON ---------------------------------------------------------------------------------------

def test_json_is_parsed_in_a_worker_process_within_a_per_peer_byte_budget() -> None:
    spans = [span(100 + i, 1, attrs=request_attrs(model="m" * 40)) for i in range(100)]
    body = dumps(export_request(*spans)).encode()
    assert 40_000 < len(body) < 100_000
    g = gateway(http={"max_json_body_size": 100_000, "json_bytes_per_peer_per_second": 1000})
    try:
        assert http_export(g.http.port, body, SQUATTER, content_type="application/json") == 200
        assert g.http.json is not None and g.http.json.pids and os.getpid() not in g.http.json.pids
        # the second body at once: past the squatter's budget (a 100 KB burst, 1 KB/s), refused with Retry-After
        assert http_export(g.http.port, body, SQUATTER, content_type="application/json") == 429
        assert bad(g, "http", "json_budget") == 1
        assert http_export(g.http.port, body, HONEST, content_type="application/json") == 200  # its own budget
        assert g.telemetry.value("receiver_accepted_spans", transport="http") == 200
        bad_json = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}'
        assert http_export(g.http.port, bad_json, HONEST, content_type="application/json") == 400
        assert bad(g, "http", "malformed_json") == 1
    finally:
        g.shutdown()


# -- the pieces --------------------------------------------------------------------------------------

def test_peer_slots_bite_only_under_contention_and_take_idle_then_slow_slots() -> None:
    now = [0.0]
    slots = PeerSlots(4, min_rate=100, grace=1.0, clock=lambda: now[0])
    a, b, c = Peer("10.0.0.1"), Peer("10.0.0.2"), Peer("10.0.0.3")
    taken: list[str] = []
    held = [slots.acquire(a, LIVE, taken.append).slot for _ in range(4)]  # free capacity: no share applies
    assert all(held) and slots.in_use == 4 and slots.held_by(a) == 4
    assert slots.acquire(b).refused == "busy"  # full and every slot live: nothing is taken
    assert slots.mark(held[0], IDLE) and slots.mark(held[1], RECEIVING)
    held[1].received = 50  # 50 bytes in 2 s below: 25 B/s, under min_rate
    assert slots.mark(held[2], RECEIVING)
    held[2].received = 10_000  # fast: never taken
    assert slots.acquire(b).refused == "busy"  # idle and receiving for less than the grace: not yet
    now[0] = 2.0
    first = slots.acquire(b)
    assert first.slot is not None and first.evicted == "evicted_idle" and taken == ["evicted_idle"]
    second = slots.acquire(c)  # the idle one is gone: the slowest body next
    assert second.evicted == "evicted_slow" and held[1].evicted == "evicted_slow"
    assert slots.held_by(a) == 2 and slots.held_by(b) == slots.held_by(c) == 1
    # a (2) is not more than one above b or c (1): max-min reached, a newcomer of c finds nothing to take
    assert slots.acquire(c).refused == "peer_share"
    slots.release(held[0])  # released after it was taken: a no-op
    assert slots.in_use == 4
    # within one peer: a newcomer of b takes b's own idle slot, never a's live one
    assert first.slot is not None and slots.mark(first.slot, IDLE)
    now[0] = 4.0
    own = slots.acquire(b)
    assert own.evicted == "evicted_idle" and first.slot.evicted and slots.held_by(b) == 1
    # bounded: an entry per peer holding slots, gone with its last slot
    for s in (own.slot, second.slot, held[2], held[3]):
        slots.release(s)
    assert slots.in_use == 0 and slots.peers == 0
    lb = TrustedPeers(["10.1.0.0/16"]).peer("10.1.2.3")
    got = [slots.acquire(lb, IDLE) for _ in range(5)]
    assert got[-1].refused == "busy" and slots.peers == 0  # the cap still holds; never charged to a share
    now[0] = 10.0
    assert slots.acquire(a).refused == "busy"  # the trusted tier's idle slots are never taken


def test_byte_budgets_refill_and_stay_bounded() -> None:
    now = [0.0]
    budgets = ByteBudgets(rate=100, burst=1000, max_peers=2, clock=lambda: now[0])
    a = Peer("10.0.0.1")
    assert budgets.take(a, 1000) == 0
    assert budgets.take(a, 500) == pytest.approx(5.0)
    now[0] += 5
    assert budgets.take(a, 500) == 0
    for i in range(5):
        budgets.take(Peer(f"10.0.1.{i}"), 1)
    assert len(budgets) == 2 and budgets.evictions == 4


def test_fairness_keys_are_checked_at_load() -> None:
    with pytest.raises(ConfigError, match="trusted_peers\\[0\\]"):
        loopback_config(receivers={"otlp": {"protocols": {"http": {"endpoint": "127.0.0.1:0",
                                                                     "trusted_peers": ["not-an-address"]}}}})
    with pytest.raises(ConfigError, match="peer_share"):
        loopback_config(receivers={"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "peer_share": 0}}}})
    cfg = CollectorConfig.from_mapping({
        "extensions": {"bearertokenauth": {"tenants": {"team-a": "ta", "team-b": "tb"}}},
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": "127.0.0.1:0", **AUTH}}}}})
    assert cfg.http is not None and cfg.http.auth is not None
    auth = BearerAuth(cfg.http.auth)
    assert [auth.tenant("Bearer tb"), auth.tenant("Bearer ta"), auth.tenant("Bearer tc")] == ["team-b", "team-a", None]


def test_the_scale_out_layout_trusts_its_load_balancing_tier() -> None:
    from otel_llm_collector.scale_config import ScaleOptions, gateway_tier

    cfg = CollectorConfig.from_mapping(gateway_tier(ScaleOptions(trusted_peers=("10.8.0.0/16",))))
    assert cfg.grpc is not None and cfg.http is not None
    assert cfg.grpc.trusted_peers == cfg.http.trusted_peers == ("10.8.0.0/16",)
    assert TrustedPeers(cfg.grpc.trusted_peers).peer("10.8.3.4").trusted
    default = CollectorConfig.from_mapping(gateway_tier(ScaleOptions()))
    assert default.http is not None and "10.0.0.0/8" in default.http.trusted_peers
    with pytest.raises(ValueError, match="not-a-network"):
        ScaleOptions(trusted_peers=("not-a-network",))


def test_a_json_worker_that_dies_is_replaced_and_its_body_refused() -> None:
    import signal

    from otel_llm_collector.receivers.json_workers import JsonParser

    parser = JsonParser(1)
    body = dumps(export_request(span(1, 1, attrs=request_attrs()))).encode()
    try:
        first = parser.parse(body)
        assert first.error is None and first.protobuf
        os.kill(first.pid, signal.SIGKILL)
        lost = parser.parse(body)  # the pool notices the death: this body is refused, the pool replaced
        assert lost.protobuf is None and "died" in (lost.error or "")
        assert parser.restarts == 1
        again = parser.parse(body)
        assert again.error is None and again.pid != first.pid
    finally:
        parser.close()
