"""Collector throughput, memory per buffered span, 10x overload behaviour, and the inter-token derivation.

    .venv/bin/python benchmarks/collector_throughput.py [--seconds 6]
        [--only ingest,loopback,memory,overload,inter_token,persistence,trace_join] [--root OTHER_CHECKOUT]

Prints a table and writes benchmarks/results/collector_throughput.json (full runs of this checkout only),
and benchmarks/results/collector_inter_token.json (the inter_token section, when it runs), and
benchmarks/results/collector_persistence.json (the persistence section, when it runs).
* ingest: receive-path work without sockets (protobuf parse, which validates, handed to the gateway with
  the bytes as the receivers do; extract + llm_metrics + tail_sampling add + decisions + export encoding
  of the kept spans), per CPU-second of this process = spans/s per core.
  Measured in rounds of 20 requests (~20k spans), each on a fresh gateway, so every trace id is new to
  the sampler (repeating payloads on one gateway would turn them into cheap "late" spans of decided
  traces); the median round is reported with the spread.
* loopback: the same through the OTLP/gRPC receiver, with a load client and an export sink in child
  processes; gateway CPU time only; ``--runs`` runs per shape (default 3), each on a fresh gateway, median reported. The client sends unique trace ids (copies with fresh ids). The
  gateway process is tuned as the CLI tunes it after start-up (``cli.tune_process``: ``gc.freeze()``).
* ceiling: a plain protobuf parse-and-touch loop over the same requests, in the same process and run: the
  full OTLP classes parse each request, then every field of every span (ids, name, kind, flags, state,
  times, each attribute's key and value, events, links, status) and of its resource and scope is read.
  Measured in rounds interleaved with the gateway's, so the gateway's CPU per span is reported as a
  multiple of it (``x_ceiling``): absolute rates do not carry between machines, this ratio does
  (target: <= 3x at shape 1 over loopback). ``parse_only`` is the parse without touching.
* memory: RSS growth per buffered span (nothing decided).
* overload: offered 10x the measured loopback capacity; what is shed and counted, and RSS over time.
* inter_token: what deriving the per-token histogram costs the gateway: shape-1 request spans with and
  without the compact inter-token summary (``llm.latency.inter_token.bucket_counts``). The same ~1000-span
  requests as shape 1 ("base", 8 attributes), then with the decode time a real request span carries and one
  more attribute ("with_decode": what the counts are compared against), then with the counts as that
  attribute ("with_counts": 14 counts; every other span has some above 127, two-byte varints, the slower
  path). Each of ``--itl-rounds`` rounds ingests 20 requests (fresh trace ids) on a fresh gateway (no tail
  sampling: the derivation is what is measured) for each variant in turn; process CPU per span, medians.
* persistence: what durability costs the receive path: the ingest phase's work (shape 10) with an exporter's
  queue behind it (a sender that drops what it is given, so the queue's own work is measured), memory only
  vs ``file_storage`` (the tail sampler's write-ahead log + the exporter's durable queue) with ``fsync: false``
  and with ``fsync: true``. Each round runs the three in turn (rotated order) on fresh gateways and fresh
  directories; the ratios to memory-only are per round (CPU per span of this process, and wall time, which
  is where fsync's waiting shows), medians with their spread. ``--persistence-rounds`` (default 15).
* trace_join: what joining server request traces without a caller to their client calls costs the receive
  path (``trace_join``, on whenever tail sampling is). A mix as a gateway behind the Rust frontend sees it:
  per pair of export requests, one from the serving side (50 server request traces without a parent, each a
  request span with the response id, 4 phase/step children and an engine-step span linking to it in its own
  trace; 60 ordinary shape-10 request traces) and one from the callers (50 openai CLIENT spans with the
  matching response id under their caller's root span): 1000 spans, 40 % of them in joined traces. Each of
  ``--join-rounds`` rounds ingests 20 pairs (the client request after its server request, a tick after each)
  on fresh gateways with the join and without it (``gateway.trace_join = None``; everything else the
  same), in rotated order; CPU per span of this process, medians with p25-p75 and the per-round ratio.
* --paths one_pass,two_pass: measure the receive path both ways in one run (ingest: each round runs every
  path after one ceiling round; loopback: runs alternating between the paths; always on fresh gateways), by
  switching ``spans.ONE_PASS``: the C extension's one validating pass, or the full parse then
  the view (the fallback). Without it: whatever the checkout uses.
* --root: import the collector and the core from another checkout (e.g. a `git worktree` of an older
  commit), to compare before/after in one session on this noisy shared machine.
"""

from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
if "--root" in sys.argv:  # before the imports below: which checkout's collector and core to measure
    ROOT = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "collector"))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402

from otel_llm import semconv as sc  # noqa: E402
from otel_llm_collector.config import CollectorConfig  # noqa: E402
from otel_llm_collector.gateway import Gateway  # noqa: E402

try:
    from otel_llm_collector.cli import tune_process  # noqa: E402
except ImportError:  # an older checkout (--root)
    tune_process = None

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SPANS_PER_REQUEST = 1000


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def kv(k: str, v) -> KeyValue:
    if isinstance(v, float):
        return KeyValue(key=k, value=AnyValue(double_value=v))
    if isinstance(v, int):
        return KeyValue(key=k, value=AnyValue(int_value=v))
    return KeyValue(key=k, value=AnyValue(string_value=v))


def build_requests(shape: int, n_requests: int, seed: int = 1) -> list[bytes]:
    """Encoded export requests of ~1000 spans: traces of `shape` spans (request span + decode steps)."""
    rng = random.Random(seed)
    out = []
    t0 = time.time_ns()
    for _ in range(n_requests):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.append(kv("service.name", "bench"))
        ss = rs.scope_spans.add()
        ss.scope.name = "otel_llm"
        for _ in range(max(1, SPANS_PER_REQUEST // shape)):
            tid = rng.getrandbits(128).to_bytes(16, "big")
            root = rng.getrandbits(64).to_bytes(8, "big")
            ttft, e2e = rng.lognormvariate(-2.5, 0.8), rng.lognormvariate(0, 0.5)
            s = ss.spans.add(trace_id=tid, span_id=root, name="text_completion llama",
                             start_time_unix_nano=t0, end_time_unix_nano=t0 + int(e2e * 1e9))
            s.attributes.extend([kv(sc.OPERATION_NAME, "text_completion"), kv(sc.PROVIDER_NAME, "vllm"),
                                 kv(sc.REQUEST_MODEL, "llama"), kv(sc.LATENCY_TTFT, ttft),
                                 kv(sc.LATENCY_TPOT, 0.02), kv(sc.LATENCY_E2E, e2e),
                                 kv(sc.USAGE_INPUT_TOKENS, 100), kv(sc.USAGE_OUTPUT_TOKENS, 200)])
            for j in range(shape - 1):
                c = ss.spans.add(trace_id=tid, span_id=rng.getrandbits(64).to_bytes(8, "big"), parent_span_id=root,
                                 name="llm.decode.step", start_time_unix_nano=t0 + j, end_time_unix_nano=t0 + j + 1)
                c.attributes.extend([kv(sc.STEP_INDEX, j), kv(sc.STEP_TOKENS, 1)])
        out.append(req.SerializeToString())
    return out


def unique_copies(payloads: list[bytes], n: int, seed: int) -> list[bytes]:
    """``n`` requests cycling through ``payloads``, each trace given a fresh random trace id."""
    rng = random.Random(seed)
    templates = [ExportTraceServiceRequest.FromString(p) for p in payloads]
    out = []
    for i in range(n):
        req = templates[i % len(templates)]
        fresh: dict[bytes, bytes] = {}
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    tid = fresh.get(span.trace_id)
                    if tid is None:
                        tid = fresh[span.trace_id] = rng.getrandbits(128).to_bytes(16, "big")
                    span.trace_id = tid
        out.append(req.SerializeToString())
    return out


def parse_and_touch(payloads: list[bytes]) -> int:
    """The ceiling: parse each request with the full OTLP classes and read every field of every span."""
    n = 0
    for p in payloads:
        req = ExportTraceServiceRequest.FromString(p)
        for rs in req.resource_spans:
            for kv in rs.resource.attributes:
                _touch_value(kv.key, kv.value)
            for ss in rs.scope_spans:
                ss.scope.name, ss.scope.version, ss.schema_url
                for s in ss.spans:
                    s.trace_id, s.span_id, s.parent_span_id, s.trace_state, s.flags, s.name, s.kind
                    s.start_time_unix_nano, s.end_time_unix_nano
                    for kv in s.attributes:
                        _touch_value(kv.key, kv.value)
                    for e in s.events:
                        e.time_unix_nano, e.name
                        for kv in e.attributes:
                            _touch_value(kv.key, kv.value)
                    for link in s.links:
                        link.trace_id, link.span_id
                    s.status.code, s.status.message
                    n += 1
    return n


def _touch_value(key: str, value: AnyValue) -> None:
    kind = value.WhichOneof("value")
    if kind is not None:
        getattr(value, kind)


def parse_only(payloads: list[bytes]) -> None:
    for p in payloads:
        ExportTraceServiceRequest.FromString(p)


class Ceiling:
    """The parse-and-touch loop's CPU per span over one shape's requests, in rounds (call ``round`` between
    the gateway's rounds, so both see the same machine); the median round is reported."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.spans = sum(span_count(p) for p in payloads)
        self.touch_us: list[float] = []
        self.parse_us: list[float] = []

    def round(self) -> None:
        c0 = time.process_time()
        parse_only(self.payloads)
        c1 = time.process_time()
        parse_and_touch(self.payloads)
        c2 = time.process_time()
        self.parse_us.append((c1 - c0) / self.spans * 1e6)
        self.touch_us.append((c2 - c1) / self.spans * 1e6)

    @property
    def us_per_span(self) -> float:
        return statistics.median(self.touch_us)

    def report(self, gateway_us_per_span: float) -> dict:
        return {"parse_touch_us_per_span": round(self.us_per_span, 3),
                "parse_only_us_per_span": round(statistics.median(self.parse_us), 3),
                "ceiling_rounds": len(self.touch_us),
                "gateway_us_per_span": round(gateway_us_per_span, 3),
                "x_ceiling": round(gateway_us_per_span / self.us_per_span, 2)}


def span_count(payload: bytes) -> int:
    req = ExportTraceServiceRequest.FromString(payload)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


class NullExporter:
    """Takes the encoded export payload and drops it: the encoding is measured, no socket."""

    def __init__(self) -> None:
        self.spans = 0

    def submit(self, payload: bytes, spans: int) -> bool:
        self.spans += spans
        return True

    def close(self, timeout: float = 0) -> None:
        pass


# BENCH_GRPC_WORKERS: the gRPC receiver's processing threads (a checkout with the option; default its default)
GRPC_WORKERS = {"workers": int(os.environ["BENCH_GRPC_WORKERS"])} if os.environ.get("BENCH_GRPC_WORKERS") else {}


def config(sink: str | None, grpc_on: bool = False, **tail) -> CollectorConfig:
    ts = {"decision_wait_after_root_received": 0, "tick_interval": "50ms"}
    ts.update(tail)
    return CollectorConfig.from_mapping({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 16,
                                                      **GRPC_WORKERS}
                                             if grpc_on else None, "http": None}}},
        "processors": {"llm_metrics": {"slo": "ttft=0.5"}, "tail_sampling": ts},
        "exporters": {"prometheus": None, **({"otlp": {"endpoint": sink}} if sink else {})},
    })


# -- child process: an export sink and a load client ------------------------------------------------

def _sink_server(port_q) -> None:
    count = [0]

    def export(raw, ctx):
        count[0] += 1
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 64 << 20)])
    h = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": h}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_q.put(port)
    threading.Event().wait()


def _load(target: str, payloads: list[bytes], seconds: float, rate: float, result_q, unique: int = 0,
          ready=None) -> None:
    """Send payloads round-robin for `seconds`; `rate` requests/s (0 = as fast as 4 in-flight allow).

    ``unique``: first make that many copies with fresh trace ids (sent in turn; after them, repeats)."""
    if unique:
        payloads = unique_copies(payloads, unique, seed=len(payloads) + unique)
    if ready is not None:
        ready.set()
    ch = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)])
    call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    ok = refused = other = 0
    lock = threading.Lock()
    sem = threading.Semaphore(64 if rate else 4)

    def done(f):
        nonlocal ok, refused, other
        with lock:
            try:
                f.result()
                ok += 1
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    refused += 1
                else:
                    other += 1
        sem.release()

    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        if rate:
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        if not sem.acquire(timeout=0 if rate else 5):
            with lock:
                other += 1  # client-side shedding: too many in flight
            i += 1
            continue
        call.future(payloads[i % len(payloads)], timeout=30).add_done_callback(done)
        i += 1
    for _ in range(64 if rate else 4):
        sem.acquire(timeout=30)
    result_q.put({"ok": ok, "refused": refused, "client_shed_or_error": other, "sent": i,
                  "repeated_payloads": max(0, i - len(payloads)) if unique else i})


# -- measurements ---------------------------------------------------------------------------------------

def bench_ingest(shape: int, seconds: float, paths: list | None = None) -> dict:
    """Rounds on fresh gateways until ``seconds`` (at least 5 per path); with ``paths`` (``--paths``) each round
    runs every path in turn (rotated order) after one ceiling round: {path: result}; else the one result."""
    payloads = build_requests(shape, 20, seed=shape)
    n_spans = sum(span_count(p) for p in payloads)
    names = paths or [None]
    stats = {path: {"rates": [], "spans": 0, "cpu": 0.0, "kept": 0} for path in names}
    takes_raw = "raw" in inspect.signature(Gateway.ingest).parameters
    reads = hasattr(Gateway, "read_request")  # a checkout whose receivers validate through the gateway
    ceiling = Ceiling(payloads)
    start, i = time.monotonic(), 0
    while time.monotonic() - start < seconds * len(names) or i < 5:
        ceiling.round()  # interleaved: the same machine state as the gateway's rounds after it
        for path in names[i % len(names):] + names[:i % len(names)]:
            use_path(path)
            g = Gateway(config(None), manual_ticks=True)
            sink = NullExporter()
            g.exporters = [sink]
            c0 = time.process_time()
            for p in payloads:
                if reads:  # as the receivers do: validated (and read, on the one-pass path), with its bytes
                    g.ingest(g.read_request(p), raw=p)
                elif takes_raw:  # as the receivers did: the validated request and its bytes
                    g.ingest(ExportTraceServiceRequest.FromString(p), raw=p)
                else:  # an older checkout (--root)
                    g.ingest(ExportTraceServiceRequest.FromString(p))
                g.tick()
            cpu = time.process_time() - c0
            g.exporters = []
            g.shutdown()
            st = stats[path]
            st["rates"].append(n_spans / cpu)
            st["spans"] += n_spans
            st["cpu"] += cpu
            st["kept"] += sink.spans
        i += 1
    out = {}
    for path, st in stats.items():
        rates = st["rates"]
        q = statistics.quantiles(rates, n=4) if len(rates) > 1 else rates * 3
        median = statistics.median(rates)
        out[path] = {"shape": shape, "spans": st["spans"], "rounds": len(rates), "cpu_s": round(st["cpu"], 2),
                     "kept_share": round(st["kept"] / st["spans"], 3), "spans_per_cpu_s": round(median),
                     "p25": round(q[0]), "p75": round(q[2]), "min": round(min(rates)), "max": round(max(rates)),
                     **ceiling.report(1e6 / median), **({"path": path} if path else {})}
    return out if paths else out[None]


class _DropSender:
    """A sender that takes each payload and drops it: the queue's own work (and its log's) is what is measured."""

    def send(self, payload: bytes):
        return None

    def close(self) -> None:
        pass


PERSISTENCE_VARIANTS = ("memory", "file", "file_fsync")


def _persistence_round(variant: str, payloads: list[bytes], directory: str) -> tuple[float, float, int]:
    """(CPU s, wall s, spans) for ingesting ``payloads`` on a fresh gateway, queue drained included."""
    import tempfile

    raw: dict = {"receivers": {"otlp": {"protocols": {"grpc": None, "http": None}}},
                 "processors": {"llm_metrics": {"slo": "ttft=0.5"},
                                "tail_sampling": {"decision_wait_after_root_received": 0, "tick_interval": "50ms"}},
                 "exporters": {"prometheus": None, "otlp": {"endpoint": "127.0.0.1:1"}}}
    with tempfile.TemporaryDirectory(dir=directory) as state:
        if variant != "memory":
            raw["extensions"] = {"file_storage": {"directory": state, "fsync": variant == "file_fsync"}}
            raw["exporters"]["otlp"]["sending_queue"] = {"storage": "file_storage"}
            raw["processors"]["tail_sampling"]["storage"] = "file_storage"
        g = Gateway(CollectorConfig.from_mapping(raw), manual_ticks=True)
        for e in g.exporters:
            e._sender.close()
            e._sender = _DropSender()  # no socket: the queue (and its log) is what is measured
        spans = sum(span_count(p) for p in payloads)
        c0, w0 = time.process_time(), time.perf_counter()
        for p in payloads:
            g.ingest(g.read_request(p), raw=p)
            g.tick()
        g.flush(60)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        g.shutdown(5)
    return cpu, wall, spans


def bench_persistence(rounds: int, directory: str | None = None) -> dict:
    """Memory-only vs durable (fsync off, on), interleaved per round on fresh gateways: ratios per round."""
    payloads = unique_copies(build_requests(10, 20, seed=10), 40, seed=7)
    directory = directory or str(Path(__file__).resolve().parent / "results")
    load_before = [round(x, 2) for x in os.getloadavg()]
    each: dict[str, dict[str, list[float]]] = {v: {"cpu_us_per_span": [], "wall_us_per_span": []}
                                               for v in PERSISTENCE_VARIANTS}
    spans = 0
    for r in range(rounds):
        order = PERSISTENCE_VARIANTS[r % 3:] + PERSISTENCE_VARIANTS[:r % 3]
        for v in order:
            cpu, wall, spans = _persistence_round(v, payloads, directory)
            each[v]["cpu_us_per_span"].append(cpu / spans * 1e6)
            each[v]["wall_us_per_span"].append(wall / spans * 1e6)

    def summary(xs: list[float]) -> dict:
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else xs * 3
        return {"median": round(statistics.median(xs), 3), "p25": round(q[0], 3), "p75": round(q[2], 3),
                "min": round(min(xs), 3), "max": round(max(xs), 3)}

    out: dict = {"unit": "us per shape-10 span (ingest + decisions + export queue drained), medians of rounds",
                 "rounds": rounds, "spans_per_round": spans,
                 "note": "a shared 2-core machine with other work running: read the ratios (same round), "
                         "not the absolute times",
                 "load_avg_before": load_before}
    for v in PERSISTENCE_VARIANTS:
        out[v] = {k: summary(xs) for k, xs in each[v].items()}
    for v in PERSISTENCE_VARIANTS[1:]:
        for k in ("cpu_us_per_span", "wall_us_per_span"):
            ratios = [a / b for a, b in zip(each[v][k], each["memory"][k])]
            out[f"{v}_vs_memory_{k.split('_')[0]}"] = summary(ratios)
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def as_deployed(g: Gateway) -> Gateway:
    """The process tuning the CLI applies after start-up (if the measured checkout's CLI has it)."""
    if tune_process is not None:
        tune_process()
    return g


def bench_loopback(shape: int, seconds: float, ctx, sink: str, expected_spans_s: float,
                   ceiling: Ceiling | None = None) -> dict:
    payloads = build_requests(shape, 20, seed=shape)
    if ceiling is not None:
        ceiling.round()  # before and after the run: the same machine state as the gateway's
    g = as_deployed(Gateway(config(sink, grpc_on=True)).start())
    q, ready = ctx.Queue(), ctx.Event()
    unique = int(expected_spans_s * seconds * 1.5 / SPANS_PER_REQUEST) + 20
    p = ctx.Process(target=_load, args=(g.grpc_endpoint, payloads, seconds, 0, q, unique, ready))
    p.start()
    ready.wait()
    c0 = time.process_time()
    res = q.get()
    p.join()
    g.flush(30)
    cpu = time.process_time() - c0
    spans = g.telemetry.total("receiver_accepted_spans")
    sent = g.telemetry.total("exporter_sent_spans")
    g.shutdown()
    if ceiling is not None:
        ceiling.round()
    return {"shape": shape, "spans": int(spans), "exported_spans": int(sent), "gateway_cpu_s": round(cpu, 2),
            "spans_per_cpu_s": round(spans / cpu), "wall_spans_per_s": round(spans / seconds), **res}


def use_path(path: str | None) -> None:
    """Switch the receive path (``--paths``): ``one_pass`` or ``two_pass``; None leaves the checkout's default."""
    if path is not None:
        from otel_llm_collector import spans
        if path == "one_pass" and not spans.wire.AVAILABLE:
            raise SystemExit(f"one_pass: {spans.wire.REASON}")
        spans.ONE_PASS = path == "one_pass"


def loopback_paths(shape: int, seconds: float, ctx, sink: str, expected_spans_s: float, runs: int,
                   paths: list) -> dict:
    """``loopback_runs`` for each receive path, the runs alternating between the paths (same machine state);
    one ceiling for all (its rounds interleaved with every run)."""
    ceiling = Ceiling(build_requests(shape, 20, seed=shape))
    all_runs: dict = {path: [] for path in paths}
    for i in range(runs):
        for path in paths[i % len(paths):] + paths[:i % len(paths)]:  # rotated order
            use_path(path)
            all_runs[path].append(bench_loopback(shape, seconds, ctx, sink, expected_spans_s, ceiling))
    out = {}
    for path, done in all_runs.items():
        rates = [r["spans_per_cpu_s"] for r in done]
        median = sorted(done, key=lambda r: r["spans_per_cpu_s"])[len(done) // 2]
        out[path] = {**median, "runs": runs, "spans_per_cpu_s_each": rates,
                     **ceiling.report(1e6 / median["spans_per_cpu_s"])}
    return out


def bench_memory(n_spans: int = 200_000) -> dict:
    payloads = build_requests(10, n_spans // SPANS_PER_REQUEST, seed=99)
    g = Gateway(config(None, decision_wait="1h", decision_wait_after_root_received="1h", num_traces=10**7,
                       max_buffer_bytes="4GiB"), manual_ticks=True)
    import gc
    gc.collect()
    before = rss_mb()
    for p in payloads:
        g.ingest(ExportTraceServiceRequest.FromString(p))
    gc.collect()
    after = rss_mb()
    spans = int(g.telemetry.total("receiver_accepted_spans"))
    out = {"buffered_spans": spans, "encoded_bytes_per_span": round(g.sampler.bytes_on_memory / spans, 1),
           "rss_growth_mb": round(after - before, 1), "rss_bytes_per_span": round((after - before) * 2**20 / spans)}
    g.shutdown()
    return out


def bench_overload(capacity_spans_s: float, seconds: float, ctx, sink: str) -> dict:
    shape = 10
    payloads = build_requests(shape, 20, seed=7)
    rate = 10 * capacity_spans_s / SPANS_PER_REQUEST  # requests/s
    g = as_deployed(Gateway(config(sink, grpc_on=True, decision_wait="5s", decision_wait_after_root_received="1s",
                                   num_traces=5000, max_buffer_bytes="8MiB")).start())
    q, ready = ctx.Queue(), ctx.Event()
    # about what can be accepted (bounded: the copies live in the client's memory); then repeats
    unique = min(int(1.2 * capacity_spans_s * seconds / SPANS_PER_REQUEST) + 20, 2000)
    p = ctx.Process(target=_load, args=(g.grpc_endpoint, payloads, seconds, rate, q, unique, ready))
    samples = []
    p.start()
    ready.wait()
    start = time.monotonic()
    while p.is_alive() and time.monotonic() - start < seconds + 30:
        samples.append(round(rss_mb(), 1))
        time.sleep(0.5)
    res = q.get()
    p.join()
    g.flush(30)
    t = g.telemetry
    half = samples[len(samples) // 2:] or samples
    out = {"offered_spans_per_s": round(rate * SPANS_PER_REQUEST), "accepted_spans": int(t.total("receiver_accepted_spans")),
           "evictions": int(t.total("sampling_evictions")),
           "export_dropped_spans": int(t.total("exporter_dropped_spans")),
           "exported_spans": int(t.total("exporter_sent_spans")),
           "rss_mb_first_half_max": max(samples[:len(samples) // 2] or samples),
           "rss_mb_second_half_min": min(half), "rss_mb_second_half_max": max(half),
           "peak_rss_mb": max(samples),  # sampled during this phase (ru_maxrss would include the memory phase)
           "client": res}
    g.shutdown()
    return out


ITL_COUNTS = ((0, 3, 40, 100, 50, 5, 1, 0, 0, 0, 0, 0, 0, 0), (0, 0, 180, 900, 12, 0, 0, 0, 0, 0, 0, 0, 1, 0))


def with_decode(payload: bytes, counts: bool = False) -> bytes:
    """Each span given ``llm.latency.decode`` (real request spans carry it) and the counts, or (``counts``
    False) an unrelated integer attribute in their place, so both variants have the same attribute count."""
    req = ExportTraceServiceRequest.FromString(payload)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for i, s in enumerate(ss.spans):
                s.attributes.extend([kv(sc.LATENCY_DECODE, 4.0 + i / 1000),
                                     kv(sc.LATENCY_ITL_COUNTS if counts else "x.other", 0)])
                if not counts:
                    continue
                arr = s.attributes[-1].value
                arr.ClearField("int_value")
                for c in ITL_COUNTS[i % 2]:
                    arr.array_value.values.add(int_value=c)
    return req.SerializeToString()


def derivation_us_per_span(payloads: list[bytes], seed: int) -> float:
    raw = {"receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": None}}},
           "exporters": {"prometheus": None}, "processors": {"tail_sampling": None}}
    g = Gateway(CollectorConfig.from_mapping(raw), manual_ticks=True)
    try:
        encoded = unique_copies(payloads, 20, seed)
        parsed = [ExportTraceServiceRequest.FromString(p) for p in encoded]
        spans = sum(len(ss.spans) for r in parsed for rs in r.resource_spans for ss in rs.scope_spans)
        t = time.process_time()
        for req, raw_bytes in zip(parsed, encoded):
            g.ingest(req, raw=raw_bytes)
        return (time.process_time() - t) / spans * 1e6
    finally:
        g.shutdown(0)


def bench_inter_token(rounds: int) -> dict:
    base = build_requests(1, 4)
    variants = {"base": base, "with_decode": [with_decode(x) for x in base],
                "with_counts": [with_decode(x, counts=True) for x in base]}
    load_before = os.getloadavg()
    each: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        for name, payloads in variants.items():
            each[name].append(derivation_us_per_span(payloads, r))
    med = {k: statistics.median(v) for k, v in each.items()}
    return {"unit": "us CPU per shape-1 span (median of rounds)", "rounds": rounds,
            "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
            "median": med, "added_us_per_span": med["with_counts"] - med["with_decode"],
            "added_share": med["with_counts"] / med["with_decode"] - 1, "all_rounds": each}


JOIN_CALLS, JOIN_ORDINARY, JOIN_PAIRS = 50, 60, 20


def build_join_mix(pairs: int = JOIN_PAIRS, seed: int = 5) -> list[bytes]:
    """``pairs`` x (serving-side request, callers' request): see ``trace_join`` in the module docstring."""
    rng = random.Random(seed)
    t0 = time.time_ns()
    out = []

    def new_id(n: int) -> bytes:
        return rng.getrandbits(8 * n).to_bytes(n, "big")

    for _ in range(pairs):
        server, client = ExportTraceServiceRequest(), ExportTraceServiceRequest()
        rs = server.resource_spans.add()
        rs.resource.attributes.append(kv("service.name", "vllm"))
        ss = rs.scope_spans.add()
        ss.scope.name = "otel_llm"
        crs = client.resource_spans.add()
        crs.resource.attributes.append(kv("service.name", "app"))
        css = crs.scope_spans.add()
        css.scope.name = "opentelemetry.instrumentation.openai"
        for _ in range(JOIN_CALLS):
            rid = f"cmpl-{rng.getrandbits(64):016x}"
            tid, root = new_id(16), new_id(8)
            ttft, e2e = rng.lognormvariate(-2.5, 0.8), rng.lognormvariate(0, 0.5)
            s = ss.spans.add(trace_id=tid, span_id=root, name="text_completion llama", kind=2,
                             start_time_unix_nano=t0, end_time_unix_nano=t0 + int(e2e * 1e9))
            s.attributes.extend([kv(sc.OPERATION_NAME, "text_completion"), kv(sc.PROVIDER_NAME, "vllm"),
                                 kv(sc.REQUEST_MODEL, "llama"), kv(sc.LATENCY_TTFT, ttft),
                                 kv(sc.LATENCY_TPOT, 0.02), kv(sc.LATENCY_E2E, e2e),
                                 kv(sc.USAGE_INPUT_TOKENS, 100), kv(sc.USAGE_OUTPUT_TOKENS, 200),
                                 kv(sc.RESPONSE_ID, rid)])
            for j, name in enumerate(("llm.queue", "llm.prefill", "llm.decode", "llm.decode.step")):
                ss.spans.add(trace_id=tid, span_id=new_id(8), parent_span_id=root, name=name,
                             start_time_unix_nano=t0 + j, end_time_unix_nano=t0 + j + 1)
            step = ss.spans.add(trace_id=new_id(16), span_id=new_id(8), name="llm.engine.step",
                                start_time_unix_nano=t0, end_time_unix_nano=t0 + 1)
            step.links.add(trace_id=tid, span_id=root)
            ctid, caller = new_id(16), new_id(8)
            css.spans.add(trace_id=ctid, span_id=caller, name="POST /answer", kind=2,
                          start_time_unix_nano=t0, end_time_unix_nano=t0 + int(e2e * 1e9) + 1000)
            c = css.spans.add(trace_id=ctid, span_id=new_id(8), parent_span_id=caller, name="text_completion llama",
                              kind=3, start_time_unix_nano=t0, end_time_unix_nano=t0 + int(e2e * 1e9))
            c.attributes.extend([kv(sc.OPERATION_NAME, "text_completion"), kv(sc.REQUEST_MODEL, "llama"),
                                 kv(sc.RESPONSE_ID, rid)])
        ordinary = ExportTraceServiceRequest.FromString(build_requests(10, 1, seed=rng.getrandbits(32))[0])
        ss.spans.extend(ordinary.resource_spans[0].scope_spans[0].spans[:JOIN_ORDINARY * 10])
        out += [server.SerializeToString(), client.SerializeToString()]
    return out


def _join_round(payloads: list[bytes], join: bool) -> tuple[float, float, int, int, int]:
    """(CPU s, wall s, spans, joined, kept spans) for ``payloads`` on a fresh gateway, with or without the join."""
    g = Gateway(config(None), manual_ticks=True)
    sink = NullExporter()
    g.exporters = [sink]
    if not join:
        g.trace_join = None
    spans = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for p in payloads:
        g.ingest(g.read_request(p), raw=p)
        g.tick()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    spans = int(g.telemetry.total("receiver_accepted_spans"))
    joined = int(g.telemetry.total("trace_join_joined"))
    kept = sink.spans
    g.exporters = []
    g.shutdown()
    return cpu, wall, spans, joined, kept


def bench_trace_join(rounds: int) -> dict:
    payloads = build_join_mix()
    load_before = [round(x, 2) for x in os.getloadavg()]
    variants = ("join", "no_join")
    each: dict[str, dict] = {v: {"us": [], "wall_us": [], "joined": 0, "kept": 0, "spans": 0} for v in variants}
    for r in range(rounds):
        for v in variants[r % 2:] + variants[:r % 2]:
            cpu, wall, spans, joined, kept = _join_round(payloads, v == "join")
            e = each[v]
            e["us"].append(cpu / spans * 1e6)
            e["wall_us"].append(wall / spans * 1e6)
            e["joined"], e["kept"], e["spans"] = e["joined"] + joined, e["kept"] + kept, e["spans"] + spans

    def summary(xs: list[float], digits: int = 3) -> dict:
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else xs * 3
        return {"median": round(statistics.median(xs), digits), "p25": round(q[0], digits),
                "p75": round(q[2], digits), "min": round(min(xs), digits), "max": round(max(xs), digits)}

    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "unit": "us CPU per span (ingest + trace_join + tail sampling + export encoding), medians of rounds",
                 "mix": {"spans_per_round": each["join"]["spans"] // rounds,
                         "per_request_pair": f"{JOIN_CALLS} server request traces without a parent (6 spans each, "
                                             f"an engine-step span linking in included) + {JOIN_CALLS} client calls "
                                             f"(2 spans each) + {JOIN_ORDINARY} ordinary shape-10 traces",
                         "joined_share_of_spans": round(JOIN_CALLS * 8 / (JOIN_CALLS * 8 + JOIN_ORDINARY * 10), 2)},
                 "rounds": rounds, "machine": {"cpus": os.cpu_count(), "load_avg_before": load_before},
                 "note": "a shared 2-core machine with other work running: read the ratio (same round), "
                         "not the absolute times"}
    for v in variants:
        e = each[v]
        out[v] = {"cpu_us_per_span": summary(e["us"]), "wall_us_per_span": summary(e["wall_us"]),
                  "spans_per_cpu_s": summary([1e6 / x for x in e["us"]], 0),
                  "joined_per_round": e["joined"] // rounds, "kept_share": round(e["kept"] / e["spans"], 3)}
    ratios = [a / b for a, b in zip(each["join"]["us"], each["no_join"]["us"])]
    out["join_vs_no_join_cpu"] = summary(ratios)
    out["added_us_per_span"] = round(out["join"]["cpu_us_per_span"]["median"]
                                     - out["no_join"]["cpu_us_per_span"]["median"], 3)
    out["machine"]["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _commit(root: Path) -> str:
    """The measured checkout, as its commit (a machine's path says nothing to a reader of the results)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--only", default="ingest,loopback,memory,overload,inter_token,trace_join")
    ap.add_argument("--itl-rounds", type=int, default=7, help="rounds of the inter_token section")
    ap.add_argument("--root", default=None, help="measure the collector and core of another checkout")
    ap.add_argument("--runs", type=int, default=3, help="loopback runs per shape (the median is reported)")
    ap.add_argument("--shapes", default="1,10,200", help="trace shapes (spans per trace) to measure")
    ap.add_argument("--paths", default=None, help="receive paths to compare in this run: one_pass,two_pass")
    ap.add_argument("--out", default=None, help="write the results here (any phases, shapes, paths)")
    ap.add_argument("--persistence-rounds", type=int, default=15, help="rounds of the persistence section")
    ap.add_argument("--join-rounds", type=int, default=15, help="rounds of the trace_join section")
    args = ap.parse_args()
    paths = args.paths.split(",") if args.paths else [None]
    shapes = tuple(int(s) for s in args.shapes.split(","))
    phases = set(args.only.split(","))
    ctx = mp.get_context("spawn")
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
                     "code": _commit(ROOT)}
    sink_proc = None
    if phases & {"loopback", "overload"}:
        port_q = ctx.Queue()
        sink_proc = ctx.Process(target=_sink_server, args=(port_q,), daemon=True)
        sink_proc.start()
        sink = f"127.0.0.1:{port_q.get()}"
    if "ingest" in phases or "loopback" in phases:
        results["ingest"] = []
        for s in shapes:
            if args.paths:
                results["ingest"] += list(bench_ingest(s, args.seconds, paths).values())
            else:
                results["ingest"].append(bench_ingest(s, args.seconds))
    if "loopback" in phases:
        results["loopback_grpc"] = []
        for s in shapes:
            expected = max(r["spans_per_cpu_s"] for r in results["ingest"] if r["shape"] == s)
            by_path = loopback_paths(s, args.seconds, ctx, sink, expected, args.runs, paths)
            results["loopback_grpc"] += [{**r, **({"path": path} if path else {})} for path, r in by_path.items()]
    if "memory" in phases:
        results["memory"] = bench_memory()
    if "overload" in phases:
        cap = next((r["wall_spans_per_s"] for r in results.get("loopback_grpc", []) if r["shape"] == 10), 60_000)
        results["overload_10x"] = bench_overload(cap, 2 * args.seconds, ctx, sink)
    if sink_proc is not None:
        sink_proc.terminate()
    inter_token = bench_inter_token(args.itl_rounds) if "inter_token" in phases else None
    persistence = bench_persistence(args.persistence_rounds) if "persistence" in phases else None
    trace_join = bench_trace_join(args.join_rounds) if "trace_join" in phases else None
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]

    print(f"{'phase':<24}{'shape':>6}{'spans':>10}{'spans/s/core':>14}{'us/span':>9}{'ceiling':>9}{'x ceil':>8}  spread")
    for r in results.get("ingest", []):
        print(f"{'ingest ' + r.get('path', ''):<24}{r['shape']:>6}{r['spans']:>10}{r['spans_per_cpu_s']:>14}{r['gateway_us_per_span']:>9.2f}"
              f"{r['parse_touch_us_per_span']:>9.2f}{r['x_ceiling']:>8.2f}  median of {r['rounds']} "
              f"rounds, p25-p75 {r['p25']}-{r['p75']}, min-max {r['min']}-{r['max']}")
    for r in results.get("loopback_grpc", []):
        print(f"{'loopback_grpc ' + r.get('path', ''):<24}{r['shape']:>6}{r['spans']:>10}{r['spans_per_cpu_s']:>14}"
              f"{r['gateway_us_per_span']:>9.2f}{r['parse_touch_us_per_span']:>9.2f}{r['x_ceiling']:>8.2f}  median of "
              f"{r['runs']} runs {r['spans_per_cpu_s_each']}, wall {r['wall_spans_per_s']} spans/s, "
              f"repeated payloads {r['repeated_payloads']}")
    print("ceiling: full OTLP classes parse + read every field of every span (parse only: "
          + ", ".join(f"shape {r['shape']} {r['parse_only_us_per_span']} us" for r in results.get("ingest", [])) + ")")
    if "memory" in results:
        m = results["memory"]
        print(f"memory: {m['rss_bytes_per_span']} B RSS per buffered span ({m['encoded_bytes_per_span']} B encoded)")
    if "overload_10x" in results:
        o = results["overload_10x"]
        print(f"overload 10x: offered {o['offered_spans_per_s']} spans/s, accepted {o['accepted_spans']}, "
              f"refused requests {o['client']['refused']}, evictions {o['evictions']}, "
              f"export drops {o['export_dropped_spans']}, RSS {o['rss_mb_second_half_min']}-"
              f"{o['rss_mb_second_half_max']} MB (2nd half), peak {o['peak_rss_mb']} MB")
    print(f"load average (1, 5, 15 min): start {results['machine']['loadavg_at_start']}, "
          f"end {results['machine']['loadavg_at_end']}")
    if inter_token is not None:
        print("inter-token derivation, us CPU per shape-1 span: " + ", ".join(
            f"{k} {v:.2f}" for k, v in inter_token["median"].items())
            + f"; the counts add {inter_token['added_us_per_span']:.2f} us ({100 * inter_token['added_share']:.1f} %)")
        if args.root is None:
            out = Path(__file__).resolve().parent / "results" / "collector_inter_token.json"
            out.write_text(json.dumps(inter_token, indent=2) + "\n")
            print(f"written {out}")
    if persistence is not None:
        print("persistence, us per shape-10 span (CPU / wall): " + ", ".join(
            f"{v} {persistence[v]['cpu_us_per_span']['median']:.2f} / {persistence[v]['wall_us_per_span']['median']:.2f}"
            for v in PERSISTENCE_VARIANTS) + "; ratios to memory-only (CPU, wall): " + ", ".join(
            f"{v} {persistence[f'{v}_vs_memory_cpu']['median']:.2f}x "
            f"({persistence[f'{v}_vs_memory_cpu']['min']:.2f}-{persistence[f'{v}_vs_memory_cpu']['max']:.2f}), "
            f"{persistence[f'{v}_vs_memory_wall']['median']:.2f}x "
            f"({persistence[f'{v}_vs_memory_wall']['min']:.2f}-{persistence[f'{v}_vs_memory_wall']['max']:.2f})"
            for v in PERSISTENCE_VARIANTS[1:]))
        if args.root is None:
            persistence["code"] = results["code"]
            out = Path(__file__).resolve().parent / "results" / "collector_persistence.json"
            out.write_text(json.dumps(persistence, indent=2) + "\n")
            print(f"written {out}")
    if trace_join is not None:
        j, n = trace_join["join"], trace_join["no_join"]
        print("trace_join, us CPU per span (median, p25-p75): "
              + ", ".join(f"{k} {x['cpu_us_per_span']['median']:.2f} ({x['cpu_us_per_span']['p25']:.2f}-"
                          f"{x['cpu_us_per_span']['p75']:.2f}), {x['spans_per_cpu_s']['median']:.0f} spans/s"
                          for k, x in (("join", j), ("no_join", n)))
              + f"; ratio {trace_join['join_vs_no_join_cpu']['median']:.3f} "
              f"({trace_join['join_vs_no_join_cpu']['p25']:.3f}-{trace_join['join_vs_no_join_cpu']['p75']:.3f}), "
              f"{j['joined_per_round']} joined per round")
        if args.root is None:
            trace_join["code"] = results["code"]
            out = Path(__file__).resolve().parent / "results" / "collector_trace_join.json"
            out.write_text(json.dumps(trace_join, indent=2) + "\n")
            print(f"written {out}")
    if args.out or (args.root is None and {"ingest", "loopback", "memory", "overload"} <= phases
                    and shapes == (1, 10, 200) and args.paths is None):
        out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / "collector_throughput.json"
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"written {out}")


if __name__ == "__main__":
    main()
