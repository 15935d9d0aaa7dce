"""EngineCore CPU per engine step added by the step hooks, and the frontend's CPU per step record.

    .venv/bin/python benchmarks/engine_step_hooks.py [--rounds 9] [--steps 400] [--batch 64] [--new 0]

The harness: a stand-in ``Scheduler`` class whose ``schedule`` and ``update_from_output`` return at once,
wrapped by the hooks through a ``WrapTable`` as the plugin wraps vLLM's (``StepHooks.targets``: the C hook
methods where built, so the method call is in the figure), timed on the thread's CPU clock. The scheduler
output is vLLM's real ``CachedRequestData`` for ``--batch`` decoding requests with vLLM-shaped ids, plus
``--new`` new requests (prefill chunks). One frontend (a real ``StepReceiver``, its records counted, not
decoded) is drained between steps, untimed. Each round runs the modes in slices of 25 steps, reshuffled per
slice, so a burst of interference from other processes hits every mode alike; medians of per-round medians.
Modes:

    bare             the stand-ins alone, unwrapped
    wrap             the same through plain Python wrappers that only call through (the Python methods' wrapping)
    hooks            the hooks and SocketSink as users get them: a shared-memory ring where available, the C
                     hook methods (_hooks_fast.c) and the C encoder (_step_fast.c) where built
    hooks_py         the same in Python alone (the fallback: no compiler; the encoder also off x86-64)
    hooks_pymethods  the Python hook methods with the C encoder
    hooks_dgram      ``hooks`` with rings off (one datagram a step)
    encode           the hooks, the record encoded but not sent
    hook_only        the hooks, the record handed to a no-op (their own work and the method call)
    hooks_lora       ``hooks`` on a step of an engine serving LoRA: every request with one of 4 adapters
    hooks_spec       ``hooks`` on a verify step: every request with 3 draft tokens, 2 accepted

(``hooks`` is the step with both off.) The model runner's side, per call, in the process where it runs
(``worker_ns``): the LoRA hook around ``add_adapter`` (once per adapter of a LoRA batch, no load), the
drafter's timer around ``propose_draft_token_ids`` (once per step with speculation), and the model
timer's hand-over of them with the step's output.

So ``hooks - bare`` is what a step costs the EngineCore (``per_step_over_bare``: each mode over the bare
stand-in of the same slice, the median over slices: the figure to compare across runs and trees); ``hooks - encode`` the ring transport,
``encode - hook_only`` the encoding, ``hook_only - bare`` the hooks' own work. Frontend side, per record: decoding a full record and the next
record of a steady batch (its ids left out), and taking a record off the ring and off a datagram socket.
Writes benchmarks/results/engine_step_hooks.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/support: test helpers, not shipped
RESULTS = ROOT / "benchmarks" / "results"
SLICE = 25  # steps per mode per slice of a round
MODES = ("bare", "wrap", "hooks", "hooks_py", "hooks_pymethods", "hooks_dgram", "encode", "hook_only", "hooks_lora",
         "hooks_spec")
ADAPTERS, DRAFTS, ACCEPTED = 4, 3, 2  # the LoRA and speculative cases


class Scene:
    """One step's worth of stand-ins: what the hooks read of vLLM's scheduler and its output."""

    def __init__(self, batch: int, new: int, lora: bool = False, spec: bool = False) -> None:
        from vllm.v1.core.sched.output import CachedRequestData
        from vllm.v1.engine import EngineCoreOutput

        ids = [f"cmpl-{random.getrandbits(128):032x}-0" for _ in range(batch + new)]
        decoding, fresh = ids[:batch], ids[batch:]
        prompt, outputs, chunk = 96, 5, 32

        adapters = [types.SimpleNamespace(lora_int_id=1 + i, lora_name=f"adapter-{i}") for i in range(ADAPTERS)]

        class Req:  # the scheduler's Request right after schedule(): num_computed_tokens advanced
            __slots__ = ("num_computed_tokens", "num_tokens", "num_output_tokens", "num_prompt_tokens",
                         "lora_request")
            made = 0

            def __init__(self, computed: int, outs: int) -> None:
                self.num_computed_tokens, self.num_output_tokens = computed, outs
                self.num_tokens, self.num_prompt_tokens = prompt + outs, prompt
                self.lora_request = adapters[Req.made % ADAPTERS] if lora else None
                Req.made += 1

        class Waiting(list):
            def peek_request(self) -> Any:
                return self[0]

        requests = {r: Req(prompt + outputs, outputs) for r in decoding}
        requests.update({r: Req(chunk, 0) for r in fresh})
        cached = CachedRequestData.make_empty()
        cached.req_ids = list(decoding)
        cached.num_computed_tokens = [prompt + outputs - 1] * batch
        cached.num_output_tokens = [outputs] * batch
        self.scheduler = types.SimpleNamespace(
            requests=requests, running=list(range(batch + new)), waiting=Waiting(),
            kv_cache_manager=types.SimpleNamespace(usage=0.5), max_num_running_reqs=256, max_num_active_reqs=256,
            max_num_scheduled_tokens=8192, num_sampled_tokens_per_step=1,
            lora_config=types.SimpleNamespace(max_loras=ADAPTERS) if lora else None)
        scheduled = dict.fromkeys(decoding, 1 + DRAFTS if spec else 1)
        scheduled.update(dict.fromkeys(fresh, chunk))
        self.out = types.SimpleNamespace(
            num_scheduled_tokens=scheduled, preempted_req_ids=set(), finished_req_ids=set(), num_invalid_spec_tokens=None,
            total_num_scheduled_tokens=sum(scheduled.values()), scheduled_cached_reqs=cached,
            scheduled_spec_decode_tokens={r: [9] * DRAFTS for r in decoding} if spec else {},
            scheduled_new_reqs=[types.SimpleNamespace(req_id=r, num_computed_tokens=0, prompt_len=prompt,
                                                      prefill_token_ids=None) for r in fresh])
        self.outputs = {0: types.SimpleNamespace(timestamp=0.0, outputs=[
            EngineCoreOutput(request_id=r, new_token_ids=[7]) for r in decoding])}
        self.model_output = types.SimpleNamespace()
        if spec:  # each request: its 2 accepted drafts and the target's own token
            self.model_output = types.SimpleNamespace(sampled_token_ids=[[7] * (1 + ACCEPTED)] * batch,
                                                      req_id_to_index={r: i for i, r in enumerate(decoding)})


class Wired:
    """A stand-in ``Scheduler`` class in a module of its own, its two methods wrapped as the plugin wraps
    vLLM's (plain-function wrappers from a ``WrapTable``)."""

    made = 0

    def __init__(self, targets: Callable[[str], list] | None, scene: Scene) -> None:
        Wired.made += 1
        name = f"_engine_step_hooks_{Wired.made}"
        module = types.ModuleType(name)
        out, outputs = scene.out, scene.outputs

        class Scheduler:
            def schedule(self) -> Any:
                return out

            def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
                return outputs

        Scheduler.__module__ = name
        module.Scheduler = Scheduler
        sys.modules[name] = module
        self.scheduler = Scheduler()
        self.scheduler.__dict__.update(vars(scene.scheduler))
        if targets is not None:  # as the hooks wrap vLLM's (StepHooks.targets), or plain wrappers
            from otel_llm.guard import Guard
            from otel_llm.instrumentation.wraps import WrapTable
            WrapTable(targets(name), Guard()).wrap()


def steps_ns(wired: Wired, scene: Scene, steps: int, drain: Callable[[], None]) -> list[int]:
    """Thread CPU of each of ``steps`` steps, ns."""
    out, model_output, scheduler = scene.out, scene.model_output, wired.scheduler
    clock = time.thread_time_ns
    taken = []
    for _ in range(steps):
        c0 = clock()
        scheduler.schedule()
        scheduler.update_from_output(out, model_output)
        taken.append(clock() - c0)
        drain()
    return taken


def worker_ns(n: int = 20000) -> dict:
    """The model runner's side, ns per call: the LoRA hook around a stand-in ``add_adapter`` (the adapter
    cached: no load), the drafter's timer around a stand-in ``propose_draft_token_ids``, each against the
    stand-in unwrapped; and the model timer's check for facts to hand over with an output (none pending,
    then one drafter time pending), against the output's model time alone."""
    from otel_llm.instrumentation.vllm.model_timing import ModelTimer
    from otel_llm.instrumentation.vllm.worker_facts import WorkerFacts
    from otel_llm.instrumentation.wraps import Target, WrapTable

    def stand_ins(tag: str) -> Any:
        name = f"_engine_step_worker_{tag}"
        module = types.ModuleType(name)

        class Runner:
            device = types.SimpleNamespace(type="cpu")

            def add_adapter(self, lora_request: Any) -> bool:
                return False

            def propose_draft_token_ids(self, *a: Any) -> Any:
                return None

        Runner.__module__ = name
        module.Runner = Runner
        sys.modules[name] = module
        return name, Runner

    _, bare = stand_ins("bare")
    name, wrapped = stand_ins("wrapped")
    facts = WorkerFacts()
    WrapTable([Target(name, "Runner.add_adapter", facts.add_adapter, plain=True),
               Target(name, "Runner.propose_draft_token_ids", facts.propose, plain=True)], facts.guard).wrap()
    request = types.SimpleNamespace(lora_int_id=1)
    b, w = bare(), wrapped()
    timer = ModelTimer()
    timer.timing, timer.cuda_events = True, False

    def run_model(pending: bool) -> Callable[[], None]:
        out = types.SimpleNamespace(req_ids=["r"])
        key = id(out)

        def call() -> None:
            timer.current_model_step = key
            if pending:
                facts.pending, facts.draft_s = True, 1e-4
            timer._time_model(True, lambda o: o, None, (out,), {})
        return call

    cases = {
        "add_adapter_bare": lambda: b.add_adapter(request),
        "add_adapter_hooked": lambda: w.add_adapter(request),
        "propose_bare": lambda: b.propose_draft_token_ids(),
        "propose_hooked": lambda: w.propose_draft_token_ids(),
        "output_nothing_pending": run_model(False),
        "output_drafter_time_pending": run_model(True),
    }
    timer.facts = facts
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(9):
        order = list(cases)
        random.shuffle(order)
        for k in order:
            fn = cases[k]
            c0 = time.thread_time_ns()
            for _ in range(n):
                fn()
            samples[k].append((time.thread_time_ns() - c0) / n)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"lora_add_adapter_hook_ns": round(med["add_adapter_hooked"] - med["add_adapter_bare"]),
            "drafter_timer_ns": round(med["propose_hooked"] - med["propose_bare"]),
            "output_hand_over_ns": round(med["output_drafter_time_pending"] - med["output_nothing_pending"]),
            "ns_per_call": {k: round(v) for k, v in med.items()}}


def next_step(payload: Any) -> Any:
    """The same step record one step later (a steady batch): a named record, or the positional tuple."""
    if hasattr(payload, "_replace"):
        return payload._replace(step_id=payload.step_id + 1)
    return (payload[0] + 1, *payload[1:])


def decode_ns(step_wire: Any, payload: Any, n: int = 2000) -> dict:
    """Frontend CPU to turn one encoded record into a step record: a full one, and the next record of a
    steady batch, whose ids are left out (decoded with the cache of the record before)."""
    sender = step_wire.sender_cache()  # as SocketSink keeps it, every frontend on a ring
    full = step_wire.encode(payload, sender, True)
    same = step_wire.encode(next_step(payload), sender, True)
    if len(same) >= len(full):
        raise SystemExit("the steady batch's record did not leave its ids out: the harness no longer matches "
                         "step_wire's protocol")
    reader = step_wire.reader_cache()  # as StepReceiver keeps it
    step_wire.decode(full, reader)

    def decode_full(cache: list = step_wire.reader_cache()) -> None:  # noqa: B008 (one cache, on purpose)
        step_wire.decode(full, cache)

    def decode_same() -> None:
        step_wire.decode(full, reader)  # the record before, then this one: as a frontend reads them
        step_wire.decode(same, reader)

    samples: dict[str, list[float]] = {"full": [], "full_then_same": []}
    cases = (("full", decode_full), ("full_then_same", decode_same))
    for r in range(9):
        for name, fn in cases if r % 2 else cases[::-1]:
            c0 = time.thread_time_ns()
            for _ in range(n):
                fn()
            samples[name].append((time.thread_time_ns() - c0) / n)
    full_ns = statistics.median(samples["full"])
    return {"full_ns": round(full_ns), "same_ids_ns": round(statistics.median(samples["full_then_same"]) - full_ns),
            "full_bytes": len(full), "same_ids_bytes": len(same)}


def drain_ns(transport: Any, payload: Any, n: int = 2000) -> dict:
    """Frontend CPU to take one record off its transport (``StepReceiver.drain``, decoding left out),
    ring against datagram, interleaved."""
    samples: dict[str, list[float]] = {"ring": [], "datagram": []}
    for r in range(9):
        for name in ("ring", "datagram") if r % 2 else ("datagram", "ring"):
            directory = tempfile.mkdtemp(prefix="otel-llm-drain-")
            receiver = transport.StepReceiver(directory)
            taken = [0]
            receiver._take = lambda data, deliver, ids=None: taken.__setitem__(0, taken[0] + 1)
            sink = transport.SocketSink(directory)
            sink.RING = name == "ring"
            sink(payload)
            receiver.drain(None)
            total = 0
            for _ in range(n):
                sink(payload)
                c0 = time.thread_time_ns()
                receiver.drain(None)
                total += time.thread_time_ns() - c0
            if taken[0] != n + 1:
                raise SystemExit(f"{name}: {n + 1 - taken[0]} records lost")
            samples[name].append(total / n)
            sink.close()
            receiver.close()
            os.rmdir(directory)
    return {name: round(statistics.median(v)) for name, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=400, help="steps per mode per round")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=0, help="new requests (prefill chunks) in the step besides the batch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < SLICE or args.batch < 1:
        ap.error(f"--rounds >= 1, --steps >= {SLICE} and --batch >= 1")

    from support.engine import prepare_env
    prepare_env()
    from otel_llm.instrumentation.vllm import step_hooks, step_transport, step_wire
    from otel_llm.instrumentation.wraps import Target

    scene = Scene(args.batch, args.new)
    scenes = dict.fromkeys(MODES, scene)
    scenes["hooks_lora"] = Scene(args.batch, args.new, lora=True)
    scenes["hooks_spec"] = Scene(args.batch, args.new, spec=True)
    directory = tempfile.mkdtemp(prefix="otel-llm-hooks-")
    frontend = step_transport.StepReceiver(directory)
    received = [0]
    frontend._take = lambda data, deliver, ids=None: received.__setitem__(0, received[0] + 1)  # count, don't decode

    def drain() -> None:
        frontend.drain(None)

    sinks: dict[str, Any] = {}

    def wired(mode: str) -> Wired:
        scene = scenes[mode]
        if mode == "bare":
            return Wired(None, scene)
        if mode == "wrap":
            def through(wrapped: Callable, instance: Any, a: tuple, kw: dict) -> Any:
                return wrapped(*a, **kw)
            return Wired(lambda name: [Target(name, "Scheduler.schedule", through, plain=True),
                                       Target(name, "Scheduler.update_from_output", through, plain=True)], scene)
        hooks = step_hooks.StepHooks()  # armed by hand: arm() would also wrap vLLM's real scheduler
        targets = hooks.targets
        if mode in ("hooks_py", "hooks_pymethods"):  # the Python methods (StepHooks.FAST off)
            targets = lambda name: [dataclasses.replace(t, method=None) for t in hooks.targets(name)]  # noqa: E731
        if mode in ("hooks", "hooks_py", "hooks_pymethods", "hooks_dgram", "hooks_lora", "hooks_spec"):
            sink = step_transport.SocketSink(directory)
            if mode == "hooks_dgram":
                sink.RING = False
            if mode == "hooks_py":
                sink._encode, sink._into_rings = step_wire.encode_py, None
            sinks[mode] = sink
            hooks.sink = sink.__call__
        elif mode == "encode":
            cache = step_wire.sender_cache()  # as SocketSink keeps it, every frontend on a ring
            hooks.sink = lambda payload: step_wire.encode(payload, cache, True)
        else:
            hooks.sink = lambda payload: None
        return Wired(targets, scene)

    by_mode = {m: wired(m) for m in MODES}
    for m in MODES:  # warm up: struct layouts compiled, sockets connected, rings handed over
        steps_ns(by_mode[m], scenes[m], 50, drain)
    rounds: dict[str, list[float]] = {m: [] for m in MODES}
    load = [os.getloadavg()[0]]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    over_bare: dict[str, list[float]] = {m: [] for m in MODES}  # each slice's median over its bare median
    for r in range(args.rounds):
        taken: dict[str, list[int]] = {m: [] for m in MODES}
        for _ in range(args.steps // SLICE):
            order = list(MODES)
            random.shuffle(order)
            slice_ns = {}
            for m in order:
                slice_ns[m] = steps_ns(by_mode[m], scenes[m], SLICE, drain)
                taken[m] += slice_ns[m]
            bare = statistics.median(slice_ns["bare"])
            for m in MODES:
                over_bare[m].append(statistics.median(slice_ns[m]) / bare)
        for m in MODES:
            rounds[m].append(statistics.median(taken[m]) / 1000)
        load.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds}: " + " ".join(f"{m} {rounds[m][-1]:.2f}" for m in MODES), flush=True)

    captured: list = []
    hooks = step_hooks.StepHooks()
    hooks.sink = captured.append
    steps_ns(Wired(hooks.targets, scene), scene, 1, lambda: None)
    med = {m: statistics.median(v) for m, v in rounds.items()}
    result = {
        "benchmark": "engine_step_hooks", "started": started, "batch": args.batch, "new_requests": args.new,
        "steps_per_round": args.steps, "rounds": args.rounds,
        "machine": {"python": platform.python_version(), "arch": platform.machine(), "cpus": os.cpu_count(),
                    "loadavg_1min": [round(x, 2) for x in load]},
        "ring": step_transport.SocketSink.RING, "c_accelerator": step_wire.REASON or "built and chosen",
        "c_hook_methods": (step_hooks.FAST_REASON or "built and chosen") if step_hooks.fast_methods() is not None
        else step_hooks.FAST_REASON,
        "records_received": received[0], "records_dropped": {m: s.dropped for m, s in sinks.items()},
        "cpu_us_per_step": {m: round(v, 2) for m, v in med.items()},
        "engine_core_us_per_step": {
            "hooks": round(med["hooks"] - med["bare"], 2),
            "hooks_python": round(med["hooks_py"] - med["bare"], 2),
            "hooks_python_methods": round(med["hooks_pymethods"] - med["bare"], 2),
            "hooks_datagram": round(med["hooks_dgram"] - med["bare"], 2),
            "python_wrapping": round(med["wrap"] - med["bare"], 2),
            "hooks_own": round(med["hook_only"] - med["bare"], 2),
            "encoding": round(med["encode"] - med["hook_only"], 2),
            "ring_transport": round(med["hooks"] - med["encode"], 2),
            "hooks_lora": round(med["hooks_lora"] - med["bare"], 2),
            "hooks_spec": round(med["hooks_spec"] - med["bare"], 2),
            "lora_over_plain": round(med["hooks_lora"] - med["hooks"], 2),
            "spec_over_plain": round(med["hooks_spec"] - med["hooks"], 2)},
        "worker_side": worker_ns(),
        "cpu_us_per_step_rounds": {m: [round(x, 2) for x in v] for m, v in rounds.items()},
        # the same slice's bare stand-in as the unit: what slows the process for a slice (another process on
        # the core, its cache, the clock) slows both, so this resolves smaller changes across runs and trees
        "per_step_over_bare": {m: round(statistics.median(v), 3) for m, v in over_bare.items() if m != "bare"},
        "frontend_decode_per_record": decode_ns(step_wire, captured[0]),
        "frontend_drain_ns_per_record": drain_ns(step_transport, captured[0]),
    }
    frontend.close()
    for sink in sinks.values():
        sink.close()
    print(json.dumps({k: result[k] for k in ("engine_core_us_per_step", "frontend_decode_per_record",
                                             "frontend_drain_ns_per_record")}, indent=1))
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / "engine_step_hooks.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
