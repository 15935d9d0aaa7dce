"""Where the step drain's thread CPU goes on the real engine (vLLM's output thread, default mode).

Same engine and workload as ``frontend_real_ab.py`` (64 requests x 128 output tokens, offline
``LLM.generate``, tiny model on CPU, EngineCore in its own process), one checkout (``PYTHONPATH``).
``StepReceiver._drain`` is replaced by a copy of itself with thread-CPU stamps between its parts
(the socket: its poll and, when something waits, the receive loop; each ring's read; ``step_wire.decode``;
the delivery to ``Pipeline.add_step``; keep the copy in step with ``_drain`` when that changes), and the
drain is also timed whole with no inner stamps in alternate
workloads, to see what the stamps themselves cost (each ``thread_time_ns`` is a syscall, ~0.8 µs
here). Per drain it keeps the parts, records and tokens; collections that ran inside a drain are
counted with their wall time. Reported per output token and per drain, with the distribution of
whole-drain times (median vs mean: are a few drains most of it?).

Run: /work/bin/wtpy benchmarks/drain_probe.py [--repeat 2] [--out results/drain_probe.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2, help="workloads per probe setting (fine, then coarse, twice)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.path.insert(0, str(Path(__file__).parent))
    from support.engine import engine_args, prepare_env
    prepare_env()
    os.environ.pop("OTEL_LLM_STEP_DIR", None)
    from vllm import LLM, SamplingParams

    import otel_llm
    from otel_llm.instrumentation.vllm import VLLMInstrumentor, step_ring, step_wire, steps
    from otel_llm.core import pipeline as pipeline_mod
    from otel_llm.guard import GUARD
    from vllm_overhead import providers

    tp, mp = providers(None)
    otel_llm.instrument(tracer_provider=tp, meter_provider=mp)
    llm = LLM(**engine_args(max_num_seqs=64, max_num_batched_tokens=512))
    otel_llm.uninstrument()
    prompts = [{"prompt_token_ids": [5 + (i * 31 + j) % 400 for j in range(16 + (i % 8) * 8)]} for i in range(64)]
    params = SamplingParams(max_tokens=128, ignore_eos=True, temperature=0.0)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    tokens = args.repeat * 64 * 128

    tt = time.thread_time_ns
    pc = time.perf_counter_ns
    state = {"fine": True, "in_drain": False, "gc_in_drain": 0, "gc_in_drain_ns": 0, "gc_start": 0}
    drains: list[tuple] = []  # (total, recv, ring, decode, deliver, records, tokens, recv_calls)
    submits = [0, 0]  # _submit_step_metrics calls and their thread ns (inside deliver)

    def on_gc(phase, info):
        if not state["in_drain"]:
            return
        if phase == "start":
            state["gc_start"] = pc()
        else:
            state["gc_in_drain"] += 1
            state["gc_in_drain_ns"] += pc() - state["gc_start"]
    gc.callbacks.append(on_gc)

    def fine_drain(self, deliver):
        # steps.StepReceiver._drain, with stamps between its parts (same behaviour)
        t0 = tt()
        calls = 0
        n_rec = n_tok = 0
        dec = dlv = 0
        if self._poll.poll(0):
            calls += 1
            self._receive(deliver)
        t1 = tt()
        ring_ns = 0
        fast = step_wire.ring_read
        for ring in self.rings.values():
            a = tt()
            try:
                records = fast(ring) if fast is not None else None
                if records is None:
                    records = ring.read()
            except step_ring.RingError as exc:
                self.malformed += 1
                GUARD.failed("step ring", exc)
                records = exc.args[1]
            b = tt()
            ring_ns += b - a
            ids = ring.ids
            for data in records:
                c = tt()
                try:
                    step = step_wire.decode(data, ids)
                except (step_wire.WireError, ValueError) as exc:
                    self.malformed += 1
                    GUARD.failed("step record wire", exc)
                    continue
                d = tt()
                try:
                    deliver(step)
                except Exception as exc:
                    self.failed += 1
                    GUARD.failed("step record", exc)
                e = tt()
                dec += d - c
                dlv += e - d
                n_rec += 1
                n_tok += len(step.ids) if step.tokens is None else sum(step.tokens)
        t2 = tt()
        drains.append((t2 - t0, t1 - t0, ring_ns, dec, dlv, n_rec, n_tok, calls))

    original = steps.StepReceiver._drain

    def drain(self, deliver):
        with self._lock:
            state["in_drain"] = True
            try:
                if state["fine"]:
                    fine_drain(self, deliver)
                else:
                    t0 = tt()
                    original(self, deliver)
                    drains.append((tt() - t0, 0, 0, 0, 0, 0, 0, 0))
            finally:
                state["in_drain"] = False
    steps.StepReceiver.drain = drain

    submit = pipeline_mod.Pipeline._submit_step_metrics

    def timed_submit(self):
        t0 = tt()
        submit(self)
        submits[0] += 1
        submits[1] += tt() - t0
    pipeline_mod.Pipeline._submit_step_metrics = timed_submit

    rows = []
    for fine in (True, False, True, False):
        state["fine"] = fine
        otel_llm.instrument(tracer_provider=tp, meter_provider=mp)
        r = VLLMInstrumentor().step_receiver
        drains.clear()
        submits[:] = [0, 0]
        state["gc_in_drain"] = state["gc_in_drain_ns"] = 0
        c0 = time.process_time()
        for _ in range(args.repeat):
            llm.generate(prompts, params, use_tqdm=False)
        cpu = (time.process_time() - c0) / tokens * 1e6
        telemetry = VLLMInstrumentor().telemetry
        recorded = telemetry.counts.steps_recorded
        otel_llm.uninstrument()
        totals = [d[0] for d in drains]
        row = {"probes": "fine" if fine else "coarse (drain whole only)", "process_cpu_us_per_token": round(cpu, 3),
               "drains": len(drains), "steps_recorded": recorded,
               "drain_us_per_token": round(sum(totals) / tokens / 1e3, 4),
               "drain_us_mean": round(statistics.fmean(totals) / 1e3, 2),
               "drain_us_median": round(statistics.median(totals) / 1e3, 2),
               "drain_us_p90": round(sorted(totals)[int(0.9 * len(totals))] / 1e3, 2),
               "drain_us_max": round(max(totals) / 1e3, 1),
               "top10pct_share_of_drain_cpu": round(sum(sorted(totals)[int(0.9 * len(totals)):]) / max(1, sum(totals)), 3),
               "gc_in_drain": state["gc_in_drain"], "gc_in_drain_wall_us_per_token": round(state["gc_in_drain_ns"] / tokens / 1e3, 4),
               "submit_step_metrics_calls": submits[0],
               "submit_step_metrics_us_per_token": round(submits[1] / tokens / 1e3, 4)}
        if fine:
            n = len(drains)
            row.update({
                "recv_us_per_token": round(sum(d[1] for d in drains) / tokens / 1e3, 4),
                "ring_read_us_per_token": round(sum(d[2] for d in drains) / tokens / 1e3, 4),
                "decode_us_per_token": round(sum(d[3] for d in drains) / tokens / 1e3, 4),
                "add_step_us_per_token": round(sum(d[4] for d in drains) / tokens / 1e3, 4),
                "recv_us_per_drain_median": round(statistics.median(d[1] for d in drains) / 1e3, 2),
                "ring_read_us_per_drain_median": round(statistics.median(d[2] for d in drains) / 1e3, 2),
                "decode_us_per_record_median": round(statistics.median(d[3] / d[5] for d in drains if d[5]) / 1e3, 2),
                "add_step_us_per_record_median": round(statistics.median(d[4] / d[5] for d in drains if d[5]) / 1e3, 2),
                "add_step_us_per_record_mean": round(sum(d[4] for d in drains) / max(1, sum(d[5] for d in drains)) / 1e3, 2),
                "records": sum(d[5] for d in drains), "drains_with_no_record": sum(1 for d in drains if not d[5]),
                "tokens_in_records": sum(d[6] for d in drains), "recv_calls_per_drain": sum(d[7] for d in drains) / max(1, n),
            })
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"workload": "64 requests x 128 output tokens, offline LLM.generate, tiny model, CPU, EngineCore in its own "
                       "process; instrument() defaults", "output_tokens_per_measurement": tokens,
           "thread_time_ns_cost_ns": _stamp_cost(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average_1min": os.getloadavg()[0], "rows": rows}
    path = args.out or str(RESULTS / "drain_probe.json")
    Path(path).write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


def _stamp_cost() -> float:
    tt = time.thread_time_ns
    t = time.perf_counter_ns()
    for _ in range(20000):
        tt()
    return round((time.perf_counter_ns() - t) / 20000, 1)


if __name__ == "__main__":
    main()
