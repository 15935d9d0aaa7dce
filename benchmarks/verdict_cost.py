"""Cost of the slow-cause verdict: what each engine step adds where steps arrive, and what one verdict
costs on the materializer thread, on constructed engine histories (no engine).

1. ``Pipeline.add_step`` per step at decode batch sizes 16 and 256 (every request tracked), with the
   step window on, and with it replaced by a no-op (``StepWindow.add`` alone is the difference);
   best of interleaved repeats.
2. ``decide()`` for a request that waited 500 steps and decoded 1,000, and one that decoded 2,500,
   in a window of 8,192 steps; per verdict and per step of the request's life.

    .venv/bin/python benchmarks/verdict_cost.py

Prints the numbers and writes benchmarks/results/verdict_cost.json.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from otel_llm.core.config import Config
from otel_llm.core.diagnosis.verdict import StepWindow, decide
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.timeline import BLOCKED_MAX_SEQS, QUEUED, SCHEDULED, PrefillChunk, RequestTimeline, StepRecord

ENGINE = 1 << 32


def add_step_cost(batch: int, window: bool, reps: int) -> float:
    tele = Pipeline(Config.resolve({"max_steps": 1 << 20}, environ={}), TracerProvider().get_tracer("b"),
                     MeterProvider().get_meter("b"), "bench")
    if not window:
        tele.window.add = lambda *a: None  # type: ignore[method-assign]
    rids = [f"r{i}" for i in range(batch)]
    for r in rids:
        tele.start(RequestTimeline(r, 0.0))
    shares = [(r, 1, False) for r in rids]
    shares[0] = (rids[0], 64, True)
    records = [StepRecord(ENGINE | i, 1.0, 1.01, shares, batch, 0, 0, 0.5) for i in range(reps)]
    start = time.perf_counter()
    for r in records:
        tele.add_step(r)
    took = (time.perf_counter() - start) / reps
    tele.close(1.0)
    return took


def history() -> tuple[StepWindow, dict[str, RequestTimeline]]:
    """32 decoding requests; "w" waits 500 steps behind a full batch, then decodes 1,000 tokens."""
    window = StepWindow(8192)
    timelines = {r: RequestTimeline(r, 0.0) for r in ("r0", "w")}
    now, sid = 100.0, ENGINE

    def step(shares: list[tuple[str, int, bool]], blocked: int = 0, waiting: int = 0) -> None:
        nonlocal now, sid
        sid += 1
        start, now = now + 0.001, now + 0.011
        rec = StepRecord(sid, start, now, shares, len(shares), waiting, 0, None, queue_blocked=blocked)
        window.add(rec, sum(n for _, n, p in shares if p), sum(1 for *_, p in shares if not p))
        for rid, n, prefill in shares:
            t = timelines.get(rid)
            if t is None:
                continue
            if not t.steps:
                t.events.append((SCHEDULED, start))
            t.steps.append(sid)
            if prefill:
                t.chunks.append(PrefillChunk(sid, start, now, n))
            t.token_ts.append(now)

    timelines["r0"].events.append((QUEUED, now))
    decoders = [(f"r{i}", 1, False) for i in range(32)]
    for _ in range(2000):
        step(decoders)
    timelines["w"].events.append((QUEUED, now))
    for _ in range(500):
        step(decoders, BLOCKED_MAX_SEQS, 1)
    step([("w", 16, True)])
    for _ in range(1000):
        step([("w", 1, False)])
    return window, timelines


def main() -> None:
    results: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                     "python": platform.python_version(),
                     "load_average_1m": round(os.getloadavg()[0], 1), "add_step_us": {}, "verdict": {}}
    for batch, reps in ((16, 20000), (256, 2000)):
        on, off = [], []
        for _ in range(5):  # interleaved, best of each
            on.append(add_step_cost(batch, True, reps))
            off.append(add_step_cost(batch, False, reps))
        results["add_step_us"][f"batch_{batch}"] = {"with_window": round(min(on) * 1e6, 2),
                                                    "window_off": round(min(off) * 1e6, 2)}
    window, timelines = history()
    for rid, life in (("w", 1501), ("r0", 2500)):
        n, start = 20, time.perf_counter()
        for _ in range(n):
            v = decide(timelines[rid], window, ("e2e",))
        per = (time.perf_counter() - start) / n
        results["verdict"][rid] = {"steps_in_life": life, "ms_per_verdict": round(per * 1e3, 2),
                                   "us_per_step": round(per / life * 1e6, 2), "cause": v.cause}
    print(json.dumps(results, indent=1))
    out = Path(__file__).parent / "results" / "verdict_cost.json"
    out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
