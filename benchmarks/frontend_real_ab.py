"""The default mode's frontend CPU on a real vLLM engine, two checkouts compared in one run.

Same engine and workload as ``vllm_overhead.py`` (64 requests x 128 output tokens, prompts of 16-72
tokens, offline ``LLM.generate``, tiny model on CPU, EngineCore in its own process). Each checkout runs
in a long-lived child process of its own (two ``otel_llm`` copies cannot share a process: the step
socket is per pid), which builds its engine once; then rounds alternate between the children (order
flipped every round; the other child waits idle on its pipe), and in each round a child measures mode
``none`` (uninstrumented, vLLM's statistics on) and ``default`` (``instrument()`` defaults, spans
through a BatchSpanProcessor to a null exporter) back to back, order flipped too. Per measurement:
the frontend process's CPU per output token (``--repeat`` workloads).

Reported per checkout: median of per-round paired ``default - none`` (µs/token) and of
``(default - none) / none``: the default's CPU as a share of vLLM's own frontend CPU, the issue's
denominator, measured in the same round. Noisy on a shared 2-core machine: compare the two checkouts'
shares from this one run, not absolute times across runs.

Run: /work/bin/wtpy benchmarks/frontend_real_ab.py --root /tmp/main-src --root . [--rounds 6]
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


def child(repeat: int) -> None:
    """Build the engine, then measure one round per line read from stdin (``none,default`` order)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.engine import engine_args, prepare_env
    prepare_env()
    os.environ.pop("OTEL_LLM_STEP_DIR", None)
    from vllm import LLM, SamplingParams

    import otel_llm
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    class Null(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(Null()))
    mp = MeterProvider()
    otel_llm.instrument(tracer_provider=tp, meter_provider=mp)  # vLLM's statistics on, the step hooks armed
    llm = LLM(**engine_args(max_num_seqs=64, max_num_batched_tokens=512))
    otel_llm.uninstrument()
    prompts = [{"prompt_token_ids": [5 + (i * 31 + j) % 400 for j in range(16 + (i % 8) * 8)]} for i in range(64)]
    params = SamplingParams(max_tokens=128, ignore_eos=True, temperature=0.0)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    tokens = repeat * 64 * 128
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        order = line.strip().split(",")
        out = {}
        for mode in order:
            if mode == "default":
                otel_llm.instrument(tracer_provider=tp, meter_provider=mp)
                r = VLLMInstrumentor().step_receiver
                if r is not None:  # records of the uninstrumented workloads (none are sent then, but to be sure)
                    r.drain(lambda s: None)
            c0 = time.process_time()
            for _ in range(repeat):
                llm.generate(prompts, params, use_tqdm=False)
            if mode == "default":
                otel_llm.flush()
            out[mode] = (time.process_time() - c0) / tokens * 1e6
            if mode == "default":
                otel_llm.uninstrument()
        print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", action="append", default=[], help="a checkout to measure (twice: A and B)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2, help="workloads per measurement")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "frontend_real_ab.json"))
    args = ap.parse_args()
    if args.child:
        child(args.repeat)
        return
    roots = [str(Path(r).resolve()) for r in args.root]
    procs = {}
    for root in roots:
        env = dict(os.environ, PYTHONPATH=root)
        procs[root] = subprocess.Popen([sys.executable, __file__, "--child", "--repeat", str(args.repeat)], env=env,
                                       cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
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
                p.stdin.write(("none,default" if rnd % 2 == 0 else "default,none") + "\n")
                p.stdin.flush()
                line = p.stdout.readline()
                while line and not line.startswith("{"):
                    line = p.stdout.readline()
                res = json.loads(line)
                res["over"] = res["default"] - res["none"]
                res["share"] = res["over"] / res["none"]
                rows[root].append(res)
                print(f"round {rnd + 1} {root}: " + " ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)
            load.append(os.getloadavg()[0])
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=120)
    summary = {r: {k: round(statistics.median(x[k] for x in rows[r]), 4) for k in rows[r][0]} for r in roots}
    out = {"workload": "64 requests x 128 output tokens per workload, offline LLM.generate, tiny model, CPU, "
                       "EngineCore in its own process", "unit": "frontend process CPU us per output token",
           "rounds": args.rounds, "repeat_per_measurement": args.repeat, "date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": f"{os.cpu_count()} cores, shared", "load_average_1min_per_round": load,
           "median": summary, "raw": rows}
    if len(roots) == 2:
        a, b = roots
        out["paired_b_minus_a_over"] = round(statistics.median(
            y["over"] - x["over"] for x, y in zip(rows[a], rows[b])), 3)
    for r in roots:
        print(r, summary[r])
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}; load {load}")


if __name__ == "__main__":
    main()
