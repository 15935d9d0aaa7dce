"""EngineCore-side CPU per engine step: today's step hook (before the anatomy) against the hook with anatomy.

The acceptance bound: the anatomy (two more clock reads in the scheduler hooks, the context per
request, the model-runner timers, a longer record on the socket) costs at most 5 us of CPU per
engine step over the previous hook. An engine step takes milliseconds, so this cannot be seen in
end-to-end throughput on a shared 2-core machine; it is measured here directly, on the EngineCore
thread's CPU clock (``time.thread_time_ns``), by driving the real hook code the way vLLM's
EngineCore.step does: ``Scheduler.schedule`` -> ``GPUModelRunner.execute_model`` ->
``sample_tokens`` -> ``Scheduler.update_from_output``, each wrapped exactly as in the engine (wrapt
wrappers from our WrapTable), with scheduler-shaped objects in place of vLLM's and a real datagram
socket to a receiver thread (the frontend). Modes:

    none    no hooks (vLLM alone, with the stand-in methods doing no work)
    before  the step hook as it was before the anatomy (steps.py at BASE_COMMIT), scheduler hooks only
    after   the hook with anatomy, multiprocess executor (vLLM's default on CPU and with tensor
            parallelism): scheduler hooks in the EngineCore; the model-runner timers run in the worker
            process, so they cost the EngineCore nothing
    after_uniproc  the model runner in the EngineCore's thread (UniProcExecutor), on CPU: the timers are
            wrapped but switch themselves off at the first call (execute time is the same wall time)
    after_timed  the model runner in the EngineCore's thread, timed (what a GPU's UniProcExecutor runs,
            minus the CUDA events' own cost, which cannot be measured on this machine)

Run: python benchmarks/step_anatomy_overhead.py [--steps 20000] [--rounds 7]
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
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
BASE_COMMIT = "46ec605"  # main before the anatomy: the hook being compared against
BATCHES = (1, 16, 64, 256)


def load_before() -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{BASE_COMMIT}:otel_llm/instrumentation/vllm/steps.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "steps_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("otel_llm.instrumentation.vllm._steps_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Request:
    __slots__ = ("num_computed_tokens", "num_tokens", "num_output_tokens")

    def __init__(self, computed: int) -> None:
        self.num_computed_tokens, self.num_tokens, self.num_output_tokens = computed, computed, 5


class SchedulerOutput:
    def __init__(self, n: int) -> None:
        self.num_scheduled_tokens = {f"req-{i}-abcdef12": 1 for i in range(n)}  # vLLM-shaped request ids
        self.preempted_req_ids: set[str] = set()
        # what the hooks read since wire version 2 (vLLM's own per-step lists; see engine_hooks_ab.py)
        self.total_num_scheduled_tokens, self.finished_req_ids, self.scheduled_new_reqs = n, set(), []
        ids = list(self.num_scheduled_tokens)
        self.scheduled_cached_reqs = types.SimpleNamespace(
            req_ids=ids, resumed_req_ids=set(), num_computed_tokens=[99 + i for i in range(n)], num_output_tokens=[5] * n)


class EngineCoreOutputs:
    __slots__ = ("timestamp",)

    def __init__(self) -> None:
        self.timestamp = time.monotonic()


class ModelRunnerOutput:  # a dataclass in vLLM: instances have a __dict__
    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids


def make_fake_vllm(n: int) -> tuple[types.ModuleType, types.ModuleType]:
    """Stand-ins for vllm's scheduler and model runner modules: the methods our hooks wrap."""
    out = SchedulerOutput(n)
    runner_out = ModelRunnerOutput(list(out.num_scheduled_tokens))

    class Scheduler:
        def __init__(self) -> None:
            self.requests = {rid: Request(100 + i) for i, rid in enumerate(out.num_scheduled_tokens)}
            self.running, self.waiting = list(self.requests), []
            self.kv_cache_manager = types.SimpleNamespace(usage=0.5)

        def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
            return out

        def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: object) -> dict:
            return {0: EngineCoreOutputs()}

    class GPUModelRunner:
        def execute_model(self, scheduler_output: SchedulerOutput, intermediate_tensors: object = None) -> None:
            return None

        def sample_tokens(self, grammar_output: object) -> ModelRunnerOutput:
            return runner_out

    sched_mod = types.ModuleType("fake_vllm_scheduler")
    sched_mod.Scheduler = Scheduler
    runner_mod = types.ModuleType("fake_vllm_runner")
    runner_mod.GPUModelRunner = GPUModelRunner
    return sched_mod, runner_mod


def run_steps(sched: object, runner: object, steps: int) -> float:
    """CPU ns of this thread per step, for ``steps`` EngineCore.step-shaped iterations."""
    t0 = time.thread_time_ns()
    for _ in range(steps):
        out = sched.schedule()
        runner.execute_model(out)
        model_output = runner.sample_tokens(None)
        sched.update_from_output(out, model_output)
    return (time.thread_time_ns() - t0) / steps


def measure(mode: str, n: int, steps: int, before: types.ModuleType, after: types.ModuleType,
            directory: str) -> float:
    sched_mod, runner_mod = make_fake_vllm(n)
    sys.modules[sched_mod.__name__], sys.modules[runner_mod.__name__] = sched_mod, runner_mod
    mod = before if mode == "before" else after
    hooks = None if mode == "none" else HookSet(mod, mode, sched_mod.__name__, runner_mod.__name__, directory)
    try:
        sched, runner = sched_mod.Scheduler(), runner_mod.GPUModelRunner()
        run_steps(sched, runner, min(steps, 2000))  # warm up (and the sink's first directory scan)
        return run_steps(sched, runner, steps)
    finally:
        if hooks is not None:
            hooks.close()


# The sink the hooks report to: None = a real SocketSink to the receiver thread; a callable replaces
# it (step_wire_cost.py --null-sink: the hooks' own Python work, without the send's syscall noise).
SINK = None


class HookSet:
    """The hooks of one steps.py, wrapped onto the stand-ins and armed with a real SocketSink: the
    current tree's ``StepHooks`` object, or an older commit's module-level wrappers and globals."""

    def __init__(self, mod: types.ModuleType, mode: str, sched_name: str, runner_name: str, directory: str) -> None:
        from otel_llm.instrumentation.wraps import Target, WrapTable

        timed = mode in ("after_uniproc", "after_timed")
        self.mod, self.timed = mod, timed
        self.hooks = hooks = mod.StepHooks() if hasattr(mod, "StepHooks") else None
        if hooks is not None:
            # armed by hand, not with arm(): that would also wrap vLLM's real scheduler on its import
            schedule, update = hooks.schedule, hooks.update_from_output
            execute, sample = hooks.execute_model, hooks.sample_tokens
        else:
            schedule, update = mod._schedule, mod._update_from_output
            execute, sample = (mod._model_timer(False), mod._model_timer(True)) if timed else (None, None)
        targets = [Target(sched_name, "Scheduler.schedule", schedule),
                   Target(sched_name, "Scheduler.update_from_output", update)]
        if timed:
            targets += [Target(runner_name, "GPUModelRunner.execute_model", execute),
                        Target(runner_name, "GPUModelRunner.sample_tokens", sample)]
        self.table = WrapTable(targets)
        self.table.wrap()
        sink = mod.SocketSink(directory) if SINK is None else SINK
        cuda = False if mode == "after_timed" else None
        if hooks is not None:
            hooks.sink = sink
            if timed:
                hooks.timing, hooks.cuda_events = True, cuda
        else:
            mod._sink = sink
            if timed:
                mod._timing, mod._cuda_events = True, cuda

    def close(self) -> None:
        self.table.unwrap()
        if self.hooks is not None:
            self.hooks.sink = None
            self.hooks.timing = False
            return
        mod = self.mod
        mod._sink = None
        mod._pending.clear()
        if self.timed:
            mod._timing = False
            mod._cuda_events = None
            mod._model.clear()


class Frontend(threading.Thread):
    """The receiving end: drains the socket (and the rings handed over it, this tree's transport) so that
    sends succeed as they do in a healthy deployment. Records are counted, not decoded."""

    def __init__(self, directory: str) -> None:
        super().__init__(daemon=True)
        from otel_llm.instrumentation.vllm.steps import StepReceiver

        self.receiver = StepReceiver(directory)
        self.receiver._take = lambda data, deliver, ids=None: self._count()
        self.received = 0
        self.stop = False

    def _count(self) -> None:
        self.received += 1

    def run(self) -> None:
        while not self.stop:
            self.receiver.drain(None)
            time.sleep(0.0005)  # a poll, as a frontend drains before each batch of outputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    from otel_llm.instrumentation.vllm import steps as after

    before = load_before()
    directory = tempfile.mkdtemp(prefix="otel-llm-bench-steps-")
    frontend = Frontend(directory)
    frontend.start()
    modes_all = ["none", "before", "after", "after_uniproc", "after_timed"]
    results: dict[int, dict[str, list[float]]] = {n: {m: [] for m in modes_all} for n in BATCHES}
    for r in range(args.rounds):
        for n in BATCHES:
            modes = list(modes_all)
            if r % 2:
                modes.reverse()  # interleaved, alternating order: drift on a shared machine hits all modes
            for mode in modes:
                results[n][mode].append(measure(mode, n, args.steps // max(1, n // 16), before, after, directory))
    frontend.stop = True
    rows = []
    for n in BATCHES:
        med = {m: statistics.median(v) for m, v in results[n].items()}
        # per-round paired difference (same round, adjacent in time), median over rounds
        diffs = [a - b for a, b in zip(results[n]["after"], results[n]["before"])]
        diffs_uni = [a - b for a, b in zip(results[n]["after_uniproc"], results[n]["before"])]
        diffs_timed = [a - b for a, b in zip(results[n]["after_timed"], results[n]["before"])]
        rows.append({"batch": n, "none_ns": med["none"], "before_ns": med["before"], "after_ns": med["after"],
                     "after_uniproc_ns": med["after_uniproc"],
                     "anatomy_ns": statistics.median(diffs), "anatomy_ns_min": min(diffs),
                     "anatomy_ns_max": max(diffs), "anatomy_uniproc_ns": statistics.median(diffs_uni),
                     "after_timed_ns": med["after_timed"], "anatomy_timed_ns": statistics.median(diffs_timed),
                     # fastest round of each mode: contention on a shared machine only ever adds time
                     "best_ns": {m: min(v) for m, v in results[n].items()},
                     "anatomy_best_ns": min(results[n]["after"]) - min(results[n]["before"]),
                     "anatomy_uniproc_best_ns": min(results[n]["after_uniproc"]) - min(results[n]["before"]),
                     "anatomy_timed_best_ns": min(results[n]["after_timed"]) - min(results[n]["before"])})
    out = {"benchmark": "step_anatomy_overhead", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{platform.machine()} {os.cpu_count()} CPUs (shared; other engineers' jobs running)",
           "python": platform.python_version(), "rounds": args.rounds, "steps": args.steps,
           "base_commit": BASE_COMMIT, "datagrams_received": frontend.received, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "step_anatomy_overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    print("batch | none | before | after (mp) | after (uniproc) | after (timed) | anatomy mp: after - before "
          "[min, max] | anatomy uniproc | anatomy timed   (us of EngineCore CPU per step, medians)")
    for row in rows:
        print(f"{row['batch']:5d} | {row['none_ns'] / 1e3:6.2f} | {row['before_ns'] / 1e3:6.2f} | "
              f"{row['after_ns'] / 1e3:6.2f} | {row['after_uniproc_ns'] / 1e3:6.2f} | "
              f"{row['after_timed_ns'] / 1e3:6.2f} | {row['anatomy_ns'] / 1e3:6.2f} "
              f"[{row['anatomy_ns_min'] / 1e3:.2f}, {row['anatomy_ns_max'] / 1e3:.2f}] | "
              f"{row['anatomy_uniproc_ns'] / 1e3:6.2f} | {row['anatomy_timed_ns'] / 1e3:6.2f}")
    print("fastest round of each mode (contention only adds): before | after (mp) | after (uniproc) | after (timed)"
          " | anatomy mp | anatomy uniproc | anatomy timed")
    for row in rows:
        b = row["best_ns"]
        print(f"{row['batch']:5d} | {b['before'] / 1e3:6.2f} | {b['after'] / 1e3:6.2f} | {b['after_uniproc'] / 1e3:6.2f}"
              f" | {b['after_timed'] / 1e3:6.2f} | {row['anatomy_best_ns'] / 1e3:6.2f} | "
              f"{row['anatomy_uniproc_best_ns'] / 1e3:6.2f} | {row['anatomy_timed_best_ns'] / 1e3:6.2f}")


if __name__ == "__main__":
    main()
