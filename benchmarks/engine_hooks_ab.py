"""EngineCore CPU per engine step added by the step hooks: the hooks of BASE_COMMIT (a Python loop over
the scheduled requests, ``sendto`` per frontend, wire version 1) against this tree's (vLLM's own
scheduler-output lists shipped as they are, wire version 2, a shared-memory ring per frontend where
available, else a datagram on a connected socket), measured in interleaved rounds in one run (each round
in slices of 25 steps per mode, the modes in a fresh random order per slice; medians of per-round medians).

The harness: a stand-in ``Scheduler`` class whose ``schedule`` and ``update_from_output`` return at once,
wrapped by the hooks through the same ``WrapTable`` the plugin uses (so the wrapper call is in the
figure: wrapt's for BASE_COMMIT, a plain function for this tree, ``wraps.Target(plain=True)``), on the
thread's CPU clock; the stand-in scheduler output is vLLM's real ``CachedRequestData`` for ``batch``
decoding requests with vLLM-shaped ids (``cmpl-<32 hex>-0``), plus ``--new`` new requests (prefill chunks)
if asked. One frontend (a real ``StepReceiver``, its records counted, not decoded), drained between
steps (untimed). Modes:

    bare        the stand-ins alone, unwrapped
    wrap        wrapped by wrapt with wrappers that only call through (BASE_COMMIT's wrapping)
    wrap_plain  the same through plain-function wrappers (this tree's)
    old         BASE_COMMIT's hooks and SocketSink (its own step_wire: version 1), wrapt
    new         this tree's hooks and SocketSink (a ring, where step_ring.AVAILABLE)
    new_py      this tree's hooks and SocketSink without the C accelerator (step_wire.encode_py, RingWriter.write:
                the fallback where _step_fast is not built or not x86-64)
    new_dgram   this tree's hooks and SocketSink with rings off (one datagram a step)
    new_enc     this tree's hooks, the record encoded (step_wire.encode: the C accelerator where built) but not sent
    new_hook    this tree's hooks, the record handed to a no-op (their own Python work and wrapping)

So new - new_enc is the transport (ring; with the C accelerator encode and ring write are one call), new_dgram - new_enc the datagram's, new_enc - new_hook the
encoding. With ``--burners N`` every round is also run with N busy processes (started before, stopped
after). ``--also <commit>`` adds that commit's hooks as mode ``also`` (e.g. ``--also main``: the paired
``also - new`` per round and ``new_over_also``, the hooks' cost of this tree over that commit's, are in the
results). Frontend side, per record: decoding (BASE_COMMIT's decode vs this tree's, a full record and the
next record of a steady batch, whose ids are left out: ``new_same_ids``), and taking a record off the
transport (``StepReceiver.drain``: ring vs datagram, full records).

Run: python benchmarks/engine_hooks_ab.py [--rounds 9] [--steps 400] [--batch 64] [--burners 0]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/support: test helpers, not shipped
RESULTS = ROOT / "benchmarks" / "results"
BASE_COMMIT = "49d67c8"  # before wire version 2: shares captured per request in Python, sendto
PACKAGE = "otel_llm.instrumentation.vllm"
CHUNK = 25  # steps per mode per slice of a round (see main)


def load_old(commit: str = BASE_COMMIT, tag: str = "old") -> types.ModuleType:
    """A commit's steps.py with its own step_wire.py (the frontend's wire changed with it)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"otel-llm-{tag}-"))
    sources = {}
    for name in ("steps", "step_wire"):
        sources[name] = subprocess.run(["git", "show", f"{commit}:otel_llm/instrumentation/vllm/{name}.py"],
                                       cwd=ROOT, check=True, capture_output=True, text=True).stdout
    # its own step_wire, whichever way it imports it (session 7 on: `from . import step_ring, step_wire`; before
    # this fix that form kept the current tree's step_wire, so 'also' figures of main encoded with this tree's)
    sources["steps"] = sources["steps"].replace(
        "from . import step_ring, step_wire", f"from . import step_ring\nfrom . import _{tag}_step_wire as step_wire").replace(
        "from . import step_wire\n", f"from . import _{tag}_step_wire as step_wire\n")
    assert f"_{tag}_step_wire as step_wire" in sources["steps"], "the commit's steps.py imports step_wire another way"
    mods = {}
    for name, mod_name in (("step_wire", f"_{tag}_step_wire"), ("steps", f"_{tag}_steps")):
        path = tmp / f"{mod_name}.py"
        path.write_text(sources[name])
        spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{mod_name}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods["steps"]


class Scene:
    """One step's worth of stand-ins: what both hook versions read of vLLM's scheduler and its output."""

    def __init__(self, batch: int, new: int) -> None:
        from vllm.v1.core.sched.output import CachedRequestData
        from vllm.v1.engine import EngineCoreOutput

        ids = [f"cmpl-{random.getrandbits(128):032x}-0" for _ in range(batch + new)]
        decoding, fresh = ids[:batch], ids[batch:]
        prompt, outputs, chunk = 96, 5, 32

        class Req:  # the scheduler's Request right after schedule(): num_computed_tokens advanced
            __slots__ = ("num_computed_tokens", "num_tokens", "num_output_tokens", "num_prompt_tokens")

            def __init__(self, computed: int, outs: int) -> None:
                self.num_computed_tokens, self.num_output_tokens = computed, outs
                self.num_tokens, self.num_prompt_tokens = prompt + outs, prompt

        class Waiting(list):
            def peek_request(self):
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
            max_num_scheduled_tokens=8192)
        scheduled = dict.fromkeys(decoding, 1)
        scheduled.update(dict.fromkeys(fresh, chunk))
        self.out = types.SimpleNamespace(
            num_scheduled_tokens=scheduled, preempted_req_ids=set(), finished_req_ids=set(),
            total_num_scheduled_tokens=batch + chunk * new, scheduled_cached_reqs=cached,
            scheduled_new_reqs=[types.SimpleNamespace(req_id=r, num_computed_tokens=0, prompt_len=prompt,
                                                      prefill_token_ids=None) for r in fresh])
        self.outputs = {0: types.SimpleNamespace(timestamp=0.0, outputs=[
            EngineCoreOutput(request_id=r, new_token_ids=[7]) for r in decoding])}
        self.model_output = types.SimpleNamespace()


class Wired:
    """A stand-in ``Scheduler`` class of its own module, its two methods wrapped the way the plugin wraps
    vLLM's (the hooks' ``wrap_scheduler``/``WrapTable``: the wrapper call is part of the cost)."""

    _made = 0

    def __init__(self, hooks, scene: Scene, plain: bool | None = None) -> None:
        Wired._made += 1
        name = f"_engine_hooks_ab_{Wired._made}"
        module = types.ModuleType(name)
        out, outputs = scene.out, scene.outputs

        class Scheduler:
            def schedule(self):
                return out

            def update_from_output(self, scheduler_output, model_runner_output):
                return outputs

        Scheduler.__module__ = name
        module.Scheduler = Scheduler
        sys.modules[name] = module
        self.scheduler = Scheduler()
        self.scheduler.__dict__.update(vars(scene.scheduler))
        if hooks is not None:
            from otel_llm.instrumentation.wraps import Target, WrapTable
            if plain is None:  # as the hooks' own table wraps vLLM's scheduler (BASE_COMMIT: wrapt)
                table = getattr(hooks, "_table", None)
                plain = any(getattr(t, "plain", False) for t in table.targets) if table else False
            WrapTable([Target(name, "Scheduler.schedule", hooks.schedule, plain=plain),
                       Target(name, "Scheduler.update_from_output", hooks.update_from_output, plain=plain)]).wrap()


def per_step_us(wired: Wired, scene: Scene, steps: int, drain, samples: list | None = None) -> float:
    """Median CPU µs per step over ``steps`` steps (the samples, ns, also appended to ``samples``)."""
    out, model_output, scheduler = scene.out, scene.model_output, wired.scheduler
    clock = time.thread_time_ns
    taken = []
    for _ in range(steps):
        c0 = clock()
        scheduler.schedule()
        scheduler.update_from_output(out, model_output)
        taken.append(clock() - c0)
        drain()
    if samples is not None:
        samples.extend(taken)
    return statistics.median(taken) / 1000


def decode_ns(old, new, scene: Scene, n: int = 2000) -> dict:
    """Frontend CPU to turn one datagram into a StepRecord, per wire version."""
    from otel_llm.instrumentation.vllm import step_wire

    got: dict[str, bytes] = {}
    for name, mod in (("old", old), ("new", new)):
        hooks = mod.StepHooks()
        hooks.sink = lambda payload, mod=mod, name=name: got.__setitem__(
            name, (mod.step_wire if mod is old else step_wire).encode(payload))
        per_step_us(Wired(hooks, scene), scene, 1, lambda: None)
    # the same step as the next record of a steady batch: its ids left out (SAME_IDS), read with a cache
    # that read the record before (set back before each decode: a list store, ~0.05 µs, counted in)
    payload = step_wire.decode(got["new"])
    sender: list = [None, b"", None]
    shares = (payload.ids, payload.tokens, payload.contexts, (), (), (), ())
    first = (payload.step_id, payload.start, payload.end, payload.running, payload.waiting, payload.preempted,
             payload.kv_cache_usage, shares, payload.queue_blocked, payload.schedule_s, payload.execute_s,
             payload.output_s, payload.idle_s, payload.model_s)
    step_wire.encode(first, sender)
    got["new_same_ids"] = step_wire.encode((first[0] + 1,) + first[1:], sender)
    reader: list = [None, None, None]
    step_wire.decode(step_wire.encode(first), reader)
    before = first[0]

    def same(data: bytes, reader: list = reader) -> None:
        reader[2] = before
        step_wire.decode(data, reader)

    full_cache: list = [None, None, None]  # as StepReceiver reads: the repeated ids' bytes compared, not split

    def full(data: bytes, cache: list = full_cache) -> None:
        step_wire.decode(data, cache)

    cases = (("old", old.step_wire.decode, got["old"]), ("new", full, got["new"]),
             ("new_same_ids", same, got["new_same_ids"]))
    samples: dict[str, list[float]] = {"old": [], "new": [], "new_same_ids": []}
    for r in range(9):  # interleaved, alternating order
        for name, fn, data in cases if r % 2 else cases[::-1]:
            c0 = time.thread_time_ns()
            for _ in range(n):
                fn(data)
            samples[name].append((time.thread_time_ns() - c0) / n)
    out = {name: {"decode_ns": round(statistics.median(samples[name])), "datagram_bytes": len(data)}
           for name, _, data in cases}
    a, b = old.step_wire.decode(got["old"]), step_wire.decode(got["new"])
    assert sorted(zip(a.requests, a.contexts)) == sorted(zip(b.requests, b.contexts)), "the two wires disagree"
    return out


def drain_ns(new, scene: Scene, n: int = 2000) -> dict:
    """Frontend CPU to take one step's record off its transport (``StepReceiver.drain``, decoding left
    out), ring vs datagram, interleaved: the receiving side of the transport choice."""
    captured: list = []
    hooks = new.StepHooks()
    hooks.sink = captured.append
    per_step_us(Wired(hooks, scene), scene, 1, lambda: None)
    payload = captured[0]
    samples: dict[str, list[float]] = {"ring": [], "datagram": []}
    for r in range(9):
        for name in ("ring", "datagram") if r % 2 else ("datagram", "ring"):
            directory = tempfile.mkdtemp(prefix="otel-llm-drain-")
            receiver = new.StepReceiver(directory)
            taken = [0]
            receiver._take = lambda data, deliver, ids=None: taken.__setitem__(0, taken[0] + 1)
            sink = new.SocketSink(directory)
            sink.RING = name == "ring"
            sink(payload)
            receiver.drain(None)
            total = 0
            for _ in range(n):
                sink(payload)
                c0 = time.thread_time_ns()
                receiver.drain(None)
                total += time.thread_time_ns() - c0
            assert taken[0] == n + 1, "records lost"
            samples[name].append(total / n)
            sink.close()
            receiver.close()
            os.rmdir(directory)
    return {name: round(statistics.median(v)) for name, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=0, help="new requests (prefill chunks) in the step besides the batch")
    ap.add_argument("--burners", type=int, default=2, help="busy processes during the loaded rounds (0: none)")
    ap.add_argument("--also", default=None, help="a commit whose hooks are measured too (mode 'also')")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from support.engine import prepare_env
    prepare_env()
    from otel_llm.instrumentation.vllm import steps as new

    old = load_old()
    also = load_old(args.also, "also") if args.also else None
    scene = Scene(args.batch, args.new)
    directory = tempfile.mkdtemp(prefix="otel-llm-ab-")
    frontend = new.StepReceiver(directory)  # its socket, and the rings handed to it
    received = [0]
    frontend._take = lambda data, deliver, ids=None: received.__setitem__(0, received[0] + 1)  # count, don't decode

    def drain() -> None:
        frontend.drain(None)

    from otel_llm.instrumentation.vllm import step_wire

    def make(mode: str):
        if mode == "bare":
            return None
        if mode in ("wrap", "wrap_plain"):  # the wrapping alone: wrappers that only call through
            through = lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs)  # noqa: E731
            return types.SimpleNamespace(schedule=through, update_from_output=through)
        mod = {"old": old, "also": also}.get(mode, new)
        hooks = mod.StepHooks()  # armed by hand: arm() would also wrap vLLM's real scheduler
        if mode in ("old", "new", "new_dgram", "new_py", "also"):
            sink = mod.SocketSink(directory)
            if mode == "new_dgram":
                sink.RING = False  # this tree's datagram path (where rings are not available)
            if mode == "new_py":  # this tree without its C accelerator (the fallback: no compiler, not x86-64)
                sink._encode, sink._into_rings = step_wire.encode_py, None
            # as the plugin arms it (this tree: the bound method)
            hooks.sink = sink.__call__ if mode in ("new", "new_dgram", "new_py") else sink
        elif mode == "new_enc":
            cache: list = [None, b"", None]  # as SocketSink keeps it (every frontend on a ring: ids left out while they repeat)
            hooks.sink = lambda payload: step_wire.encode(payload, cache)
        else:
            hooks.sink = lambda payload: None
        return hooks

    modes = ["bare", "wrap", "wrap_plain", "old", "new", "new_py", "new_dgram", "new_enc", "new_hook"] + (["also"] if also else [])
    hooks_by_mode = {m: make(m) for m in modes}
    hooks = {m: Wired(hooks_by_mode[m], scene, {"wrap": False, "wrap_plain": True}.get(m)) for m in modes}
    for m in modes:  # warm up: struct layouts compiled, sockets connected
        per_step_us(hooks[m], scene, 50, drain)
    rows: dict[str, dict[str, list[float]]] = {"quiet": {m: [] for m in modes}, "loaded": {m: [] for m in modes}}
    load: dict[str, list[float]] = {"quiet": [], "loaded": []}
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    burn = "import time\nt=time.time()+120\nwhile time.time()<t: pass"
    for r in range(args.rounds):
        for condition in ("quiet", "loaded") if args.burners else ("quiet",):
            burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(args.burners)] \
                if condition == "loaded" else []
            try:
                if burners:
                    time.sleep(0.3)  # let them take the cores
                # the round's steps in slices of CHUNK per mode, the modes' order reshuffled per slice: a
                # burst of interference from other processes (this machine is shared) hits every mode alike
                taken: dict[str, list] = {m: [] for m in modes}
                for _ in range(max(1, args.steps // CHUNK)):
                    order = modes[:]
                    random.shuffle(order)
                    for m in order:
                        per_step_us(hooks[m], scene, CHUNK, drain, taken[m])
                for m in modes:
                    rows[condition][m].append(statistics.median(taken[m]) / 1000)
                load[condition].append(os.getloadavg()[0])
            finally:
                for p in burners:
                    p.kill()
                    p.wait()
        print(f"round {r + 1}/{args.rounds}: " + "; ".join(
            f"{c}: " + " ".join(f"{m} {rows[c][m][-1]:.1f}" for m in modes) for c in rows if rows[c]["bare"]),
            flush=True)
    frontend_cost = decode_ns(old, new, scene)
    frontend_cost["drain_ns"] = drain_ns(new, scene)

    result: dict = {"benchmark": "engine_hooks_ab", "started": started, "base_commit": BASE_COMMIT, "also": args.also,
                    "batch": args.batch, "new_requests": args.new, "steps_per_measurement": args.steps,
                    "rounds": args.rounds, "burners": args.burners, "python": platform.python_version(),
                    "machine": platform.machine(), "cpus": os.cpu_count(), "records_received": received[0],
                    "sink_dropped": {m: getattr(h.sink, "__self__", h.sink).dropped for m, h in hooks_by_mode.items()
                                     if hasattr(getattr(getattr(h, "sink", None), "__self__", getattr(h, "sink", None)), "dropped")},
                    "ring": new.SocketSink.RING, "c_accelerator": step_wire.REASON or "built and chosen",
                    "frontend_decode_per_record": frontend_cost, "conditions": {}}
    for condition, by_mode in rows.items():
        if not by_mode["bare"]:
            continue
        med = {m: statistics.median(v) for m, v in by_mode.items()}
        paired = [o - n for o, n in zip(by_mode["old"], by_mode["new"])]
        also_paired = [a - n for a, n in zip(by_mode["also"], by_mode["new"])] if "also" in by_mode else None
        result["conditions"][condition] = {
            "cpu_us_per_step_median": {m: round(v, 2) for m, v in med.items()},
            "cpu_us_per_step_rounds": {m: [round(x, 2) for x in v] for m, v in by_mode.items()},
            "hooks_us_per_step": {m: round(med[m] - med["bare"], 2) for m in ("old", "new", "new_py", "new_dgram", "also") if m in med},
            "wrapping_us": {"wrapt": round(med["wrap"] - med["bare"], 2),
                            "plain": round(med["wrap_plain"] - med["bare"], 2)},
            "new_split_us": {"hooks incl. wrapping": round(med["new_hook"] - med["bare"], 2),
                             "encode": round(med["new_enc"] - med["new_hook"], 2),
                             "transport": round(med["new"] - med["new_enc"], 2),
                             "transport_datagram": round(med["new_dgram"] - med["new_enc"], 2)},
            "old_minus_new_paired_median_us": round(statistics.median(paired), 2),
            "old_minus_new_paired_range_us": [round(min(paired), 2), round(max(paired), 2)],
            "new_py_minus_new_paired_median_us": round(statistics.median(
                [p - n for p, n in zip(by_mode["new_py"], by_mode["new"])]), 2),
            **({"also_minus_new_paired_median_us": round(statistics.median(also_paired), 2),
                "also_minus_new_paired_range_us": [round(min(also_paired), 2), round(max(also_paired), 2)],
                "new_over_also_paired_median": round(statistics.median(
                    [(n - b) / (a - b) for a, n, b in zip(by_mode["also"], by_mode["new"], by_mode["bare"])]), 3)}
               if also_paired else {}),
            "load_average_1min": [round(x, 2) for x in load[condition]],
        }
    print(json.dumps(result["conditions"], indent=1))
    print(json.dumps(frontend_cost))
    out = Path(args.out) if args.out else RESULTS / "engine_hooks_ab.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
