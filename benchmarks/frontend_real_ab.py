"""The default mode's frontend CPU on a real vLLM engine, two checkouts compared in one run.

Same engine and workload as ``vllm_overhead.py`` (64 requests x 128 output tokens, prompts of 16-72
tokens, offline ``LLM.generate``, tiny model on CPU, EngineCore in its own process). Each checkout runs
in a long-lived child process of its own (two ``otel_llm`` copies cannot share a process: the step
socket is per pid), which builds its engine once; then rounds alternate between the children (order
flipped every round; the other child waits idle on its pipe), and in each round a child measures mode
``none`` (uninstrumented, vLLM's statistics on) and ``default`` (``instrument()`` defaults, spans
through a BatchSpanProcessor to a null exporter) back to back, order flipped too. Per measurement:
the frontend process's CPU per output token (``--repeat`` workloads), and (probes, the same in both
checkouts) the thread CPU inside our code on vLLM's output thread (step drain: receive, decode,
``add_step``; ``record_outputs``; ``_finish``), the materializer thread's CPU and the wall time of
garbage collections (``none_gc`` is vLLM's own).

Reported per checkout: median of per-round paired ``default - none`` (µs/token) and of
``(default - none) / none``: the default's CPU as a share of vLLM's own frontend CPU, the issue's
denominator, measured in the same round. Noisy on a shared 2-core machine: compare the two checkouts'
shares from this one run, not absolute times across runs.

``--mode full``: every request at full detail (``sample_rate=1.0, baseline_detail="steps"``, as
``vllm_overhead.py``'s full mode), spans written as OTLP bytes by direct export through the SDK's
OTLP/HTTP exporter to a discarding sink process (one for the run); the direct exporter's sender thread
(``sender``: joining the batch, the HTTP post) is probed too. ``probes`` sums the thread-CPU probes;
``probe_share`` = (probes + the collections' wall time the mode adds over ``none``) / ``none``: our
code's CPU per token as a share of vLLM's own frontend CPU per token in the same round. One ``--root``
measures one checkout.

Run: /work/bin/wtpy benchmarks/frontend_real_ab.py --root /tmp/main-src --root . [--rounds 6] [--mode full]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


MODES = {"default": {}, "full": {"sample_rate": 1.0, "baseline_detail": "steps"}}  # as vllm_overhead.py's
PROBES = ("drain", "record_outputs", "finish", "materializer", "sender")  # thread CPU inside our code, summed


def child(repeat: int, mode_name: str = "default", endpoint: str | None = None) -> None:
    """Build the engine, then measure one round per line read from stdin (``none,<mode>`` order)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.engine import engine_args, prepare_env
    prepare_env()
    os.environ.pop("OTEL_LLM_STEP_DIR", None)
    from vllm import LLM, SamplingParams

    import otel_llm
    from otel_llm.instrumentation.vllm import VLLMInstrumentor
    from vllm_overhead import providers

    tp, mp = providers(endpoint)  # full mode: an OTLP exporter to the discarding sink
    options = MODES[mode_name]
    otel_llm.instrument(tracer_provider=tp, meter_provider=mp)  # vLLM's statistics on, the step hooks armed
    llm = LLM(**engine_args(max_num_seqs=64, max_num_batched_tokens=512))
    otel_llm.uninstrument()
    prompts = [{"prompt_token_ids": [5 + (i * 31 + j) % 400 for j in range(16 + (i % 8) * 8)]} for i in range(64)]
    params = SamplingParams(max_tokens=128, ignore_eos=True, temperature=0.0)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    tokens = repeat * 64 * 128
    parts = _probe()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        order = line.strip().split(",")
        out = {}
        for mode in order:
            if mode != "none":
                otel_llm.instrument(tracer_provider=tp, meter_provider=mp, **options)
                r = VLLMInstrumentor().step_receiver
                if r is not None:  # records of the uninstrumented workloads (none are sent then, but to be sure)
                    r.drain(lambda s: None)
            parts.reset()
            c0 = time.process_time()
            for _ in range(repeat):
                llm.generate(prompts, params, use_tqdm=False)
            if mode != "none":
                otel_llm.flush()
                telemetry = VLLMInstrumentor().telemetry
                out["steps_per_workload"] = telemetry.counts.steps_recorded / repeat
                out["kept_per_workload"] = telemetry.counts.requests_kept / repeat
                direct = _direct(telemetry)
                out["spans_sent_direct_per_workload"] = (direct.counts.spans_sent if direct else 0) / repeat
                th = telemetry.materializer._thread
                parts.ns["materializer"] = time.clock_gettime_ns(time.pthread_getcpuclockid(th.ident)) - parts.mat0
            out[mode] = (time.process_time() - c0) / tokens * 1e6
            out.update({f"{mode}_{k}": v / tokens / 1e3 for k, v in parts.ns.items()})
            if mode != "none":
                out["probes"] = sum(out[f"{mode}_{k}"] for k in PROBES if f"{mode}_{k}" in out)
                # how many spans a request gets depends on its timing (stalls are kept as rows), which load
                # changes: the background threads' CPU per span sent compares checkouts whatever the count
                sent = out["spans_sent_direct_per_workload"] * repeat
                if sent:
                    out["background_us_per_span"] = (parts.ns["materializer"] + parts.ns["sender"]) / sent / 1e3
                otel_llm.uninstrument()
        print(json.dumps(out), flush=True)


def _direct(telemetry):
    """The pipeline's direct exporter (None: spans go through the SDK)."""
    return getattr(getattr(getattr(telemetry.spans, "_router", None), "route", None), "direct", None)


class _Parts:
    """Thread CPU inside our code on vLLM's output thread (step drain, output stamps, finish), the
    materializer thread's CPU, and the wall time of garbage collections, per measurement."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.mat0 = 0

    def reset(self) -> None:
        self.ns = {"drain": 0, "record_outputs": 0, "finish": 0, "gc": 0, "sender": 0}
        self.mat0 = 0
        try:
            from otel_llm.instrumentation.vllm import VLLMInstrumentor
            th = VLLMInstrumentor().telemetry.materializer._thread
            self.mat0 = time.clock_gettime_ns(time.pthread_getcpuclockid(th.ident))
        except Exception:
            pass


def _probe() -> _Parts:
    import gc

    from otel_llm.instrumentation.vllm import steps, wrappers
    parts = _Parts()
    tt = time.thread_time_ns

    def timed(name, f):
        def g(*a, **k):
            t0 = tt()
            try:
                return f(*a, **k)
            finally:
                parts.ns[name] += tt() - t0
        return g
    steps.StepReceiver.drain = timed("drain", steps.StepReceiver.drain)
    wrappers.record_outputs = timed("record_outputs", wrappers.record_outputs)
    wrappers.VLLMWrappers._finish = timed("finish", wrappers.VLLMWrappers._finish)
    try:  # the direct exporter's sender thread: joining the batch, the exporter's HTTP post
        from otel_llm.otlp import direct_export
        direct_export.DirectExport._send = timed("sender", direct_export.DirectExport._send)
    except ImportError:
        pass
    started = [0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter_ns()
        elif "gc" in parts.ns:
            parts.ns["gc"] += time.perf_counter_ns() - started[0]
    gc.callbacks.append(on_gc)
    parts.reset()
    return parts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", action="append", default=[], help="a checkout to measure (twice: A and B)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2, help="workloads per measurement")
    ap.add_argument("--mode", choices=sorted(MODES), default="default",
                    help="default: instrument() defaults, spans to a null SDK exporter; full: every request at "
                         "full detail, spans by direct export to a discarding OTLP/HTTP sink process")
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="default: results/frontend_real_ab.json (full: _full.json)")
    args = ap.parse_args()
    if args.child:
        child(args.repeat, args.mode, args.endpoint)
        return
    out_path = args.out or str(RESULTS / ("frontend_real_ab.json" if args.mode == "default" else "frontend_real_ab_full.json"))
    extra = ["--mode", args.mode]
    sink = None
    if args.mode == "full":  # one sink process for the run, shared by the children
        sys.path.insert(0, str(Path(__file__).parent))
        from vllm_overhead import start_sink

        sink, endpoint = start_sink()
        extra += ["--endpoint", endpoint]
    roots = [str(Path(r).resolve()) for r in (args.root or [str(Path(__file__).resolve().parents[1])])]
    procs = {}
    for root in roots:
        env = dict(os.environ, PYTHONPATH=root)
        procs[root] = subprocess.Popen([sys.executable, __file__, "--child", "--repeat", str(args.repeat), *extra],
                                       env=env, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for root, p in procs.items():  # engines built one after the other finish in turn
        for line in p.stdout:
            if line.startswith("{") and "ready" in line:
                break
        else:
            sys.exit(f"{root}: child ended before its engine was ready")
    rows: dict[str, list[dict]] = {r: [] for r in roots}
    load = [os.getloadavg()[0]]
    try:
        for rnd in range(args.rounds):
            for root in (roots if rnd % 2 == 0 else roots[::-1]):
                p = procs[root]
                p.stdin.write((f"none,{args.mode}" if rnd % 2 == 0 else f"{args.mode},none") + "\n")
                p.stdin.flush()
                line = p.stdout.readline()
                while line and not line.startswith("{"):
                    line = p.stdout.readline()
                res = json.loads(line)
                res["over"] = res[args.mode] - res["none"]
                res["share"] = res["over"] / res["none"]  # whole process: noisy
                # collections' wall time our mode adds (the probes' threads may count part of it too)
                res["gc_extra"] = res[f"{args.mode}_gc"] - res["none_gc"]
                # our code's CPU over vLLM's own frontend CPU, the same round
                res["probe_share"] = (res["probes"] + res["gc_extra"]) / res["none"]
                rows[root].append(res)
                print(f"round {rnd + 1} {root}: " + " ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)
            load.append(os.getloadavg()[0])
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=120)
        if sink is not None:
            sink.terminate()
    summary = {r: {k: round(statistics.median(x[k] for x in rows[r]), 4) for k in rows[r][0]} for r in roots}
    out = {"workload": "64 requests x 128 output tokens per workload, offline LLM.generate, tiny model, CPU, "
                       "EngineCore in its own process", "mode": args.mode + (
                           " (sample_rate=1.0, baseline_detail=steps; direct export over OTLP/HTTP to a discarding "
                           "sink process)" if args.mode == "full" else " (instrument() defaults, null SDK exporter)"),
           "probes": list(PROBES), "share_of": "probe_share = (probes + gc_extra) / none: our code's CPU per token "
                                                "over vLLM's own frontend CPU per token, same round", "unit": "frontend process CPU us per output token",
           "rounds": args.rounds, "repeat_per_measurement": args.repeat, "date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": f"{os.cpu_count()} cores, shared", "load_average_1min_per_round": load,
           "median": summary, "raw": rows}
    if len(roots) == 2:
        a, b = roots
        out["paired_b_minus_a_over"] = round(statistics.median(
            y["over"] - x["over"] for x, y in zip(rows[a], rows[b])), 3)
        out["paired_b_minus_a_probes"] = round(statistics.median(
            y["probes"] - x["probes"] for x, y in zip(rows[a], rows[b])), 3)
        out["paired_b_minus_a_probe_share"] = round(statistics.median(
            y["probe_share"] - x["probe_share"] for x, y in zip(rows[a], rows[b])), 4)
    for r in roots:
        print(r, summary[r])
    Path(out_path).write_text(json.dumps(out, indent=1))
    print(f"wrote {out_path}; load {load}")


if __name__ == "__main__":
    main()
