"""Latencies and sizes behind the gateway-hardening tests (tests/collector/test_slow_clients.py,
test_fairness.py, test_parsing_and_ids.py, test_label_memory.py), which assert the mechanisms, not the timings.

    .venv/bin/python benchmarks/gateway_hardening.py [section ...]

Writes benchmarks/results/gateway_hardening.json (dated, with the commit and the load average):
* slow_clients: normal export latency (HTTP and gRPC, p50/p99/max over N exports each) while 100 slow
  HTTP clients (a declared 100 KB body, one byte sent) and 20 slow gRPC calls (message never sent) are attached;
  the pools have room for them (256 connections, 256 calls), so nothing contends and nothing is taken.
* json_vs_grpc: gRPC export latency while OTLP/JSON bodies just under the default 1 MiB cap are posted
  back to back, against the same exports with nothing else going on; once with the bodies parsed on the
  handler thread (``json_workers: 0``) and once in the worker process (the default).
* fairness: the receivers' slots are shared max-min, and only under contention (``fairness.PeerSlots``): a peer
  may use whatever is free; when a pool is full, a newcomer takes an idle keep-alive connection
  (``evicted_idle``) or a body or gRPC call arriving below ``min_data_rate`` (``evicted_slow``), both older than
  the 1 s grace, from the peer holding the most; with nothing to take it is refused (``peer_share`` when it
  holds its fair share, else ``busy``; a full HTTP connection pool answers ``too_many_connections``).
  Measured on the real clock: an honest client's success rate and latency (p50/p99/max; N exports on fresh
  connections, one every 20 ms) alone, while another source squats 300 idle HTTP connections on the default
  256-connection pool (reopening each one closed; with auth they wait in the 64-connection unauthenticated
  pool), and while another source holds 300 gRPC calls that never send their message (256 in flight), each
  attack in place for longer than the grace before the honest client starts; 100 keep-alive clients on one
  address exporting at once (one peer: nothing contends);
  and whether the victim service keeps its series while 2,000 junk models arrive over 10 service names from
  another source. Each case records the gateway's counters: ``otelcol_llm_receiver_bad_requests_total`` by
  reason (evictions and refusals; the upstream Collector has no name for them) and the upstream
  ``otelcol_receiver_accepted_spans_total`` / ``otelcol_receiver_refused_spans_total``.
* labels: 1,000 services x 100 models: RSS growth, label sets, and one scrape of /metrics over HTTP
  (bytes, seconds).
The machine this runs on is shared and loaded: read the numbers as upper bounds.
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "collector"))
sys.path.insert(0, str(ROOT / "tests" / "collector"))

from collector_testkit import export_request, loopback_config, request_attrs, span  # noqa: E402
from peer_clients import ConnectionSquatter, Forwarder, keep_alive_clients  # noqa: E402
from peer_clients import http_export as peer_export  # noqa: E402
from otel_llm.otlp.json_codec import dumps  # noqa: E402
from otel_llm_collector.fairness import GRACE_S, Peer  # noqa: E402
from otel_llm_collector.gateway import Gateway  # noqa: E402

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
GOOD = export_request(span(1, 1, attrs=request_attrs())).SerializeToString()
N = int(os.environ.get("BENCH_EXPORTS", "200"))


def pct(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "p50_ms": round(1000 * xs[len(xs) // 2], 2),
            "p99_ms": round(1000 * xs[min(len(xs) - 1, int(len(xs) * 0.99))], 2), "max_ms": round(1000 * xs[-1], 2)}


def http_export(port: int, body: bytes = GOOD, ctype: str = "application/x-protobuf") -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/traces", body=body, headers={"Content-Type": ctype})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def slow_clients() -> dict:
    # one client (127.0.0.1) plays all the slow ones; no pool fills, so nothing contends (``fairness`` does)
    cfg = loopback_config(processors={"tail_sampling": None}, receivers={"otlp": {"protocols": {
        "grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}})
    with Gateway(cfg, manual_ticks=True) as g:
        socks = []
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", g.http.port))
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\n"
                      b"Content-Length: 100000\r\n\r\n\x0a")
            socks.append(s)
        release = threading.Event()
        ch = grpc.insecure_channel(g.grpc_endpoint)

        def late():
            release.wait(60)
            yield GOOD

        slow = [ch.stream_unary(METHOD, request_serializer=None, response_deserializer=None).future(late(), timeout=60)
                for _ in range(20)]
        while g.grpc.in_flight < 20 or g.http.connections < 100:
            time.sleep(0.05)
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        h, r = [], []
        for _ in range(N):
            t = time.perf_counter()
            assert http_export(g.http.port) == 200
            h.append(time.perf_counter() - t)
            t = time.perf_counter()
            call(GOOD, timeout=30)
            r.append(time.perf_counter() - t)
        release.set()
        for s in socks:
            s.close()
        for f in slow:
            f.exception()
        ch.close()
    return {"http": pct(h), "grpc": pct(r), "slow_http_clients": 100, "slow_grpc_calls": 20}


def json_vs_grpc() -> dict:
    return {f"json_workers_{w}": _json_vs_grpc(w) for w in (0, 1)}


def _json_vs_grpc(workers: int) -> dict:
    cfg = loopback_config(processors={"tail_sampling": None}, receivers={"otlp": {"protocols": {
        "grpc": {"endpoint": "127.0.0.1:0"},
        # the budget lifted: this measures the parse's effect on others, not the refusals
        "http": {"endpoint": "127.0.0.1:0", "json_workers": workers, "json_bytes_per_peer_per_second": 0}}}})
    spans = [span(7, i + 1, attrs=request_attrs(model="m" * 40)) for i in range(1000)]
    body = dumps(export_request(*spans)).encode()
    while len(body) > 1_000_000:  # just under the default 1 MiB cap
        spans = spans[:int(len(spans) * 0.97)]
        body = dumps(export_request(*spans)).encode()
    with Gateway(cfg, manual_ticks=True) as g, grpc.insecure_channel(g.grpc_endpoint) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        assert http_export(g.http.port, body, "application/json") == 200  # starts the worker process
        base = []
        for _ in range(50):
            t = time.perf_counter()
            call(GOOD, timeout=30)
            base.append(time.perf_counter() - t)
        stop, during = threading.Event(), []
        jsons = []

        def post_json():
            while not stop.is_set():
                t = time.perf_counter()
                http_export(g.http.port, body, "application/json")
                jsons.append(time.perf_counter() - t)

        threads = [threading.Thread(target=post_json) for _ in range(int(os.environ.get("BENCH_JSON_CLIENTS", "1")))]
        for t_ in threads:
            t_.start()
        time.sleep(0.5)
        end = time.monotonic() + 60
        while (len(jsons) < 10 or len(during) < 100) and time.monotonic() < end:
            t = time.perf_counter()
            call(GOOD, timeout=30)
            during.append(time.perf_counter() - t)
        stop.set()
        for t_ in threads:
            t_.join()
    return {"json_body_bytes": len(body), "json_posts": pct(jsons), "grpc_alone": pct(base),
            "grpc_during_json": pct(during),
            "delay_p99_ms": round(pct(during)["p99_ms"] - pct(base)["p50_ms"], 2)}


SQUATTER, HONEST = "127.0.0.2", "127.0.0.3"
PACE_S = 0.02  # between an honest client's exports
# the receivers' bad-request reasons the fairness cases show (otelcol_llm_receiver_bad_requests_total{reason})
FAIRNESS_REASONS = ("evicted_idle", "evicted_slow", "peer_share", "busy", "too_many_connections",
                    "unauthenticated_pool")


def counters(g: Gateway, transport: str) -> dict:
    """The gateway's own counters for one transport: evictions and refusals by reason (ours; zeros left out),
    and the upstream Collector's accepted and refused spans."""
    t = g.telemetry
    out = {"otelcol_llm_receiver_bad_requests_total": {
        r: int(v) for r in FAIRNESS_REASONS if (v := t.value("receiver_bad_requests", transport=transport, reason=r))}}
    for name in ("otelcol_receiver_accepted_spans", "otelcol_receiver_refused_spans"):
        out[name + "_total"] = int(t.value(name, receiver="otlp", transport=transport))
    return out


def _honest_http(port: int, token: str | None = None) -> dict:
    """N exports on fresh connections, one every ``PACE_S`` (spread over seconds, so a squatter's churn of its
    own connections is seen as it settles, not only one instant of it)."""
    times, ok = [], 0
    for _ in range(N):
        t = time.perf_counter()
        ok += peer_export(port, GOOD, HONEST, token) == 200
        times.append(time.perf_counter() - t)
        time.sleep(PACE_S)
    return {"success_rate": round(ok / N, 4), **pct(times), "pace_s": PACE_S}


def _squatted(g: Gateway, token: str | None) -> dict:
    squatter = ConnectionSquatter(g.http.port, SQUATTER, n=300)
    try:
        end = time.monotonic() + 30
        while squatter.opened < 300 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(GRACE_S + 0.5)  # the squat in place for longer than the grace: its idle slots are takeable
        out = _honest_http(g.http.port, token)
        pool = g.http.unauthenticated_slots or g.http.connection_slots  # where the squatter's connections wait
        out["squatter_connections_held"] = pool.held_by(Peer(SQUATTER))
        out["squatter_reopens"] = squatter.reopens
        out["counters"] = counters(g, "http")
        return out
    finally:
        squatter.close()


def _many_clients(port: int, clients: int = 100, rounds: int = 3) -> dict:
    """``clients`` keep-alive connections from one address (a host running many instrumented processes),
    opened together, ``rounds`` exports each: one peer, so it may use the whole receiver."""
    results, times = keep_alive_clients(port, GOOD, HONEST, clients, rounds)
    return {"clients": clients, "exports_each": rounds, "success_rate": round(sum(results) / (clients * rounds), 4),
            **pct(times)}


def fairness() -> dict:
    out: dict = {}
    cfg = loopback_config(processors={"tail_sampling": None},
                          receivers={"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                                            "http": {"endpoint": "127.0.0.1:0"}}}})
    with Gateway(cfg, manual_ticks=True) as g:
        out["http_alone"] = _honest_http(g.http.port)
    with Gateway(cfg, manual_ticks=True) as g:
        out["http_connection_squat"] = _squatted(g, None)
    with Gateway(cfg, manual_ticks=True) as g:
        out["http_100_clients_one_address"] = _many_clients(g.http.port)
        out["http_100_clients_one_address"]["counters"] = counters(g, "http")
    auth = loopback_config(processors={"tail_sampling": None},
                           extensions={"bearertokenauth": {"tokens": ["squatter", "honest"]}},
                           receivers={"otlp": {"protocols": {"grpc": None, "http": {
                               "endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}}}})
    with Gateway(auth, manual_ticks=True) as g:
        out["http_connection_squat_with_auth"] = _squatted(g, "honest")
    with Gateway(cfg, manual_ticks=True) as g:
        forwarder = Forwarder(g.grpc.port, SQUATTER)
        squat = grpc.insecure_channel(forwarder.endpoint)
        release = threading.Event()

        def never():
            release.wait(60)
            yield GOOD

        stream = squat.stream_unary(METHOD, request_serializer=None, response_deserializer=None)
        held = [stream.future(never(), timeout=60) for _ in range(300)]
        end = time.monotonic() + 30
        bad = g.telemetry.value
        while (g.grpc.in_flight + sum(bad("receiver_bad_requests", transport="grpc", reason=r)
                                      for r in ("peer_share", "busy")) < 300 and time.monotonic() < end):
            time.sleep(0.05)
        time.sleep(GRACE_S + 0.5)  # past the grace: the stalled calls are slow (below min_data_rate), so takeable
        with grpc.insecure_channel(g.grpc_endpoint) as ch:
            call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            times, ok = [], 0
            for _ in range(N):
                t = time.perf_counter()
                try:
                    call(GOOD, timeout=10)
                    ok += 1
                except grpc.RpcError:
                    pass
                times.append(time.perf_counter() - t)
        out["grpc_call_squat"] = {"success_rate": round(ok / N, 4), **pct(times), "squatter_calls": 300,
                                  "calls_in_flight_after": g.grpc.in_flight,
                                  "squatter_calls_held": g.grpc.slots.held_by(Peer(SQUATTER)),
                                  "counters": counters(g, "grpc")}
        release.set()
        for f in held:
            f.cancel()
        squat.close()
        forwarder.close()
    with Gateway(cfg, manual_ticks=True) as g:
        for s_ in range(10):
            junk = [span(1000 + s_ * 200 + i, 1, attrs=request_attrs(model=f"junk-{s_}-{i}")) for i in range(200)]
            peer_export(g.http.port, export_request(*junk, service=f"flood-{s_}").SerializeToString(), SQUATTER)
        victim = [span(9000 + i, 1, attrs=request_attrs(model=f"victim-model-{i}")) for i in range(5)]
        peer_export(g.http.port, export_request(*victim, service="victim").SerializeToString(), HONEST)
        text = g.exposition().decode()
        out["series_flood"] = {"junk_models": 2000, "service_names": 10,
                               "victim_models_with_series": sum(f'gen_ai_request_model="victim-model-{i}"' in text
                                                                for i in range(5)), "victim_models": 5}
    return out


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def labels() -> dict:
    from test_label_memory import traffic

    cfg = loopback_config(processors={"tail_sampling": None}, receivers={"otlp": {"protocols": {"grpc": None,
                                                                                               "http": None}}})
    with Gateway(cfg, manual_ticks=True) as g:
        gc.collect()
        before = rss()
        t = time.perf_counter()
        traffic(g, 1000, 100)
        ingest_s = time.perf_counter() - t
        gc.collect()
        grown = rss() - before
        c = http.client.HTTPConnection("127.0.0.1", g.prometheus.port, timeout=60)
        t = time.perf_counter()
        c.request("GET", "/metrics")
        scrape = c.getresponse().read()
        scrape_s = time.perf_counter() - t
        c.close()
    return {"services": 1000, "models": 100, "rss_growth_mib": round(grown / 2**20, 1),
            "ingest_s": round(ingest_s, 2), "scrape_bytes": len(scrape), "scrape_s": round(scrape_s, 3)}


def _commit() -> str:
    """The measured checkout's commit (a machine's path says nothing to a reader of the results)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    only = sys.argv[1:]
    if only:
        print(json.dumps({name: globals()[name]() for name in only}, indent=2))
        return
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "code": _commit(),
           "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start (shared)",
           "slow_clients": slow_clients(), "json_vs_grpc": json_vs_grpc(), "fairness": fairness(),
           "labels": labels()}
    out["load_average_at_end"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out, indent=2))
    path = ROOT / "benchmarks" / "results" / "gateway_hardening.json"
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
