"""What a kept request at full detail costs to materialize, by length: the cold path alone.

Requests of 128, 1,024 and 4,096 output tokens, one engine step per token (batch of 8 decode
requests; every 64th step also prefills 256 tokens of another request, and 1 % of steps
hiccup at 3x), are finished through ``Pipeline`` with every request kept at full detail.
Measured: process CPU time from ``finish`` to the spans being sent (spans built, encoded,
posted over OTLP/HTTP to a discarding sink in another process), per request and per output
token, and the spans per request trace. Two span paths: direct export (the SDK's
``BatchSpanProcessor`` + OTLP exporter, which we write bytes for) and the SDK path (any other
processor; here a batch processor around an exporter that discards).

``--work`` counts instead of timing (``decode_detail_work.json``): per request, from ``finish`` to the
spans being sent, in every thread, the Python calls into the code that builds and encodes the spans
(``SPAN_CODE``), the C calls that code makes and the bytecodes it executes. The counts do not depend
on the machine's speed or load, so an A/B of them resolves any change of work on that path, however
small; what a call or a bytecode costs in time they do not say.

The script only uses the core's public classes, so the same file measures another checkout:
``PYTHONPATH=/path/to/other/checkout python benchmarks/decode_detail.py --label before``.

Run: ./run bench benchmarks/decode_detail.py [--requests 24] [--work]
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
LENGTHS = (128, 1024, 4096)
BATCH = 8
# the code that builds a kept request's spans and encodes them (either tree's layout of it)
SPAN_CODE = re.compile(r"otel_llm[/\\](otlp[/\\]|core[/\\](spans|span_routes|decode_rows|step_facts)\.py)")


def start_sink() -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_overhead import start_sink as start

    return start()


def workload(tel, tokens: int, rng: random.Random, first_id: int) -> tuple[list, list]:
    """BATCH requests of ``tokens`` tokens decoding together: their timelines and the steps."""
    from otel_llm.core.summary import RequestSummary
    from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestShare, RequestTimeline, StepRecord

    now = time.monotonic() - 3600.0
    arrival = time.time() - 3600.0
    rids = [f"r{first_id + k}" for k in range(BATCH)]
    timelines = []
    for rid in rids:
        t = RequestTimeline(rid, arrival, model="m", response_id=rid, input_tokens=64)
        tel.start(t)
        t.events += [(QUEUED, now), (SCHEDULED, now + 0.001)]
        timelines.append(t)
    step_id = first_id * 100_000
    tel.add_step(StepRecord(step_id, now + 0.001, now + 0.02, [RequestShare(r, 64, True) for r in rids]))
    for t in timelines:
        t.token_ts.append(now + 0.02)
    now += 0.02
    for i in range(1, tokens):
        gap = 0.01 * (1 + 0.05 * rng.random()) * (3 if rng.random() < 0.01 else 1)
        shares = [RequestShare(r, 1, False) for r in rids]
        if i % 64 == 0:
            shares.append(RequestShare("someone-else", 256, True))
            gap *= 1.3
        step_id += 1
        tel.add_step(StepRecord(step_id, now, now + gap, shares))
        now += gap
        for t in timelines:
            t.token_ts.append(now)
    summaries = []
    for t in timelines:
        decode = t.token_ts[-1] - t.token_ts[0]
        summaries.append(RequestSummary(model="m", ttft=0.021, e2e=0.021 + decode, queue=0.001, prefill=0.019,
                                        decode=decode, tpot=decode / (tokens - 1), input_tokens=64,
                                        output_tokens=tokens))
    return timelines, summaries


def pipeline(path: str, endpoint: str):
    """The telemetry pipeline and its tracer provider, for the direct-export or the SDK span path."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from otel_llm.core.config import Config
    from otel_llm.core.pipeline import Pipeline
    from otel_llm.otlp.routes import Router

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces") if path == "direct" else Discard()
    tp.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 20, max_export_batch_size=4096))
    config = Config.resolve({"sample_rate": 1.0, "baseline_detail": "steps", "tail_quantile": 0,
                             "max_steps": 1 << 20}, environ={})
    # A tree whose span builder picks its routes itself takes no router (so an A/B can reach back to it).
    takes_router = "router" in inspect.signature(Pipeline).parameters
    tel = Pipeline(config, tp.get_tracer("otel_llm"), MeterProvider().get_meter("b"), "bench",
                   **({"router": Router} if takes_router else {}))
    return tel, tp


def measure(path: str, endpoint: str, tokens: int, requests: int) -> dict:
    tel, tp = pipeline(path, endpoint)
    rng = random.Random(tokens)
    cpu = []
    spans = []
    done = 0
    while done < requests:
        timelines, summaries = workload(tel, tokens, rng, done)
        sent0 = tel.stats().get("direct_spans_sent", 0)
        c0 = time.process_time()
        for t, s in zip(timelines, summaries):
            tel.finish(t.request_id, s)
        assert tel.flush(120) and tp.force_flush(120_000)
        cpu.append((time.process_time() - c0) / len(timelines))
        if path == "direct":
            spans.append((tel.stats()["direct_spans_sent"] - sent0) / len(timelines))
        done += len(timelines)
    tel.close()
    tp.shutdown()
    per_request = statistics.median(cpu)
    # the fastest batch too: what a batch costs when nothing else on the machine got in its way
    return {"path": path, "tokens": tokens, "cpu_ms_per_request": round(1e3 * per_request, 3),
            "cpu_ms_per_request_min": round(1e3 * min(cpu), 3),
            "cpu_us_per_token": round(1e6 * per_request / tokens, 2),
            "spans_per_request_incl_engine_steps": round(statistics.median(spans), 1) if spans else None}


class WorkCounter:
    """Calls into ``SPAN_CODE``, the C calls it makes and the bytecodes it executes, in every thread started
    after ``install`` (and this one), while ``on``. ``itertools.count``: an increment no thread switch splits."""

    def __init__(self) -> None:
        self.on = False
        self._calls, self._c_calls, self._bytecodes = itertools.count(), itertools.count(), itertools.count()
        self._ours: dict[object, bool] = {}

    def _is_ours(self, code) -> bool:
        hit = self._ours.get(code)
        if hit is None:
            hit = self._ours[code] = SPAN_CODE.search(code.co_filename) is not None
        return hit

    def _profile(self, frame, event, arg) -> None:
        if self.on and event in ("call", "c_call") and self._is_ours(frame.f_code):
            next(self._calls if event == "call" else self._c_calls)

    def _trace(self, frame, event, arg):
        if not (self.on and self._is_ours(frame.f_code)):
            return None
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        bytecodes = self._bytecodes

        def local(frame, event, arg):
            if event == "opcode":
                next(bytecodes)
            return local
        return local

    def install(self) -> None:
        threading.setprofile(self._profile)
        threading.settrace(self._trace)
        sys.setprofile(self._profile)
        sys.settrace(self._trace)

    def remove(self) -> None:
        sys.setprofile(None)
        sys.settrace(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        threading.settrace(None)  # type: ignore[arg-type]

    def read(self) -> tuple[int, int, int]:
        return next(self._calls), next(self._c_calls), next(self._bytecodes)


def count_work(path: str, endpoint: str, tokens: int) -> dict:
    """One batch counted, after one that warms what is built once (caches, threads, lazy imports)."""
    counter = WorkCounter()
    counter.install()
    try:
        tel, tp = pipeline(path, endpoint)
        rng = random.Random(tokens)
        for batch in range(2):
            timelines, summaries = workload(tel, tokens, rng, batch * BATCH)
            sent0 = tel.stats().get("direct_spans_sent", 0)
            before = counter.read()
            counter.on = batch == 1
            for t, s in zip(timelines, summaries):
                tel.finish(t.request_id, s)
            assert tel.flush(120) and tp.force_flush(120_000)
            counter.on = False
            after = counter.read()
        sent = tel.stats().get("direct_spans_sent", 0) - sent0
        tel.close()
        tp.shutdown()
    finally:
        counter.remove()
    # each read took one from every counter
    calls, c_calls, bytecodes = (round((b - a - 1) / BATCH, 1) for a, b in zip(before, after))
    return {"path": path, "tokens": tokens, "py_calls_per_request": calls, "c_calls_per_request": c_calls,
            "bytecodes_per_request": bytecodes,
            "spans_per_request_incl_engine_steps": round(sent / BATCH, 1) if path == "direct" else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=24, help="requests per length (in batches of 8)")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--paths", default="direct,sdk", help="span paths to measure (comma-separated)")
    ap.add_argument("--work", action="store_true", help="count calls and bytecodes instead of timing "
                                                        "(decode_detail_work.json)")
    args = ap.parse_args()
    paths = args.paths.split(",")
    if not set(paths) <= {"direct", "sdk"}:
        ap.error(f"--paths {args.paths}: direct, sdk or both")
    sink, endpoint = start_sink()
    try:
        if args.work:
            rows = [count_work(path, endpoint, n) for n in LENGTHS for path in paths]
        else:
            rows = [measure(path, endpoint, n, args.requests) for n in LENGTHS for path in paths]
    finally:
        sink.terminate()
    if args.work:
        for r in rows:
            print(f"{args.label:14s} {r['path']:6s} {r['tokens']:5d} tokens  {r['py_calls_per_request']:9.1f} calls  "
                  f"{r['c_calls_per_request']:9.1f} C calls  {r['bytecodes_per_request']:10.1f} bytecodes a request")
        write(RESULTS / "decode_detail_work.json", args.label, {"span_code": SPAN_CODE.pattern, "rows": rows})
        return
    for r in rows:
        print(f"{args.label:14s} {r['path']:6s} {r['tokens']:5d} tokens  {r['cpu_ms_per_request']:9.2f} ms/request  "
              f"{r['cpu_us_per_token']:6.2f} us/token  spans {r['spans_per_request_incl_engine_steps']}")
    write(RESULTS / "decode_detail.json", args.label, {"requests_per_length": args.requests, "rows": rows})


def write(out_path: Path, label: str, entry: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    out = json.loads(out_path.read_text()) if out_path.exists() else {}
    out[label] = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
                  **entry}
    out_path.write_text(json.dumps(out, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
