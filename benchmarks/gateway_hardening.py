"""Latencies and sizes behind the gateway-hardening tests (tests/collector/test_slow_clients.py,
test_parsing_and_ids.py, test_label_memory.py), which assert the mechanisms, not the timings.

    .venv/bin/python benchmarks/gateway_hardening.py

Writes benchmarks/results/gateway_hardening.json:
* slow_clients: normal export latency (HTTP and gRPC, p50/p99/max over N exports each) while 100 slow
  HTTP clients (a declared 100 KB body, one byte sent) and 20 slow gRPC calls (message never sent) are attached.
* json_vs_grpc: gRPC export latency while OTLP/JSON bodies just under the default 1 MiB cap are posted
  back to back, against the same exports with nothing else going on; once with the bodies parsed on the
  handler thread (``json_workers: 0``, as before) and once in the worker process (the default).
* fairness: an honest client's success rate and latency (p50/p99/max) while another source squats 300 idle
  HTTP connections (reopening each one closed; with and without auth, where connections wait in the
  unauthenticated pool), or 300 gRPC calls that never send their message; and whether the victim service
  keeps its series while 2,000 junk models arrive over 10 service names from another source.
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
from peer_clients import ConnectionSquatter, Forwarder  # noqa: E402
from peer_clients import http_export as peer_export  # noqa: E402
from otel_llm.otlp.json_codec import dumps  # noqa: E402
from otel_llm_collector.fairness import Peer  # noqa: E402
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
    # one client (127.0.0.1) plays all the slow ones; no pool fills, so the shares do not bite (``fairness`` does)
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


def _honest_http(port: int, token: str | None = None) -> dict:
    times, ok = [], 0
    for _ in range(N):
        t = time.perf_counter()
        ok += peer_export(port, GOOD, HONEST, token) == 200
        times.append(time.perf_counter() - t)
    return {"success_rate": round(ok / N, 4), **pct(times)}


def _squatted(g: Gateway, token: str | None) -> dict:
    squatter = ConnectionSquatter(g.http.port, SQUATTER, n=300)
    try:
        end = time.monotonic() + 30
        while squatter.opened < 300 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)
        out = _honest_http(g.http.port, token)
        pool = g.http.unauthenticated_slots or g.http.connection_slots  # where the squatter's connections wait
        out["squatter_connections_held"] = pool.held_by(Peer(SQUATTER))
        out["squatter_reopens"] = squatter.reopens
        return out
    finally:
        squatter.close()


def fairness() -> dict:
    out: dict = {}
    cfg = loopback_config(processors={"tail_sampling": None},
                          receivers={"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                                            "http": {"endpoint": "127.0.0.1:0"}}}})
    with Gateway(cfg, manual_ticks=True) as g:
        out["http_alone"] = _honest_http(g.http.port)
        out["http_connection_squat"] = _squatted(g, None)
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
        while (g.grpc.in_flight + bad("receiver_bad_requests", transport="grpc", reason="peer_share")
               + bad("receiver_bad_requests", transport="grpc", reason="busy")) < 300 and time.monotonic() < end:
            time.sleep(0.05)
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
                                  "squatter_calls_held": g.grpc.in_flight}
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


def main() -> None:
    only = sys.argv[1:]
    if only:
        print(json.dumps({name: globals()[name]() for name in only}, indent=2))
        return
    out = {"machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start (shared)",
           "slow_clients": slow_clients(), "json_vs_grpc": json_vs_grpc(), "fairness": fairness(),
           "labels": labels()}
    print(json.dumps(out, indent=2))
    path = ROOT / "benchmarks" / "results" / "gateway_hardening.json"
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
