"""Latencies and sizes behind the gateway-hardening tests (tests/collector/test_slow_clients.py,
test_parsing_and_ids.py, test_label_memory.py), which assert the mechanisms, not the timings.

    .venv/bin/python benchmarks/gateway_hardening.py

Writes benchmarks/results/gateway_hardening.json:
* slow_clients: normal export latency (HTTP and gRPC, p50/p99/max over N exports each) while 100 slow
  HTTP clients (a declared 100 KB body, one byte sent) and 20 slow gRPC calls (message never sent) are attached.
* json_vs_grpc: gRPC export latency while 4 MB OTLP/JSON bodies are parsed (max_json_body_size raised to
  8 MiB for this), against the same exports with nothing else going on.
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
from otel_llm.otlp.json_codec import dumps  # noqa: E402
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
    cfg = loopback_config(processors={"tail_sampling": None})
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
    cfg = loopback_config(processors={"tail_sampling": None}, receivers={"otlp": {"protocols": {
        "grpc": {"endpoint": "127.0.0.1:0"},
        "http": {"endpoint": "127.0.0.1:0", "max_json_body_size": 8 << 20, "max_request_body_size": 8 << 20}}}})
    spans = [span(7, i + 1, attrs=request_attrs(model="m" * 40)) for i in range(4000)]
    body = dumps(export_request(*spans)).encode()
    while len(body) < 4 << 20:
        spans += spans[:1000]
        body = dumps(export_request(*spans)).encode()
    with Gateway(cfg, manual_ticks=True) as g, grpc.insecure_channel(g.grpc_endpoint) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
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
        while len(jsons) < 3:
            t = time.perf_counter()
            call(GOOD, timeout=30)
            during.append(time.perf_counter() - t)
        stop.set()
        for t_ in threads:
            t_.join()
    return {"json_body_bytes": len(body), "json_posts": pct(jsons), "grpc_alone": pct(base),
            "grpc_during_json": pct(during),
            "delay_p99_ms": round(pct(during)["p99_ms"] - pct(base)["p50_ms"], 2)}


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
           "slow_clients": slow_clients(), "json_vs_grpc": json_vs_grpc(), "labels": labels()}
    print(json.dumps(out, indent=2))
    path = ROOT / "benchmarks" / "results" / "gateway_hardening.json"
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
