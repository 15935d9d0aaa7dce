"""vLLM's frontend CPU per token, per telemetry mode, where users pay it: ``vllm serve``'s API server under
streaming ``openai`` clients, and the offline ``LLM`` frontend. Modes interleaved in one run.

What is measured, per measurement (one mode, one workload):

* **serve**: the API server process (``benchmarks/serve_with_modes.py``: vLLM's own API server, the
  telemetry mode switched between measurements over a control socket) under ``--concurrency`` streaming
  ``openai`` clients (``AsyncOpenAI``, completions, ``ignore_eos``, usage chunk) in this process. CPU is
  the sum over the server's threads of ``/proc/<pid>/task/<tid>/schedstat`` (run time in ns, as the
  scheduler accounts it: no tick sampling), read before and after; its EngineCore child the same way.
* **offline**: ``LLM.generate`` in this process (instrumented and uninstrumented on one engine, as
  ``vllm_overhead.py``); CPU is this process's ``CLOCK_PROCESS_CPUTIME_ID`` (every thread, exited ones
  included), the EngineCore child's from schedstat.

Spans go over OTLP/HTTP to a sink process (discarded) through the SDK's batch processor, so our direct
export runs; each measurement ends with a flush, whose CPU counts.

How it is made to resolve a few per cent on a shared, noisy machine:

* every round runs each mode once, in a shuffled order; the share of a mode in a round is paired with
  mode ``none`` *of the same round* (``(cpu_mode - cpu_none) / cpu_none`` per token);
* the figure is the median of the per-round shares, and its **resolution** the half-width of a
  bootstrap 90 % interval of that median (resampled rounds);
* the spread of ``none`` between rounds is stated (range and median absolute deviation, over its median).

* pinning (``--pin``, the default; ``--no-pin`` turns it off): on a 2-core machine the frontend and the
  EngineCore share both cores, and the engine's OpenMP threads spinning on the frontend's core moved
  ``none`` between rounds more than the overheads measured. So every thread of the frontend (offline: this
  process; serve: the API server) runs on the first allowed CPU, and every thread of everything else (the
  EngineCore and its workers, the agent process, the OTLP sink, under serve this process with its
  clients) on the others, set with ``sched_setaffinity`` per thread after the engine is up and again
  before each measurement (a process started later, such as the agent, is caught then). The engine's
  worker gets its OpenMP threads bound to those CPUs by vLLM itself (``VLLM_CPU_OMP_THREADS_BIND``,
  ``--engine-omp-bind``): unbound, it keeps one OpenMP thread per core it started with, and two of them
  spinning on one core cut the engine's throughput thirtyfold. The worker also busy-polls for a second
  after each step (vLLM's shared-memory queue), on the other CPUs with the clients under serve;
  ``--engine-nice`` lowers the worker's priority there. The results say which pinning was used
  (``pinning``).
* our code inside the frontend (``hooks_us_per_token``; with our threads' CPU ``ours_in_frontend_us_per_token``):
  the thread CPU inside our wrappers less vLLM's calls in them, every call timed within each measurement
  (``telemetry_modes.HookProbe``: collections that start inside a hook and the probe's own clock reads left
  out), with its spread between measurements (``hooks_spread_range_pct``, ``hooks_spread_mad_pct``) and its
  split by hooked method (``hooks_us_per_token_by_method``). Its µs follow the machine's speed in that
  measurement as vLLM's own CPU per token does (a frontend core slowed by a neighbour slows both alike): between
  two runs (``ab.py``) the figure that resolves 10 % is ``ours_share_within_pct``, ours over the rest of the
  frontend's CPU in the same measurement (vLLM's code, the same on both sides, is the gauge of that speed).
* ``resolves_5pct`` per frontend: whether the run could tell a 5 % share from none at all: the default
  mode's resolution under 2.5 points and ``none``'s MAD under 2.5 %.
* the share at equal wall time (``share_at_equal_wall_pct``, ``at_equal_wall``): vLLM's frontend CPU per
  token grows with the wall time per token, and the engine's speed moves between measurements; the paired
  shares regressed on the pair's wall difference, the intercept with its bootstrap interval.

The agent process (the telemetry's work off the frontend, docs/design/off-process.md): when the
telemetry's ``stats()`` names it (``agent_pid``), its CPU (every thread's schedstat, before and after) is
reported per measurement (``agent_cpu_us_per_token``), its median per mode, and the share of the
frontend and the agent together over ``none``'s; ``None`` where there is no agent.

The EngineCore's µs per step cannot be resolved from whole-process CPU here (a step is ~25 ms of the
model's forward on this CPU build); the per-step figure is the step hooks on their own at batch 64
(``vllm_overhead.engine_hooks_us_per_step``), with the EngineCore's CPU per token beside it.

Run: ./run bench benchmarks/frontend_cpu.py [--frontends serve,offline] [--rounds 12] [--modes none,default,...]
     [--requests 64] [--serve-rounds N] [--serve-requests N] [--offline-rounds N] [--offline-requests N]
     [--no-pin] [--engine-omp-bind nobind|CPUS] [--engine-nice N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/support: the tiny model, engine settings

OUTPUT_TOKENS = 128


# -- CPU counters ------------------------------------------------------------------------------------

def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Run time (ns, schedstat) of each live thread of ``pid``, by thread id."""
    out = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def split_cpu(before: dict[int, int], after: dict[int, int], pid: int, ours: set[int]) -> dict[str, int]:
    """CPU between two snapshots on the host's main thread (vLLM's output processing, HTTP, our hot-path hooks),
    on our own threads (the background thread, direct export, the SDK's batch processor) and on the rest."""
    main = ours_ns = other = 0
    for tid, ns in after.items():
        d = ns - before.get(tid, 0)
        if tid == pid:
            main += d
        elif tid in ours:
            ours_ns += d
        else:
            other += d
    return {"main": main, "ours": ours_ns, "other": other}


def our_threads() -> set[int]:
    """This process's telemetry threads (ours and the SDK's exporters'), by native id."""
    import threading

    return {t.native_id for t in threading.enumerate()
            if t.native_id is not None and (t.name.startswith("otel-llm") or t.name.startswith("Otel"))}


def children_of(pid: int) -> list[int]:
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            out = [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out + [g for c in out for g in children_of(c)]


def tree_cpu_ns(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            total += sum(thread_cpu_ns(p).values())
        except OSError:
            pass
    return total


def start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot): tells a process from a later one that
    reused its id."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class Agent:
    """The agent process, as the telemetry's ``stats()`` names it (``agent_pid``; 0 or absent: none). The
    last one named is kept while it lives, so modes whose ``stats()`` is empty (``none``, ``native``) still
    see it."""

    def __init__(self) -> None:
        self.pid = 0
        self.started: int | None = None

    def update(self, stats: dict) -> int:
        pid = stats.get("agent_pid") if isinstance(stats, dict) else None
        if isinstance(pid, int) and pid > 0 and (pid, start_time(pid)) != (self.pid, self.started):
            self.pid, self.started = pid, start_time(pid)
        if self.pid and start_time(self.pid) != self.started:  # gone (or its id reused)
            self.pid, self.started = 0, None
        return self.pid

    def tree(self) -> list[int]:
        return [self.pid, *children_of(self.pid)] if self.pid else []

    def threads_ns(self) -> dict[tuple[int, int], int]:
        out = {}
        for p in self.tree():
            try:
                out.update({(p, tid): ns for tid, ns in thread_cpu_ns(p).items()})
            except OSError:
                pass
        return out


def delta_ns(before: dict, after: dict) -> int:
    """CPU between two per-thread snapshots: threads started in between count from zero."""
    return sum(ns - before.get(key, 0) for key, ns in after.items())


def each_thread(pid: int, act: Callable[[int], None]) -> int:
    """``act(tid)`` on every live thread of ``pid``; how many it was done to (threads may exit meanwhile)."""
    n = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            act(int(tid))
            n += 1
        except (OSError, ValueError):  # exited meanwhile
            pass
    return n


def pin_threads(pid: int, cpus: set[int]) -> int:
    """Every live thread of ``pid`` onto ``cpus`` (threads started later inherit their creator's)."""
    return each_thread(pid, lambda tid: os.sched_setaffinity(tid, cpus))


WORKER_NAME = "VLLM::Worker"  # the process title vLLM gives its model workers (the busy-pollers)


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def nice_threads(pid: int, nice: int) -> int:
    """Every live thread of ``pid`` at niceness ``nice`` (Linux: per thread, inherited by new ones)."""
    return each_thread(pid, lambda tid: os.setpriority(os.PRIO_PROCESS, tid, nice))


@dataclass
class Pinning:
    """The frontend on ``frontend_cpus``, everything else on ``other_cpus``; ``None`` CPUs: not pinned."""

    frontend_cpus: set[int] | None = None
    other_cpus: set[int] | None = None
    engine_omp_bind: str = "nobind"
    engine_nice: int = 0

    @classmethod
    def choose(cls, enabled: bool, engine_omp_bind: str | None, engine_nice: int) -> "Pinning":
        allowed = sorted(os.sched_getaffinity(0))
        if not enabled or len(allowed) < 2:
            if enabled:
                print(f"pinning off: {len(allowed)} CPU allowed", flush=True)
            return cls(engine_omp_bind=engine_omp_bind or "nobind", engine_nice=engine_nice)
        others = set(allowed[1:])
        bind = engine_omp_bind if engine_omp_bind is not None else ",".join(map(str, sorted(others)))
        return cls({allowed[0]}, others, bind, engine_nice)

    @property
    def enabled(self) -> bool:
        return self.frontend_cpus is not None

    def apply(self, frontend: int, others: list[int], engine: list[int]) -> dict[str, int]:
        """``frontend``'s threads onto the frontend's CPUs, every thread of each of ``others`` onto the rest,
        ``engine``'s at the engine's niceness; how many threads each side holds."""
        niced = {"niced_worker_threads": sum(nice_threads(p, self.engine_nice) for p in engine
                                             if process_name(p).startswith(WORKER_NAME))} if self.engine_nice else {}
        if not self.enabled:
            return niced
        return {"frontend_threads": pin_threads(frontend, self.frontend_cpus),
                "other_threads": sum(pin_threads(p, self.other_cpus) for p in dict.fromkeys(others) if p != frontend),
                **niced}

    def describe(self) -> dict:
        if not self.enabled:
            return {"pinned": False, "engine_omp_bind": self.engine_omp_bind, "engine_nice": self.engine_nice}
        return {"pinned": True, "frontend_cpus": sorted(self.frontend_cpus), "other_cpus": sorted(self.other_cpus),
                "engine_omp_bind": self.engine_omp_bind, "engine_nice": self.engine_nice}


# -- statistics --------------------------------------------------------------------------------------

def bootstrap_halfwidth(values: list[float], n: int = 2000, seed: int = 0) -> float:
    """Half-width of a 90 % bootstrap interval of the median of ``values``."""
    if len(values) < 3:
        return float("nan")
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return (meds[int(0.95 * n) - 1] - meds[int(0.05 * n)]) / 2


def at_equal_wall(mode: list[dict], none: list[dict], key: str, n: int = 2000, seed: int = 0) -> dict:
    """The paired share at equal wall time per token: per round, the share regressed on the relative
    difference of wall time per token between the mode's measurement and ``none``'s (least squares); the
    intercept, with the half-width of a 90 % bootstrap interval (resampled rounds), and the slope.

    Why: vLLM's frontend CPU per token grows with the wall time per token (CPU spent waking up for each
    of more, sparser output batches: ~0.17 µs of CPU a µs of wall in the offline series), and on two cores
    the engine's speed moves between measurements (the agent and the EngineCore share the second core);
    the wall difference explained most of the spread of the paired shares. The intercept is the share the
    frontend pays for our code at the engine's speed of the pairing's ``none``."""
    shares = [(a[key] - b[key]) / b[key] for a, b in zip(mode, none)]
    walls = [b["tokens_per_s"] / a["tokens_per_s"] - 1 for a, b in zip(mode, none)]
    if len(shares) < 4:
        return {"share_at_equal_wall_pct": None, "share_at_equal_wall_resolution_pct": None}

    def fit(idx: list[int]) -> tuple[float, float]:
        xs, ys = [walls[i] for i in idx], [shares[i] for i in idx]
        if len(set(xs)) < 2:
            return statistics.median(ys), 0.0
        slope, intercept = statistics.linear_regression(xs, ys)
        return intercept, slope

    everyone = list(range(len(shares)))
    intercept, slope = fit(everyone)
    rng = random.Random(seed)
    boots = sorted(fit([rng.randrange(len(shares)) for _ in everyone])[0] for _ in range(n))
    return {"share_at_equal_wall_pct": round(100 * intercept, 2),
            "share_at_equal_wall_resolution_pct": round(100 * (boots[int(0.95 * n) - 1] - boots[int(0.05 * n)]) / 2, 2),
            "share_per_wall_pct": round(slope, 2),  # points of share a per cent of wall difference
            "wall_difference_median_pct": round(100 * statistics.median(walls), 2),
            "share_wall_correlation": round(statistics.correlation(walls, shares), 2) if len(set(walls)) > 1 else None}


def summarize(results: dict[str, list[dict]], modes: list[str], key: str = "cpu_us_per_token") -> dict:
    none = [r[key] for r in results["none"]]
    med_none = statistics.median(none)
    mad = statistics.median(abs(x - med_none) for x in none)
    out: dict[str, Any] = {
        "none_us_per_token_median": round(med_none, 2),
        "none_spread_range_pct": round(100 * (max(none) - min(none)) / med_none, 2),
        "none_spread_mad_pct": round(100 * mad / med_none, 2),
        "none_agent_cpu_us_per_token": median_or_none(r.get("agent_cpu_us_per_token") for r in results["none"]),
        "modes": {},
    }
    for mode in modes:
        if mode == "none":
            continue
        shares = [(a[key] - b[key]) / b[key] for a, b in zip(results[mode], results["none"])]
        extra = [a[key] - b[key] for a, b in zip(results[mode], results["none"])]
        engine = [a.get("engine_us_per_token") for a in results[mode] if a.get("engine_us_per_token") is not None]
        # within one measurement (the same machine state): our threads' CPU over vLLM's own in that measurement
        # (what is not on our threads; its main thread still runs our hot-path hooks, so an upper bound on
        # vLLM's share and a lower bound on ours)
        within = [a["ours_us_per_token"] / (a["cpu_us_per_token"] - a["ours_us_per_token"])
                  for a in results[mode] if a.get("ours_us_per_token") is not None]
        # the steadier figure with an agent: all our CPU in the frontend (hooks on vLLM's threads, timed inside
        # them, and our threads) over the rest of the frontend's, in the same measurement
        ours_all = [(a.get("hooks_us_per_token") or 0.0) + a["ours_us_per_token"] for a in results[mode]
                    if a.get("ours_us_per_token") is not None]
        ours_share = [o / (a["cpu_us_per_token"] - o) for o, a in zip(ours_all, results[mode])]
        out["modes"][mode] = {
            "share_of_vllm_frontend_pct": round(100 * statistics.median(shares), 2),
            "hooks_us_per_token": median_or_none((a.get("hooks_us_per_token") for a in results[mode]), 3),
            **hooks_figures(results[mode]),
            "ours_in_frontend_us_per_token": round(statistics.median(ours_all), 3) if ours_all else None,
            "ours_share_within_pct": round(100 * statistics.median(ours_share), 2) if ours_share else None,
            "ours_share_within_resolution_pct": round(100 * bootstrap_halfwidth(ours_share), 2) if ours_share else None,
            "resolution_pct": round(100 * bootstrap_halfwidth(shares), 2),
            "extra_us_per_token": round(statistics.median(extra), 2),
            "per_round_shares_pct": [round(100 * s, 1) for s in shares],
            "engine_us_per_token": round(statistics.median(engine), 2) if engine else None,
            "our_threads_us_per_token": round(statistics.median(a["ours_us_per_token"] for a in results[mode]), 2)
            if within else None,
            "main_thread_us_per_token": round(statistics.median(a["main_us_per_token"] for a in results[mode]), 2)
            if within else None,
            "our_threads_share_within_pct": round(100 * statistics.median(within), 2) if within else None,
            "our_threads_share_within_resolution_pct": round(100 * bootstrap_halfwidth(within), 2) if within else None,
            "agent_cpu_us_per_token": median_or_none(a.get("agent_cpu_us_per_token") for a in results[mode]),
            **with_agent(results[mode], results["none"], key),
            **at_equal_wall(results[mode], results["none"], key),
        }
    default = out["modes"].get(DEFAULT_MODE)
    # a 5 % share is told from none only where the interval around it (± half-width) stays clear of both 0
    # and 10 %, and none itself holds still between rounds at least that well
    out["resolves_5pct"] = (default is not None and default["resolution_pct"] < RESOLVE_POINTS
                            and out["none_spread_mad_pct"] < RESOLVE_POINTS)
    # the paired, within-measurement figure resolves it where its interval stays clear of the target
    out["within_resolves_5pct"] = (default is not None and default["ours_share_within_pct"] is not None
                                   and default["ours_share_within_resolution_pct"] < RESOLVE_POINTS)
    return out


DEFAULT_MODE = "default"  # the mode whose share the 5 % target is about
RESOLVE_POINTS = 2.5  # half of the 5 % target, in points


def median_or_none(values, digits: int = 2) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), digits) if known else None


def hooks_figures(mode: list[dict]) -> dict:
    """Our hooks' CPU (telemetry_modes.HookProbe) per measurement, its spread between them (range and MAD over
    the median, %: what a difference between two runs must exceed), and its median per hooked method."""
    hooks = [a["hooks_us_per_token"] for a in mode if a.get("hooks_us_per_token")]
    if not hooks:
        return {}
    med = statistics.median(hooks)
    methods = sorted({k for a in mode for k in a.get("hooks_us_per_token_by_method", {})})
    return {"hooks_spread_range_pct": round(100 * (max(hooks) - min(hooks)) / med, 1),
            "hooks_spread_mad_pct": round(100 * statistics.median(abs(h - med) for h in hooks) / med, 1),
            "hooks_gc_us_per_token": median_or_none((a.get("hooks_gc_us_per_token") for a in mode), 3),
            "hooks_us_per_token_by_method": {
                k: round(statistics.median(a.get("hooks_us_per_token_by_method", {}).get(k, 0.0) for a in mode), 3)
                for k in methods}}


def with_agent(mode: list[dict], none: list[dict], key: str) -> dict:
    """The mode's share with the agent's CPU counted (frontend + agent, over none's frontend + agent, paired
    by round), where the agent was there in every measurement of the mode."""
    def agent(r: dict) -> float:
        return r.get("agent_cpu_us_per_token") or 0.0

    if not mode or any(r.get("agent_cpu_us_per_token") is None for r in mode):
        return {"share_with_agent_pct": None, "share_with_agent_resolution_pct": None}
    shares = [(a[key] + agent(a) - b[key] - agent(b)) / (b[key] + agent(b)) for a, b in zip(mode, none)]
    return {"share_with_agent_pct": round(100 * statistics.median(shares), 2),
            "share_with_agent_resolution_pct": round(100 * bootstrap_halfwidth(shares), 2)}


# -- the OTLP sink and the control socket ------------------------------------------------------------

def start_sink() -> tuple[subprocess.Popen, str]:
    from vllm_overhead import start_sink as start

    return start()


class Control:
    def __init__(self, path: str) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self.f: Any = None

    def connect(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.path)
                self.sock, self.f = s, s.makefile("rw")
                return
            except OSError:
                s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def ask(self, **cmd: Any) -> dict:
        self.f.write(json.dumps(cmd) + "\n")
        self.f.flush()
        reply = json.loads(self.f.readline())
        if "error" in reply:
            raise RuntimeError(f"server refused {cmd}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


# -- serve -------------------------------------------------------------------------------------------

async def stream_requests(base_url: str, model: str, n: int, concurrency: int, prompt_words: int) -> int:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        async with gate:
            prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * (1 + (i % 4) * prompt_words // 4))
            stream = await client.completions.create(
                model=model, prompt=prompt, max_tokens=OUTPUT_TOKENS, temperature=0.0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            async for chunk in stream:
                if chunk.usage is not None:
                    tokens += chunk.usage.completion_tokens

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()
    return tokens


def run_serve(args: argparse.Namespace, modes: list[str], endpoint: str, pinning: Pinning) -> dict:
    from support.engine import ENV, serve_command
    from support.server import free_port
    from support.tiny_model import ensure_tiny_model

    port = free_port()
    workdir = tempfile.mkdtemp(prefix="frontend-cpu-")
    control_path = os.path.join(workdir, "control.sock")
    cmd = [sys.executable, str(HERE / "serve_with_modes.py"), "--sink", endpoint, "--",
           *serve_command(port, max_num_seqs=args.concurrency, max_num_batched_tokens=512)[2:]]
    env = {**os.environ, **ENV, "VLLM_LOGGING_LEVEL": "WARNING", "FRONTEND_CPU_CONTROL": control_path,
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE.parent / "tests")]),
           "VLLM_CPU_OMP_THREADS_BIND": pinning.engine_omp_bind}
    env.pop("OTEL_LLM_STEP_DIR", None)
    log = open(os.path.join(workdir, "server.log"), "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    control = Control(control_path)
    base_url = f"http://127.0.0.1:{port}/v1"
    model = ensure_tiny_model()
    try:
        control.connect(timeout=120)
        deadline = time.monotonic() + 600
        while True:  # the server answers once its engine is up
            if proc.poll() is not None:
                raise RuntimeError("server exited:\n" + open(log.name, errors="replace").read()[-3000:])
            try:
                import urllib.request

                with urllib.request.urlopen(f"{base_url}/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        engine_pids = children_of(proc.pid)
        print(f"serve: API server pid {proc.pid}, children {engine_pids}, pinning {pinning.describe()}", flush=True)
        agent = Agent()

        def measure(mode: str) -> dict:
            control.ask(mode=mode)
            stats0 = control.ask(stats=True)
            agent.update(stats0)
            # the engine, the sink and the agent away from the server; this process (the clients) on the server's
            # CPU (--serve-clients frontend: the engine's worker busy-polls the other one) or with the engine
            engine = [p for p in engine_pids if p not in agent.tree()]
            clients = [os.getpid()] if args.serve_clients == "others" else []
            pinned = pinning.apply(proc.pid, [*clients, *SINK_PIDS, *children_of(proc.pid), *agent.tree()], engine)
            if pinning.enabled and not clients:
                pinned["client_threads"] = pin_threads(os.getpid(), pinning.frontend_cpus)
            a0, h0 = agent.threads_ns(), control.ask(hooks=True)["ns"]
            c0, e0, t0 = thread_cpu_ns(proc.pid), tree_cpu_ns(engine), time.perf_counter()
            tokens = asyncio.run(stream_requests(base_url, model, args.requests, args.concurrency, args.prompt_words))
            control.ask(flush=True)
            c1, e1, wall = thread_cpu_ns(proc.pid), tree_cpu_ns(engine), time.perf_counter() - t0
            h1 = control.ask(hooks=True)["ns"]
            a1 = agent.threads_ns()
            reply = control.ask(stats=True)
            split = split_cpu(c0, c1, proc.pid, set(control.ask(threads=True)["ours"]))
            expected = args.requests * OUTPUT_TOKENS
            if tokens != expected:
                raise RuntimeError(f"{tokens} tokens streamed, {expected} expected")
            return {"cpu_us_per_token": sum(split.values()) / 1e3 / tokens,
                    "main_us_per_token": split["main"] / 1e3 / tokens, "ours_us_per_token": split["ours"] / 1e3 / tokens,
                    "engine_us_per_token": (e1 - e0) / 1e3 / tokens, "hooks_us_per_token": (h1 - h0) / 1e3 / tokens,
                    "tokens_per_s": tokens / wall, "tokens": tokens,
                    **step_counts(stats0, reply), **agent_figures(agent, a0, a1, tokens), **pinned}

        return interleave("serve", modes, measure, args.rounds)
    finally:
        control.close()
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        except Exception:
            os.killpg(proc.pid, 9)


# -- offline -----------------------------------------------------------------------------------------

def run_offline(args: argparse.Namespace, modes: list[str], endpoint: str, pinning: Pinning) -> dict:
    from support.engine import engine_args, prepare_env

    from telemetry_modes import ModeSwitch
    from vllm_overhead import providers

    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = pinning.engine_omp_bind  # read by the engine's worker at its start
    prepare_env()
    os.environ.pop("OTEL_LLM_STEP_DIR", None)
    from vllm import LLM, SamplingParams

    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    from telemetry_modes import HookProbe

    hooks = HookProbe()
    if args.probe:  # off: the whole-process figure without the probe's own CPU in it (no paired figure then)
        hooks.install()  # before any instrumentation: the wrappers it builds are the probed ones
    switch = ModeSwitch(*providers(endpoint), endpoint)
    llm = switch.build(lambda: LLM(**engine_args(max_num_seqs=args.concurrency, max_num_batched_tokens=512)))
    switch.processors.append(llm.llm_engine.output_processor)
    engine_pids = [p for p in children_of(os.getpid()) if p not in SINK_PIDS]
    print(f"offline: engine processes {engine_pids}, pinning {pinning.describe()}", flush=True)
    agent = Agent()
    prompts = [{"prompt_token_ids": [5 + (i * 31 + j) % 400 for j in range(16 + (i % 8) * 8)]}
               for i in range(args.requests)]
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0.0)

    def measure(mode: str) -> dict:
        switch.enter(mode)
        telemetry = VLLMInstrumentor().telemetry
        stats0 = dict(telemetry.stats()) if telemetry is not None else {}
        agent.update(stats0)
        # this process (the frontend, our threads) on its own; the engine, the sink and the agent elsewhere
        engine = [p for p in engine_pids if p not in agent.tree()]
        pinned = pinning.apply(os.getpid(), [*SINK_PIDS, *children_of(os.getpid()), *agent.tree()], engine)
        try:
            a0 = agent.threads_ns()
            c0, e0, t0 = time.process_time_ns(), tree_cpu_ns(engine), time.perf_counter()
            threads0, h0, g0, n0 = thread_cpu_ns(os.getpid()), hooks.ns, collector.ns, collector.collections()
            m0, hg0 = dict(hooks.by_method), hooks.gc_ns
            outs = llm.generate(prompts, params, use_tqdm=False)
            f0 = time.thread_time_ns()
            switch.flush()
            flush_ns = time.thread_time_ns() - f0
            threads1, h1, g1, n1 = thread_cpu_ns(os.getpid()), hooks.ns, collector.ns, collector.collections()
            m1, hg1 = dict(hooks.by_method), hooks.gc_ns
            c1, e1, wall = time.process_time_ns(), tree_cpu_ns(engine), time.perf_counter() - t0
            a1 = agent.threads_ns()
            split = split_cpu(threads0, threads1, os.getpid(), our_threads())
            stats1 = dict(telemetry.stats()) if telemetry is not None else {}  # (the agent's, where one runs)
        finally:
            switch.leave()
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        assert tokens == args.requests * OUTPUT_TOKENS
        return {"cpu_us_per_token": (c1 - c0) / 1e3 / tokens, "main_us_per_token": split["main"] / 1e3 / tokens,
                "ours_us_per_token": split["ours"] / 1e3 / tokens, "engine_us_per_token": (e1 - e0) / 1e3 / tokens,
                "hooks_us_per_token": (h1 - h0) / 1e3 / tokens, "tokens_per_s": tokens / wall, "tokens": tokens,
                "hooks_us_per_token_by_method": {k: (v - m0.get(k, 0)) / 1e3 / tokens for k, v in m1.items() if v != m0.get(k, 0)},
                # collections that started inside a hook (left out of hooks_us_per_token; in gc_us_per_token)
                "hooks_gc_us_per_token": (hg1 - hg0) / 1e3 / tokens,
                "gc_us_per_token": (g1 - g0) / 1e3 / tokens, "gc_collections": [b - a for a, b in zip(n0, n1)],
                # the measurement's closing flush (counted in it: the frontend's own exports' CPU)
                "flush_us_per_token": flush_ns / 1e3 / tokens,
                **step_counts(stats0, stats1), **agent_figures(agent, a0, a1, tokens), **pinned}

    collector = CollectorTime()
    try:
        out = interleave("offline", modes, measure, args.rounds)
    finally:
        collector.close()
    out["hook_probe_floor_ns"] = hooks.floor_ns  # the probe's own CPU taken off each timed call
    return out


class CollectorTime:
    """The CPU this process's garbage collector spends, on whichever thread runs it (``gc.callbacks``), and
    its collections by generation: work our allocations can add to vLLM's frontend outside our own hooks."""

    def __init__(self) -> None:
        self.ns = 0
        self._started = 0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.thread_time_ns()
        elif self._started:
            self.ns += time.thread_time_ns() - self._started
            self._started = 0

    @staticmethod
    def collections() -> list[int]:
        return [g["collections"] for g in gc.get_stats()]

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


# the telemetry's stats() counts of steps (the agent's pipeline's where an agent runs), per measurement
STEP_COUNTS = {"engine_steps": "steps_recorded", "engine_steps_dropped": "engine_steps_dropped",
               "token_times_unplaced": "token_times_unplaced"}


def step_counts(before: dict, after: dict) -> dict:
    """What ``STEP_COUNTS`` grew by between two ``stats()``: ``None`` where either lacks it (mode ``none``)."""
    out = {}
    for name, key in STEP_COUNTS.items():
        a, b = before.get(key), after.get(key)
        out[name] = b - a if isinstance(a, int) and isinstance(b, int) else None
    return out


def agent_figures(agent: Agent, before: dict, after: dict, tokens: int) -> dict:
    """The agent's CPU in one measurement, or ``None`` where there was no agent at its end."""
    return {"agent_pid": agent.pid or None,
            "agent_cpu_us_per_token": delta_ns(before, after) / 1e3 / tokens if agent.pid else None}


# -- the interleaved run -----------------------------------------------------------------------------

def interleave(name: str, modes: list[str], measure, rounds: int) -> dict:
    for mode in modes:  # warm-up: every mode's code paths once, not measured
        measure(mode)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    load = [os.getloadavg()[0]]
    rng = random.Random(0)
    order = list(modes)
    for r in range(rounds):
        rng.shuffle(order)
        for mode in order:
            res = measure(mode)
            results[mode].append(res)
            agent = res.get("agent_cpu_us_per_token")
            print(f"{name} round {r + 1} {mode:14s} {res['cpu_us_per_token']:7.2f} us/token frontend  "
                  f"{res['engine_us_per_token']:8.1f} engine  {res['tokens_per_s']:6.0f} tok/s  agent "
                  f"{'-' if agent is None else f'{agent:.2f}'}", flush=True)
        load.append(os.getloadavg()[0])
    summary = summarize(results, modes)
    steps = [r["engine_steps"] for m in modes for r in results[m] if r.get("engine_steps")]
    summary["engine_steps_per_measurement_median"] = statistics.median(steps) if steps else None
    for name in ("engine_steps_dropped", "token_times_unplaced"):  # over every measured round: 0 where all is well
        counted = [r[name] for m in modes for r in results[m] if r.get(name) is not None]
        summary[name] = sum(counted) if counted else None
    summary["load_average_1min_per_round"] = load
    summary["raw"] = results
    return summary


SINK_PIDS: set[int] = set()


def frontend_args(args: argparse.Namespace, frontend: str) -> argparse.Namespace:
    """``args`` with ``--rounds`` and ``--requests`` replaced by the frontend's own, where given."""
    rounds, requests = getattr(args, f"{frontend}_rounds"), getattr(args, f"{frontend}_requests")
    return argparse.Namespace(**{**vars(args), "rounds": args.rounds if rounds is None else rounds,
                                 "requests": args.requests if requests is None else requests})


def main() -> None:
    global OUTPUT_TOKENS
    ap = argparse.ArgumentParser()
    ap.add_argument("--frontends", default="serve,offline")
    ap.add_argument("--modes", default="none,default,full,native")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=64, help="requests per measurement")
    for frontend in ("serve", "offline"):  # each frontend resolves at its own length: these override the two above
        ap.add_argument(f"--{frontend}-rounds", type=int, default=None, help=f"rounds for {frontend} (default --rounds)")
        ap.add_argument(f"--{frontend}-requests", type=int, default=None,
                        help=f"requests per measurement for {frontend} (default --requests)")
    ap.add_argument("--concurrency", type=int, default=32, help="streaming clients at once (serve); max_num_seqs")
    ap.add_argument("--prompt-words", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=OUTPUT_TOKENS, help="output tokens a request")
    ap.add_argument("--out", default="frontend_cpu.json")
    ap.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                    help="offline: time our hooks inside each measurement (the paired figure); --no-probe leaves "
                         "the probe's own CPU out of the whole-process figure")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="the frontend on one CPU, everything else on the others (--no-pin: the scheduler's choice)")
    ap.add_argument("--engine-omp-bind", default=None,
                    help="VLLM_CPU_OMP_THREADS_BIND for the engine's worker (default: the other CPUs when pinned, "
                         "nobind when not)")
    ap.add_argument("--serve-clients", choices=("frontend", "others"), default="frontend",
                    help="pinned serve: the streaming clients (this process) on the API server's CPU (default: "
                         "the engine's worker busy-polls the other CPU for a second after each step) or on the others")
    ap.add_argument("--engine-nice", type=int, default=0,
                    help="niceness of the engine's model workers (a worker busy-polls for a second after each "
                         "step: niced, it yields its core to the EngineCore, the clients and the agent)")
    args = ap.parse_args()
    OUTPUT_TOKENS = args.tokens
    modes = args.modes.split(",")
    if modes[0] != "none":
        raise SystemExit("--modes must start with none (the denominator)")
    from telemetry_modes import HookProbe

    pinning = Pinning.choose(args.pin, args.engine_omp_bind, args.engine_nice)
    sink, endpoint = start_sink()
    SINK_PIDS.add(sink.pid)
    frontends = args.frontends.split(",")
    for frontend in frontends:
        if frontend not in ("serve", "offline"):
            raise SystemExit(f"unknown frontend {frontend!r}")
    lengths = {frontend: frontend_args(args, frontend) for frontend in frontends}
    if any(a.rounds < 1 or a.requests < 1 for a in lengths.values()):
        raise SystemExit("rounds and requests must be at least 1")
    out: dict[str, Any] = {
        "workload": "; ".join(f"{frontend}: {a.requests} requests x {OUTPUT_TOKENS} output tokens a measurement"
                              for frontend, a in lengths.items())
                    + f", concurrency {args.concurrency}, tiny model, CPU build",
        "rounds": {frontend: a.rounds for frontend, a in lengths.items()},
        "requests": {frontend: a.requests for frontend, a in lengths.items()},
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "pinning": {**pinning.describe(), "serve_clients": args.serve_clients},
        "offline_hook_probe": args.probe,
        "hook_probe_times_one_call_in": HookProbe.DEFAULT_EVERY,
    }
    try:
        for frontend, fargs in lengths.items():
            run = run_serve if frontend == "serve" else run_offline
            out[frontend] = run(fargs, modes, endpoint, pinning)
        from vllm_overhead import engine_hooks_us_per_step

        out["engine_hooks_cpu_per_step"] = engine_hooks_us_per_step()
    finally:
        sink.terminate()
    # the agent's CPU per token, median per frontend and mode (None: no agent in that mode's measurements)
    out["agent_cpu_us_per_token"] = {
        frontend: {"none": out[frontend]["none_agent_cpu_us_per_token"],
                   **{mode: m["agent_cpu_us_per_token"] for mode, m in out[frontend]["modes"].items()}}
        for frontend in ("serve", "offline") if frontend in out}
    for frontend in ("serve", "offline"):
        if frontend not in out:
            continue
        s = out[frontend]
        print(f"\n{frontend}: vLLM's frontend {s['none_us_per_token_median']} us/token (none); spread of none "
              f"between rounds: range {s['none_spread_range_pct']} %, MAD {s['none_spread_mad_pct']} %; "
              f"resolves a 5 % target: {s['resolves_5pct']}; agent {out['agent_cpu_us_per_token'][frontend]} us/token")
        for mode, m in s["modes"].items():
            print(f"  {mode:14s} {m['share_of_vllm_frontend_pct']:6.2f} % +/- {m['resolution_pct']:.2f} "
                  f"(+{m['extra_us_per_token']} us/token; rounds {m['per_round_shares_pct']}); our threads "
                  f"{m['our_threads_us_per_token']} us/token = {m['our_threads_share_within_pct']} % +/- "
                  f"{m['our_threads_share_within_resolution_pct']} of the rest, within each measurement"
                  + (f"; with the agent {m['share_with_agent_pct']} % +/- {m['share_with_agent_resolution_pct']}"
                     if m["share_with_agent_pct"] is not None else "")
                  + f"; all ours in the frontend (hooks {m['hooks_us_per_token']} us/token) "
                    f"{m['ours_share_within_pct']} % +/- {m['ours_share_within_resolution_pct']} within"
                  + f"; at equal wall time {m['share_at_equal_wall_pct']} % +/- "
                    f"{m['share_at_equal_wall_resolution_pct']} (wall {m.get('wall_difference_median_pct')} %)")
    print(f"EngineCore step hooks (batch 64): {out.get('engine_hooks_cpu_per_step')}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(out, indent=1))
    print(f"pinning: {out['pinning']}")
    print(f"wrote {RESULTS / args.out}")


if __name__ == "__main__":
    main()
