"""EngineCore CPU per engine step added by the step hooks, with the old wire (pickle) and the new one
(step_wire.py: a fixed struct layout with a version byte); and the frontend's CPU to read one record.

Drives the real hook code as vLLM's EngineCore.step does (the harness of step_anatomy_overhead.py:
scheduler-shaped stand-ins, our wrapt wrappers, a real datagram socket drained by a receiver thread),
on the EngineCore thread's CPU clock. Modes, interleaved in alternating order each round:

    none    no hooks
    pickle  the hooks of steps.py at PICKLE_COMMIT (the record pickled onto the socket)
    globals the hooks of steps.py at GLOBALS_COMMIT (struct wire; hook state in module globals, read by
            module-level wrappers)
    struct  the hooks of this tree (the record packed by step_wire.encode; hook state on a StepHooks
            object whose bound methods are the wrappers)

Batch 64 = 64 requests in the step (the tiny test model's max_num_seqs is 4-8; the hook's cost grows
with the batch, not with the model). Run: python benchmarks/step_wire_cost.py [--steps 8000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = ROOT / "benchmarks" / "results"
PICKLE_COMMIT = "1e1c75d"  # the branch's base: steps.py still pickles its records
GLOBALS_COMMIT = "8f51589"  # struct wire, hook state still module globals (before StepHooks)
BATCHES = (16, 64)

import step_anatomy_overhead as harness  # noqa: E402  (the same stand-ins and receiver thread)


def load_steps(commit: str, name: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{commit}:otel_llm/instrumentation/vllm/steps.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"steps_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"otel_llm.instrumentation.vllm._steps_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(mode: str, n: int, steps: int, mods: dict[str, types.ModuleType], directory: str) -> float:
    # the harness's "before" mode = scheduler hooks only, of the module it is given
    if mode == "none":
        return harness.measure("none", n, steps, mods["struct"], mods["struct"], directory)
    return harness.measure("before", n, steps, mods[mode], mods["struct"], directory)


def record(n: int) -> tuple:
    shares = [(f"{i}_cmpl-{i:08x}-abcdef12", 1, False, 100 + i) for i in range(n)]
    return ((1 << 32) | 7, 10.0, 10.01, n, 0, 0, 0.5, shares, 0, 0.001, 0.008, 0.001, 0.0001, None)


def read_cost(n: int, reps: int, old: types.ModuleType) -> dict[str, float]:
    """Frontend CPU ns to turn one datagram into a StepRecord: pickle.loads + decode vs step_wire.decode."""
    from otel_llm.instrumentation.vllm import step_wire

    payload = record(n)
    pickled = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    packed = step_wire.encode(payload)
    out = {}
    for name, fn in (("pickle", lambda: old.decode(pickle.loads(pickled))), ("struct", lambda: step_wire.decode(packed))):
        t0 = time.thread_time_ns()
        for _ in range(reps):
            fn()
        out[name] = (time.thread_time_ns() - t0) / reps
    out["pickle_bytes"], out["struct_bytes"] = len(pickled), len(packed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--null-sink", action="store_true",
                    help="hooks report to a no-op sink (no encode, no send): their own Python work only; "
                         "results in step_wire_cost_null_sink.json")
    args = ap.parse_args()
    from otel_llm.instrumentation.vllm import steps as new

    if args.null_sink:
        harness.SINK = lambda payload: None
    old = load_steps(PICKLE_COMMIT, "pickle")
    mods = {"pickle": old, "globals": load_steps(GLOBALS_COMMIT, "globals"), "struct": new}
    directory = tempfile.mkdtemp(prefix="otel-llm-bench-wire-")
    frontend = harness.Frontend(directory)
    frontend.start()
    modes_all = ["none", "pickle", "globals", "struct"]
    results = {n: {m: [] for m in modes_all} for n in BATCHES}
    reads = {n: {"pickle": [], "struct": []} for n in BATCHES}
    load = os.getloadavg()
    for r in range(args.rounds):
        for n in BATCHES:
            modes = modes_all if r % 2 == 0 else modes_all[::-1]
            for mode in modes:
                results[n][mode].append(measure(mode, n, args.steps, mods, directory))
            rc = read_cost(n, 2000, old)
            for k in ("pickle", "struct"):
                reads[n][k].append(rc[k])
    frontend.stop = True
    rows = []
    for n in BATCHES:
        med = {m: statistics.median(v) for m, v in results[n].items()}
        paired = [s - p for s, p in zip(results[n]["struct"], results[n]["pickle"])]
        paired_obj = [s - g for s, g in zip(results[n]["struct"], results[n]["globals"])]
        rc = read_cost(n, 1, old)
        rows.append({"batch": n, "none_ns": med["none"], "pickle_ns": med["pickle"], "struct_ns": med["struct"],
                     "hooks_pickle_ns": med["pickle"] - med["none"], "hooks_struct_ns": med["struct"] - med["none"],
                     "struct_minus_pickle_ns": statistics.median(paired),
                     "struct_minus_pickle_range_ns": [min(paired), max(paired)],
                     "globals_ns": med["globals"],
                     "object_minus_globals_ns": statistics.median(paired_obj),
                     "object_minus_globals_range_ns": [min(paired_obj), max(paired_obj)],
                     "read_pickle_ns": statistics.median(reads[n]["pickle"]),
                     "read_struct_ns": statistics.median(reads[n]["struct"]),
                     "datagram_bytes": {"pickle": rc["pickle_bytes"], "struct": rc["struct_bytes"]}})
    out = {"benchmark": "step_wire_cost", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{platform.machine()} {os.cpu_count()} CPUs (shared; other engineers' jobs running)",
           "load_average_at_start": load, "load_average_at_end": os.getloadavg(),
           "python": platform.python_version(), "rounds": args.rounds, "steps": args.steps,
           "pickle_commit": PICKLE_COMMIT, "globals_commit": GLOBALS_COMMIT, "datagrams_received": frontend.received, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    out["sink"] = "null" if args.null_sink else "socket"
    (RESULTS / ("step_wire_cost_null_sink.json" if args.null_sink else "step_wire_cost.json")).write_text(json.dumps(out, indent=2) + "\n")
    print(f"load average {load} -> {os.getloadavg()}")
    print("batch | none | hooks+pickle | hooks+struct | hooks cost pickle | hooks cost struct | struct-pickle "
          "(paired) | read pickle | read struct   (us of CPU per step, medians)")
    for r in rows:
        print(f"{r['batch']:5d} | {r['none_ns'] / 1e3:6.2f} | {r['pickle_ns'] / 1e3:6.2f} | {r['struct_ns'] / 1e3:6.2f}"
              f" | {r['hooks_pickle_ns'] / 1e3:6.2f} | {r['hooks_struct_ns'] / 1e3:6.2f} | "
              f"{r['struct_minus_pickle_ns'] / 1e3:6.2f} | {r['read_pickle_ns'] / 1e3:6.2f} | "
              f"{r['read_struct_ns'] / 1e3:6.2f}   bytes {r['datagram_bytes']}")
    print("batch | hooks+globals (module state) | hooks+object (StepHooks) | object-globals (paired median [min, max])")
    for r in rows:
        lo, hi = r["object_minus_globals_range_ns"]
        print(f"{r['batch']:5d} | {r['globals_ns'] / 1e3:6.2f} | {r['struct_ns'] / 1e3:6.2f} | "
              f"{r['object_minus_globals_ns'] / 1e3:6.2f} [{lo / 1e3:.2f}, {hi / 1e3:.2f}]")


if __name__ == "__main__":
    main()
