"""Per-chunk cost of the openai adapter, A/B in one process: a baseline git ref's adapter (default
``main``) against this tree's, over the same chunk objects, interleaved rounds, medians.

The chunks are the recorded real OpenAI streams in ``tests/openai/recordings/`` (text, tool calls,
refusal, n=3), built into ``ChatCompletionChunk`` objects the way ``openai.Stream`` builds them
(``construct_type``), each stream repeated to ``--chunks`` chunks. The baseline's ``otel_llm``
package is extracted with ``git archive`` into a temporary folder and imported as
``otel_llm_base`` (its imports are relative), so both adapters run in the same interpreter, on
the same objects, with the same SDK tracer and meter. Per round and stream: CPU ns per chunk for
the bare iterator, the baseline's proxy and ours, iterated the two ways callers do
(``for chunk in stream`` and ``next(stream)``), plus the once-per-stream end (span and metrics);
the order of the three alternates between rounds.

    .venv/bin/python benchmarks/client_chunk_ab.py [--ref main] [--rounds 31]

Prints a table and writes benchmarks/results/client_chunk_ab.json. Compare the two columns of
one run, never absolute times across runs (the load average is recorded: 2 shared cores).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "client_chunk_ab.json"
STREAMS = ("chat_text_stream", "chat_tool_call_stream", "chat_refusal_stream", "chat_n3_stream")


def load_package(ref: str, into: Path, name: str) -> Any:
    """``git archive {ref} otel_llm`` into ``into``, imported under ``name``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "otel_llm"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    spec = importlib.util.spec_from_file_location(name, into / "otel_llm" / "__init__.py",
                                                  submodule_search_locations=[str(into / "otel_llm")])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Adapter:
    """One adapter's stream proxy, chunk reader and record, with a telemetry object of its own."""

    def __init__(self, package: str) -> None:
        imp = importlib.import_module
        self.StreamProxy = imp(f"{package}.instrumentation.openai.stream").StreamProxy
        self.reader = imp(f"{package}.instrumentation.openai.ops").Chat.chunk
        self.CallRecord = imp(f"{package}.instrumentation.openai.record").CallRecord
        module = imp(f"{package}.instrumentation.openai.telemetry")
        Telemetry = getattr(module, "ClientState", None) or module.ClientTelemetry  # renamed on main
        ClientMetrics = imp(f"{package}.core.client_metrics").ClientMetrics
        Config = imp(f"{package}.core.config").Config
        config = Config.resolve({"slo": "ttft=1,tpot=0.05"})
        meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("ab")
        self.telemetry = Telemetry(config, TracerProvider().get_tracer("ab"), ClientMetrics(meter, config.slo))

    def proxy(self, chunks: list[Any]) -> Any:
        t = self.telemetry
        rec = self.CallRecord(t, t.tracer.start_span("chat m"), "chat", "m", True, ("h", 1), time.time_ns(), False)
        return self.StreamProxy(iter(chunks), rec, self.reader)


def chunks_of(name: str, count: int) -> list[Any]:
    sys.path.insert(0, str(ROOT / "tests" / "openai"))
    from replay_server import load  # the recordings' loader, shared with the tests

    one = [construct_type(type_=ChatCompletionChunk, value=p) for p in load(name).payloads()]
    return (one * (count // len(one) + 1))[:count]


def run(chunks: list[Any], base: Adapter, ours: Adapter, rounds: int) -> dict[str, Any]:
    n = len(chunks)
    samples: dict[str, list[float]] = {k: [] for k in (
        "bare_for", "base_for", "ours_for", "bare_next", "base_next", "ours_next", "base_end_us", "ours_end_us")}

    def for_loop(label: str, make: Callable[[], Any]) -> None:
        source = make()
        t0 = time.process_time_ns()
        k = 0
        for _ in source:  # the caller's loop: stops one chunk short, so the end is timed apart
            k += 1
            if k == n:
                break
        samples[f"{label}_for"].append((time.process_time_ns() - t0) / n)

    def next_calls(label: str, make: Callable[[], Any]) -> None:
        source = make()
        t0 = time.process_time_ns()
        for _i in range(n):
            next(source)
        samples[f"{label}_next"].append((time.process_time_ns() - t0) / n)
        if label != "bare":
            t0 = time.process_time_ns()
            for _ in source:  # exhaustion: span attributes, span end, metrics
                pass
            samples[f"{label}_end_us"].append((time.process_time_ns() - t0) / 1e3)

    makers = {"bare": lambda: iter(chunks), "base": lambda: base.proxy(chunks), "ours": lambda: ours.proxy(chunks)}
    for r in range(rounds):
        order = ("bare", "base", "ours") if r % 2 == 0 else ("ours", "base", "bare")
        for label in order:
            for_loop(label, makers[label])
            next_calls(label, makers[label])
    med = {k: statistics.median(v) for k, v in samples.items()}
    out: dict[str, Any] = {"chunks": n, "median": med}
    for how in ("for", "next"):
        out[f"overhead_ns_per_chunk_{how}"] = {"base": med[f"base_{how}"] - med[f"bare_{how}"],
                                               "ours": med[f"ours_{how}"] - med[f"bare_{how}"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ref", default="main")
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--chunks", type=int, default=200)
    args = p.parse_args()
    load_start = os.getloadavg()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.ref], capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        load_package(args.ref, Path(tmp), "otel_llm_base")
        base, ours = Adapter("otel_llm_base"), Adapter("otel_llm")
        results = {name: run(chunks_of(name, args.chunks), base, ours, args.rounds) for name in STREAMS}
    result = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "note": "2 cores shared by several engineers' processes: compare columns, not runs",
                    "load_average_at_start": load_start, "load_average_at_end": os.getloadavg()},
        "baseline": {"ref": args.ref, "commit": commit}, "ours": {"commit": head, "note": "working tree"},
        "args": vars(args), "streams": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    print(f"load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}; baseline {args.ref} {commit[:10]}")
    print(f"{'stream':24s} {'how':5s} {'bare ns':>8s} {'base +ns':>9s} {'ours +ns':>9s} {'ours/base':>9s}"
          f" {'base end µs':>11s} {'ours end µs':>11s}")
    for name, r in results.items():
        m = r["median"]
        for how in ("for", "next"):
            o = r[f"overhead_ns_per_chunk_{how}"]
            end = f" {m['base_end_us']:11.0f} {m['ours_end_us']:11.0f}" if how == "next" else ""
            print(f"{name:24s} {how:5s} {m[f'bare_{how}']:8.0f} {o['base']:9.0f} {o['ours']:9.0f}"
                  f" {o['ours'] / o['base']:9.2f}{end}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
