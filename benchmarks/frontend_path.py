"""The default mode's frontend CPU per token, without the engine: what ``vllm_overhead.py``'s default row is
made of, measured where the noise of a running model is absent, and comparable between two checkouts.

The workload is ``vllm_overhead.py``'s (64 requests x 128 output tokens, prompts of 16-72 tokens, a
512-token step budget), replayed on the frontend path exactly as vLLM's output thread drives it: per
engine step ``Pipeline.add_step`` (the step record as the frontend receives it), ``record_outputs`` on
vLLM's own ``EngineCoreOutput`` structs, and for each request vLLM let go of, the wrapper's ``_finish``
(summary from vLLM's ``RequestStateStats``, tail decision, submission to the materializer). Spans go
through the SDK's BatchSpanProcessor to a null exporter; metrics are recorded in memory. The step
records, outputs and engine statistics are built before the clock starts: only our code is timed.

Reported per token (medians over repetitions): CPU of the whole process (output thread + materializer +
span processor), of the output thread alone, and the output thread's parts (decode: the step datagram
as the receiver decodes it, with its id-list cache where the checkout's decoder takes one, in this checkout's wire: v1's (id, tokens, prefill, context) tuples or v2's
lists (``step_wire.Shares``, prefilling shares listed as having no output); add_step,
record_outputs, finish); and the wall time of the garbage collections our allocations set off in the
timed window (the decoded step records' share tuples live until their requests finish). The slow-cause verdict, spans and metrics are the pipeline's own (``instrument()`` defaults).

A/B: ``--root A --root B`` runs each checkout's ``otel_llm`` in its own subprocess, alternating per
round (order flipped every round), and reports per-round paired differences; the results go to
``benchmarks/results/frontend_path.json`` (``--out`` to change).

``--mode full``: every request kept at full detail (``sample_rate=1.0, baseline_detail="steps"``, as
``vllm_overhead.py``'s full mode), spans written as OTLP bytes (direct export) through the SDK's OTLP/HTTP
exporter to a discarding sink process; the materializer column is that background thread's CPU.

Run: /work/bin/wtpy benchmarks/frontend_path.py --root . --root /tmp/main-src [--rounds 9] [--mode full]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any
from pathlib import Path

N_REQUESTS, OUTPUT_TOKENS, BUDGET = 64, 128, 512
RESULTS = Path(__file__).parent / "results"


def workload():
    """(step records, per-step outputs, per-step finished ids, per-request stats): a greedy scheduler
    that decodes every running request one token a step and prefills waiting prompts in chunks."""
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.metrics.stats import RequestStateStats

    from otel_llm.core.timeline import StepRecord

    prompts = [16 + (i % 8) * 8 for i in range(N_REQUESTS)]
    rids = [f"cmpl-{i:04d}-0" for i in range(N_REQUESTS)]
    computed = [0] * N_REQUESTS
    generated = [0] * N_REQUESTS
    t0, dt = 1000.0, 0.02
    stats = {rid: RequestStateStats(arrival_time=t0) for rid in rids}
    steps, outputs, finished = [], [], []
    step_id = 0
    while any(g < OUTPUT_TOKENS for g in generated):
        start = t0 + step_id * dt
        end = start + dt * 0.9
        budget, shares, contexts, outs, done = BUDGET, [], [], [], []
        for i, rid in enumerate(rids):
            if computed[i] >= prompts[i] and generated[i] < OUTPUT_TOKENS:  # decoding
                shares.append((rid, 1, False))
                contexts.append(computed[i] + generated[i])
                budget -= 1
        for i, rid in enumerate(rids):
            if computed[i] < prompts[i] and budget > 0:  # prefilling (a chunk)
                n = min(budget, prompts[i] - computed[i])
                shares.append((rid, n, True))
                contexts.append(computed[i])
                budget -= n
                if computed[i] == 0:
                    stats[rid].queued_ts, stats[rid].scheduled_ts = t0, start
                computed[i] += n
                if computed[i] < prompts[i]:
                    continue
            elif not any(s[0] == rid and not s[2] for s in shares):
                continue
            generated[i] += 1
            st = stats[rid]
            if generated[i] == 1:
                st.first_token_ts, st.first_token_latency = end, end - t0
            st.last_token_ts, st.num_generation_tokens = end, generated[i]
            last = generated[i] == OUTPUT_TOKENS
            outs.append(EngineCoreOutput(request_id=rid, new_token_ids=[7], finish_reason=1 if last else None))
            if last:
                done.append(rid)
        record = StepRecord(step_id, start, end, shares, len(shares), N_REQUESTS - len(shares), 0, 0.5)
        record.contexts = contexts
        record.schedule_s, record.execute_s, record.output_s, record.idle_s = 1e-4, dt * 0.8, 1e-4, 0.0
        steps.append(record)
        outputs.append(outs)
        finished.append(done)
        step_id += 1
    return rids, stats, steps, outputs, finished


class State:
    """vLLM's RequestState, as far as the wrapper reads it."""

    __slots__ = ("stats", "num_cached_tokens", "detokenizer")

    def __init__(self, stats) -> None:
        self.stats, self.num_cached_tokens, self.detokenizer = stats, 0, None


MODES = {"default": {}, "full": {"sample_rate": 1.0, "baseline_detail": "steps"}}  # as vllm_overhead.py's


def child(repeat: int, mode: str = "default", endpoint: str | None = None) -> dict:
    """One checkout's measurement (runs in a subprocess with that checkout first on sys.path). ``full``:
    every request kept at full detail, its spans written as OTLP bytes (direct export) to the sink at
    ``endpoint`` through the SDK's OTLP exporter, as vllm_overhead.py's full mode does."""
    import copy
    import gc
    import inspect
    import random

    import otel_llm
    from otel_llm.core.config import Config
    from otel_llm.core.pipeline import Pipeline
    from otel_llm.core.timeline import RequestTimeline
    from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers, record_outputs

    from vllm_overhead import providers

    tp, mp = providers(endpoint)  # full mode: an OTLP exporter to the sink, what direct export writes bytes for
    pipeline = Pipeline(Config.resolve(MODES[mode]), tp.get_tracer("bench"), mp.get_meter("bench"), "vllm")
    w = VLLMWrappers(pipeline)
    mat_ns = [0]  # CPU of the span materializer's thread (the cold path: spans built and encoded)
    work = pipeline.materializer._work

    def timed(job: Any) -> None:
        a = time.thread_time_ns()
        try:
            work(job)
        finally:
            mat_ns[0] += time.thread_time_ns() - a
    pipeline.materializer._work = timed
    rids, stats, steps, outputs, finished = workload()
    wire = encoded(steps)
    if wire is not None:
        from otel_llm.instrumentation.vllm import step_wire
    gc_ns = [0, 0]  # (collections, ns) in the timed window: what our allocations cost the process's collector

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_ns[1] -= time.perf_counter_ns()
        else:
            gc_ns[0] += 1
            gc_ns[1] += time.perf_counter_ns()
    tokens = N_REQUESTS * OUTPUT_TOKENS
    rows = []
    for rep in range(repeat + 1):  # the first is a warm-up
        random.seed(rep)  # the same baseline sample (trace ids) in every checkout
        if wire is None:  # fresh settlement state (pending, links) each time
            recs = [copy.copy(s) for s in steps]
            for r in recs:
                r.links = []
        else:
            recs = wire  # decoded in the loop, as the frontend's receiver does
        states = {rid: State(stats[rid]) for rid in rids}
        for i, rid in enumerate(rids):
            t = RequestTimeline(request_id=rid, arrival=time.time(), model="m", operation="text_completion",
                                provider="vllm", input_tokens=16 + (i % 8) * 8)
            t.native = states[rid]
            pipeline.start(t)
        requests = pipeline.requests
        add = finish = rec = dec = 0
        decode = step_wire.decode if wire is not None else None
        # as StepReceiver decodes: with its id-list cache, where this checkout's decoder takes one
        cache = [None, None] if decode is not None and "cache" in inspect.signature(decode).parameters else None
        tt = time.thread_time_ns
        gc.collect()
        gc_ns[:] = [0, 0]
        mat_ns[0] = 0
        gc.callbacks.append(on_gc)
        p0, m0 = time.process_time_ns(), tt()
        for record, outs, done in zip(recs, outputs, finished):
            a = tt()
            if decode is not None:
                record = decode(record) if cache is None else decode(record, cache)
                a, dec = tt(), dec + tt() - a
            pipeline.add_step(record)
            b = tt()
            for rid in done:
                del states[rid]
            fin = record_outputs(requests, states, outs, record.end)
            c = tt()
            if fin:
                now = time.time()
                for t, reason in fin:
                    w._finish(t, "length", now)
            d = tt()
            add += b - a
            rec += c - b
            finish += d - c
        main = tt() - m0
        pipeline.flush(30.0)
        tp.force_flush()
        total = time.process_time_ns() - p0
        gc.callbacks.remove(on_gc)
        if rep:
            rows.append({"total": total / tokens / 1e3, "output_thread": main / tokens / 1e3,
                         "add_step": add / tokens / 1e3, "record_outputs": rec / tokens / 1e3,
                         "finish": finish / tokens / 1e3, "gc": gc_ns[1] / tokens / 1e3, "gc_runs": gc_ns[0],
                         "decode": dec / tokens / 1e3, "materializer": mat_ns[0] / tokens / 1e3})
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["kept"] = pipeline.counts.requests_kept
    out["steps_emitted"] = pipeline.counts.steps_emitted
    direct = getattr(getattr(getattr(pipeline.spans, "_router", None), "route", None), "direct", None)
    out["spans_sent_direct"] = getattr(getattr(direct, "counts", None), "spans_sent", 0)  # 0: the SDK path
    pipeline.close()
    return out


def encoded(steps: list) -> list[bytes] | None:
    """The step records as the EngineCore sends them (None if this checkout's wire differs)."""
    try:
        from otel_llm.instrumentation.vllm import step_wire

        v2 = getattr(step_wire, "VERSION", 1) >= 2
        return [step_wire.encode((s.step_id, s.start, s.end, s.running, s.waiting, s.preempted, s.kv_cache_usage,
                                  _shares_v2(s) if v2 else [(*sh, c) for sh, c in zip(s.requests, s.contexts)],
                                  s.queue_blocked, s.schedule_s, s.execute_s, s.output_s, s.idle_s, s.model_s))
                for s in steps]
    except Exception:
        return None


def _shares_v2(s: Any) -> tuple:
    """Wire v2's lists for a record's shares: the prefilling ones listed as having no output yet, which
    the decoder reads back as prefill (what a new request's first chunks are)."""
    ids, tokens, prefill = zip(*s.requests) if s.requests else ((), (), ())
    one_each = all(n == 1 for n in tokens)  # the hook sends no token list then (wire flag ONE_EACH)
    return (list(ids), None if one_each else list(tokens), list(s.contexts), [i for i, p in enumerate(prefill) if p],
            [], [], [])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", action="append", help="a checkout whose otel_llm to measure (repeatable)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=5, help="workload repetitions per measurement")
    ap.add_argument("--mode", choices=sorted(MODES), default="default",
                    help="default: instrument() defaults, spans to a null SDK exporter; full: every request at "
                         "full detail, spans by direct export to a discarding OTLP/HTTP sink")
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "frontend_path.json"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.repeat, args.mode, args.endpoint)))
        return
    sink = None
    extra = ["--mode", args.mode]
    if args.mode == "full":
        sys.path.insert(0, str(Path(__file__).parent))
        from vllm_overhead import start_sink

        sink, endpoint = start_sink()
        extra += ["--endpoint", endpoint]
    roots = [str(Path(r).resolve()) for r in (args.root or [str(Path(__file__).resolve().parents[1])])]
    results: dict[str, list[dict]] = {r: [] for r in roots}
    load = [os.getloadavg()[0]]
    for rnd in range(args.rounds):
        order = roots if rnd % 2 == 0 else roots[::-1]
        for root in order:
            env = dict(os.environ, PYTHONPATH=root)
            proc = subprocess.run([sys.executable, __file__, "--child", "--repeat", str(args.repeat), *extra], env=env,
                                  capture_output=True, text=True, cwd=root)
            if proc.returncode:
                sys.exit(f"{root}: {proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results[root].append(res)
            print(f"round {rnd + 1} {root}: " + " ".join(f"{k} {v:.2f}" for k, v in res.items()), flush=True)
        load.append(os.getloadavg()[0])
    if sink is not None:
        sink.terminate()
    summary = {r: {k: round(statistics.median(x[k] for x in results[r]), 3) for k in results[r][0]} for r in roots}
    out = {"workload": f"{N_REQUESTS} requests x {OUTPUT_TOKENS} output tokens, replayed on the frontend path, "
                       + ("instrument() defaults" if args.mode == "default" else "full detail (sample_rate=1.0, "
                          "baseline_detail=steps), direct export to an OTLP/HTTP sink"), "unit": "CPU us per output token",
           "rounds": args.rounds, "repeat_per_measurement": args.repeat,
           "machine": f"{platform.machine()} {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average_1min_per_round": load, "median": summary, "raw": results}
    if len(roots) == 2:
        a, b = roots
        out["paired_b_minus_a"] = {k: round(statistics.median(y[k] - x[k] for x, y in zip(results[a], results[b])), 3)
                                   for k in ("total", "output_thread", "add_step", "record_outputs", "finish", "gc",
                                                     "materializer")}
    for r in roots:
        print(r, summary[r])
    if "paired_b_minus_a" in out:
        print("paired (second - first):", out["paired_b_minus_a"])
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}; load {load}")


if __name__ == "__main__":
    main()
