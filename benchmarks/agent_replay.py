"""The agent's CPU per token, engine-free: a continuous-batching workload replayed through the agent's own code.

What runs is the agent process's code, in this process: ``otel_llm.agent.process.Agent`` with vLLM's step
receiver (``StepReceiver``, handed the shared-memory ring by the EngineCore's own ``SocketSink``), the default
options, exporting over OTLP/HTTP to a sink process that discards. ``--path one`` (the default, vLLM's Python
frontend on the one path): the EngineCore's ``RequestStart`` and ``RequestFinish`` records go through the
sink with the steps (a finish queued before its request's last step, as ``update_from_output`` sends it),
and the frontend's ``RequestEnrichment`` of each request into the agent's message ring once the last output
reached it. ``--path messages``: the frontend's positional ``START`` and ``FACTS`` messages into the message
ring instead, as ``AgentLink`` writes them. This process plays the EngineCore and the frontend too, but only
their writes are made here (the records are encoded before the measurement): the CPU measured is the
agent's work: reading the rings, decoding the records, joining steps to requests, the tail decision, token
times, engine time, the verdict, metrics for every request, spans for the kept ones.

The workload is vLLM's scheduler in miniature: ``--concurrency`` clients each send a request as soon as
their last one finished (closed loop: the API server under streaming clients), prompts of 16-72 tokens,
``--tokens`` output tokens each (``ignore_eos``); a step runs every running request's decode token, then
prompt chunks within ``--budget`` tokens (chunked prefill). The agent takes a turn every ``--steps-per-turn``
steps (on this machine's CPU engine ~250 steps a second at batch 32: 5 a tick of 20 ms, 25 of 100 ms), and
its materializer thread finishes its jobs before the next turn, as it does while the agent sleeps.
Engine stamps are a virtual clock (a step's duration from its tokens); nothing waits.

Measured: this process's CPU (every thread: the agent's loop, its materializer, the SDK's exporters;
``CLOCK_PROCESS_CPUTIME_ID``) over the replay and a closing flush, per token, in ``--rounds`` rounds on one
agent after a warm-up round; the median, the spread (min-max) and the load average. ``--profile``: one more
round under ``cProfile`` with the materializer's jobs run on the loop's thread (so the profile sees them),
its top functions printed. ``--split``: the thread CPU spent inside each of the agent's main functions (``SPLIT``,
nested ones counted in each, their threads' own clocks around each call: no profiler's cost per small call),
per token, each round and their median. ``--device h100`` gives the step diagnosis a GPU's peaks (the roofline's split of
a step's time by each request's predicted work, as on a GPU deployment).

Run: ./run bench benchmarks/core_costs.py --only agent (the defaults), or on its own for its options:
     .venv/bin/python benchmarks/agent_replay.py [--requests 2048] [--rounds 5] [--profile] [--split] [--device NAME]
Writes benchmarks/results/agent_cpu.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import random
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

PROMPTS = (16, 72)  # prompt tokens, drawn uniformly (frontend_cpu.py's offline prompts span the same)


@dataclass
class Running:
    rid: str
    prompt: int
    arrival_wall: float
    queued: float
    computed: int = 0
    outputs: int = 0
    scheduled: float = 0.0
    first: float = 0.0


class Workload:
    """The scheduler in miniature: ``events()`` yields, in order, what the agent receives: ``("message",
    bytes)`` (the frontend's, into the message ring), ``("engine", bytes)`` (an EngineCore's request record,
    through the sink), ``("step", payload)``. ``one``: the one path's records; else the frontend's messages."""

    def __init__(self, requests: int, concurrency: int, tokens: int, budget: int, seed: int, one: bool = True) -> None:
        self.requests, self.concurrency, self.tokens, self.budget = requests, concurrency, tokens, budget
        self.one = one
        self.rng = random.Random(seed)
        self.clock_end = 0.0  # the last step's end (engine monotonic seconds) of the events made so far

    def events(self, clock0: float, wall0: float, first_id: int) -> list[tuple[str, Any]]:
        from otel_llm.agent import protocol, records
        from otel_llm.core.finish_facts import EngineStats, FinishFacts
        from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestTimeline
        from otel_llm.instrumentation.vllm.step_wire import Shares, StepPayload

        rng, out, one = self.rng, [], self.one
        now = clock0
        sent = 0
        waiting: list[Running] = []
        running: list[Running] = []
        step_id = first_id
        last_end: float | None = None

        def arrive() -> None:
            nonlocal sent
            rid = f"cmpl-{rng.getrandbits(64):016x}-0"
            r = Running(rid, rng.randint(*PROMPTS), wall0 + (now - clock0), now)
            if one:
                out.append(("engine", records.encode(records.RequestStart(
                    request_id=rid, arrival=r.arrival_wall, queued=now, prompt_tokens=r.prompt, external_id=rid,
                    model="tiny", sampling={"gen_ai.request.max_tokens": self.tokens}, enriched=True))))
            else:
                t = RequestTimeline(rid, r.arrival_wall, model="tiny", response_id=rid, input_tokens=r.prompt)
                t.steps_give_tokens = True
                out.append(("message", protocol.start_message(t)))
            waiting.append(r)
            sent += 1

        for _ in range(min(self.concurrency, self.requests)):
            arrive()
        while running or waiting:
            left = self.budget
            shares: list[tuple[Running, int]] = []
            for r in running:  # decodes first, then the prompt chunks in progress
                if r.outputs:
                    shares.append((r, 1))
                    left -= 1
            for r in running:
                if not r.outputs and left > 0:
                    n = min(r.prompt - r.computed, left)
                    shares.append((r, n))
                    left -= n
            while waiting and left > 0 and len(running) < self.concurrency:
                r = waiting.pop(0)
                r.scheduled = now
                running.append(r)
                n = min(r.prompt, left)
                shares.append((r, n))
                left -= n
            tokens = [n for _, n in shares]
            start = now
            duration = 0.004 + 0.00002 * sum(tokens) + 0.0002 * len(shares)
            end = now = start + duration
            ids = [r.rid for r, _ in shares]
            computed = [r.computed for r, _ in shares]
            no_output = [i for i, (r, _) in enumerate(shares) if not r.outputs]
            step_id += 1
            payload = StepPayload(step_id, start, end, len(running), len(waiting), 0, 0.25,
                                  Shares(ids, None if all(n == 1 for n in tokens) else tokens, computed, no_output,
                                         (), (), ()),
                                  0, 1e-5, duration, 1e-5, (start - last_end) if last_end is not None else None,
                                  duration)
            last_end = end
            done = []
            for r, n in shares:
                r.computed += n
                if r.computed >= r.prompt + r.outputs:
                    r.outputs += 1
                    if r.outputs == 1:
                        r.first = end
                    if r.outputs >= self.tokens:
                        done.append(r)
            wall_end = wall0 + (end - clock0)
            if one:  # the engine's finish is sent in update_from_output: before its last step's record
                for r in done:
                    out.append(("engine", records.encode(records.RequestFinish(
                        request_id=r.rid, reason="length", arrival=r.arrival_wall, queued=r.queued, end=end,
                        end_wall=wall_end, prompt_tokens=r.prompt, output_tokens=r.outputs, external_id=r.rid,
                        model="tiny", enriched=True))))
            out.append(("step", payload))
            for r in done:
                running.remove(r)
                if one:  # the frontend's, once the last output reached it
                    out.append(("message", records.encode(records.RequestEnrichment(
                        request_id=r.rid, operation="text_completion", response_id=r.rid, model="tiny",
                        reason="length", output_tokens=r.outputs, output_characters=4 * r.outputs,
                        first_output=wall0 + (r.first - clock0), last_output=wall_end, end=wall_end))))
                else:
                    stats = EngineStats(r.arrival_wall, r.queued, r.scheduled, r.first, end, r.first - r.queued,
                                        r.outputs, 0)
                    facts = FinishFacts(r.rid, "length", wall_end, [(QUEUED, r.queued), (SCHEDULED, r.scheduled)],
                                        None, 0, 4 * r.outputs, None, "tiny", "text_completion", "vllm", r.prompt,
                                        r.arrival_wall, stats)
                    out.append(("message", protocol.facts_message(facts)))
                if sent < self.requests:
                    arrive()
        self.clock_end = now
        return out


class Replay:
    """One agent (the agent process's ``Agent``, in this process) and the writers that feed it."""

    def __init__(self, endpoint: str, device: str | None) -> None:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
        from otel_llm import shm_ring
        from otel_llm.agent import destinations, protocol
        from otel_llm.agent.link import SEND_BUFFER
        from otel_llm.agent.process import Agent
        from otel_llm.core.config import Config
        from otel_llm.core.diagnosis.anatomy import EngineFacts
        from otel_llm.core.providers import _sdk_meter_provider, _sdk_tracer_provider
        from otel_llm.agent.process import tune_gc
        from otel_llm.instrumentation.vllm.step_transport import SocketSink, StepReceiver, open_step_dir

        tp, mp = _sdk_tracer_provider(), _sdk_meter_provider()  # as otel-llm builds them from OTEL_*
        dest = destinations.describe(tp, mp)
        tp.shutdown()
        mp.shutdown()
        if dest is None:
            raise SystemExit("no OTLP destinations to replay into")
        self.step_dir = open_step_dir().path
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.frontend_sock = mine
        self.agent = Agent(theirs, lambda guard: StepReceiver(self.step_dir, guard))
        self.agent.open_receiver()
        self.messages = shm_ring.RingWriter(SEND_BUFFER, name="otel-llm-agent")
        self.agent.ring = shm_ring.RingReader(self.messages.announcement(), os.dup(self.messages._fd))
        config = Config.resolve({"device": device} if device else {}, environ={})
        self.agent.configure(protocol.AgentConfig(config, dest))
        shape = _tiny_shape()
        self.agent.engines.append(EngineFacts(shape, False))  # as the frontend's ENGINE message gives it
        self.agent.apply_engine(self.agent.engines[-1])
        self.sink = SocketSink(self.step_dir)
        tune_gc()  # as the agent process does at its start

    def encode(self, events: list[tuple[str, Any]], steps_per_turn: int) -> list[list[tuple[str, Any]]]:
        """The events cut into turns: each turn's messages and records encoded, its steps as they are
        (written to the EngineCore's ring when the turn is replayed: the sink's encoding is the engine's)."""
        turns, current, steps = [], [], 0
        for kind, value in events:
            current.append((kind, value))
            if kind == "step":
                steps += 1
                if steps % steps_per_turn == 0:
                    turns.append(current)
                    current = []
        if current:
            turns.append(current)
        return turns

    def replay(self, turns: list[list[tuple[str, Any]]], profile: cProfile.Profile | None = None) -> tuple[int, int]:
        """Every turn written then taken by the agent; (CPU ns of the agent's work, steps dropped)."""
        agent, write, sink = self.agent, self.messages.write, self.sink
        materializer = agent.pipeline.materializer
        writes = 0  # the frontend's and the EngineCore's writes, on this thread: not the agent's CPU
        dropped = 0
        thread_ns = time.thread_time_ns
        total0 = time.process_time_ns()  # every thread: the materializer's and the exporters' work whenever it runs
        for turn in turns:
            w0 = thread_ns()
            for kind, value in turn:
                if kind == "step":
                    sink(value)
                elif kind == "engine":
                    sink.send_request(value)
                elif not write(value):
                    dropped += 1
            writes += thread_ns() - w0
            if profile is not None:
                profile.enable()
            agent.receive()
            agent.turn()
            if profile is not None:
                profile.disable()
            # the agent sleeps between its turns, and its materializer thread is done by the next (unpaced,
            # it would fall behind: more held steps to scan, spans refused by its full queue)
            materializer.flush(60.0)
        w0 = thread_ns()
        sink.flush_requests()  # the engine went idle: what it queued goes
        writes += thread_ns() - w0
        agent.receive()
        agent.turn(final=True)
        # the finishes held for an enrichment that comes, all of them, at the turns just taken (none is late)
        ok = agent.pipeline.flush(60.0)
        cpu = time.process_time_ns() - total0 - writes
        if not ok:
            raise SystemExit("the agent's pipeline did not flush")
        return cpu, dropped + sink.dropped + sink.requests_dropped

    def close(self) -> None:
        from otel_llm.instrumentation.vllm.step_transport import remove_if_empty

        self.agent.close_pipeline()
        self.sink.close()
        if self.agent.receiver is not None:
            self.agent.receiver.close()
        remove_if_empty(self.step_dir)


# the agent's main functions, for --split: (module, class or None, function)
SPLIT = (
    ("otel_llm.agent.process", "Agent", "receive"), ("otel_llm.agent.process", "Agent", "read_steps"),
    ("otel_llm.agent.process", "Agent", "take"), ("otel_llm.agent.process", "Agent", "engine_finish"),
    ("otel_llm.agent.process", "Agent", "finish"), ("otel_llm.agent.engine_requests", "EngineRequests", "timeline"),
    ("otel_llm.agent.engine_requests", "EngineRequests", "facts"),
    ("otel_llm.agent.engine_requests", "Enrichments", "ready"),
    ("otel_llm.agent.engine_requests", "EngineRequests", "settle"),
    ("otel_llm.agent.engine_requests", None, "stamps_from_steps"), ("otel_llm.agent.engine_requests", None, "settle"),
    ("otel_llm.agent.records", None, "decode"), ("otel_llm.instrumentation.vllm.step_wire", None, "decode"),
    ("otel_llm.core.pipeline", "Pipeline", "add_step"), ("otel_llm.core.pipeline", "Pipeline", "finish"),
    ("otel_llm.core.pipeline", "Pipeline", "decide"), ("otel_llm.core.pipeline", "Pipeline", "_materialize"),
    ("otel_llm.core.pipeline", "Pipeline", "_materialize_request"), ("otel_llm.core.pipeline", "Pipeline", "_own_steps"),
    ("otel_llm.core.pipeline", None, "token_times"), ("otel_llm.core.pipeline", None, "engine_time"),
    ("otel_llm.core.pipeline", None, "interference_caused"), ("otel_llm.core.pipeline", "Pipeline", "_add_gaps"),
    ("otel_llm.core.pipeline", "Pipeline", "_explain"), ("otel_llm.core.pipeline", "Pipeline", "_settle_steps"),
    ("otel_llm.core.metrics", "RequestMetrics", "record"), ("otel_llm.core.spans", "SpanBuilder", "request"),
    ("otel_llm.core.diagnosis.anatomy", "StepDiagnosis", "record"),
)


class Split:
    """Thread CPU inside each of ``SPLIT``'s functions, while installed."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        import importlib

        for module, cls, name in SPLIT:
            owner = getattr(importlib.import_module(module), cls) if cls else importlib.import_module(module)
            original = getattr(owner, name, None)
            if original is None:  # (a function another version of the agent does not have)
                continue
            self._undo.append((owner, name, original))
            label = f"{cls}.{name}" if cls else f"{module.rsplit('.', 1)[-1]}.{name}"
            setattr(owner, name, self._timed(label, original))

    def _timed(self, label: str, function: Any) -> Any:
        ns, clock = self.ns, time.thread_time_ns
        ns[label] = 0

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return function(*args, **kwargs)
            finally:
                ns[label] += clock() - t0
        return timed

    def take(self, tokens: int) -> dict[str, float]:
        """µs a token in each since the last take."""
        out = {label: n / 1e3 / tokens for label, n in self.ns.items()}
        for label in self.ns:
            self.ns[label] = 0
        return out

    def remove(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def _tiny_shape() -> Any:
    """The test model's shape (tests/support/tiny_model.py's Llama), as the vLLM adapter reads it."""
    from otel_llm.core.diagnosis.roofline import ModelShape

    return ModelShape(layers=2, hidden=128, heads=2, kv_heads=1, head_dim=64, intermediate=256, vocab=512)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2048, help="requests a round")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens a request")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--budget", type=int, default=512, help="tokens a step (max_num_batched_tokens)")
    ap.add_argument("--steps-per-turn", type=int, default=25, help="steps a turn (25: 100 ms at 250 steps a second)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default=None, help="the step diagnosis's device (its peaks: the roofline split)")
    ap.add_argument("--profile", action="store_true", help="one more round under cProfile; its top functions")
    ap.add_argument("--split", action="store_true", help="the thread CPU inside each of the agent's main functions")
    ap.add_argument("--path", choices=("one", "messages"), default="one",
                    help="one: the EngineCore's request records and the frontend's enrichment (the default path); "
                         "messages: the frontend's START and FACTS messages")
    ap.add_argument("--out", default="agent_cpu.json")
    args = ap.parse_args(argv)
    from vllm_overhead import start_sink

    sink, endpoint = start_sink()
    replay = None
    split = Split() if args.split else None
    splits: list[dict[str, float]] = []
    try:
        if split is not None:  # before the agent's pipeline is built: its materializer keeps the bound method
            split.install()
        replay = Replay(endpoint, args.device)
        workload = Workload(args.requests, args.concurrency, args.tokens, args.budget, seed=1, one=args.path == "one")
        load = [os.getloadavg()[0]]
        rounds: list[dict[str, Any]] = []
        step_base = 0
        for r in range(args.rounds + 1 + args.profile):
            # the engine's clock runs on from the last round's last step (a round's virtual time outruns the
            # real clock): a monotonic clock that went back would make each round's first requests read the
            # previous round's steps as steps they waited through
            clock0 = max(time.monotonic(), workload.clock_end + 0.01)
            events = workload.events(clock0, time.time() + (clock0 - time.monotonic()), step_base)
            steps = sum(kind == "step" for kind, _ in events)
            step_base += steps
            turns = replay.encode(events, args.steps_per_turn)
            profiling = args.profile and r == args.rounds + 1
            profile = cProfile.Profile(time.thread_time_ns, 1e-9) if profiling else None
            materializer = replay.agent.pipeline.materializer
            if profiling:  # its jobs on this thread, where the profile sees them
                submit = materializer.submit
                materializer.submit = lambda job: (replay.agent.pipeline._materialize(job), True)[1]
            cpu, dropped = replay.replay(turns, profile)
            if profiling:
                materializer.submit = submit
                stats = pstats.Stats(profile)
                stats.sort_stats("tottime").print_stats(25)
                stats.sort_stats("cumulative").print_stats(30)
                continue
            tokens = args.requests * args.tokens
            if split is not None:
                parts = split.take(tokens)
                if r > 0:
                    splits.append(parts)
                    print("  " + "  ".join(f"{k} {v:.3f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
            row = {"cpu_us_per_token": cpu / 1e3 / tokens, "cpu_us_per_step": cpu / 1e3 / steps,
                   "cpu_us_per_request": cpu / 1e3 / args.requests, "steps": steps, "tokens": tokens,
                   "dropped": dropped}
            if r == 0:
                print(f"warm-up: {row['cpu_us_per_token']:.2f} us/token", flush=True)
                continue
            rounds.append(row)
            load.append(os.getloadavg()[0])
            print(f"round {r}: {row['cpu_us_per_token']:.3f} us/token, {row['cpu_us_per_step']:.1f} us/step, "
                  f"{row['cpu_us_per_request']:.0f} us/request ({steps} steps, dropped {dropped})", flush=True)
        stats = replay.agent.stats()
    finally:
        if split is not None:
            split.remove()
        if replay is not None:
            replay.close()
        sink.terminate()
        sink.wait(10)
    per_token = [r["cpu_us_per_token"] for r in rounds]
    out = {
        "workload": f"{args.requests} requests a round x {args.tokens} output tokens, prompts {PROMPTS[0]}-{PROMPTS[1]} "
                    f"tokens, {args.concurrency} clients (closed loop), {args.budget} tokens a step, a turn every "
                    f"{args.steps_per_turn} steps, default options, path {args.path}"
                    + (f", device {args.device}" if args.device else "") + "; the agent's code in one process",
        "machine": f"{platform.machine()} {os.cpu_count()} cores", "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": len(rounds),
        "cpu_us_per_token_median": round(statistics.median(per_token), 3),
        "cpu_us_per_token_spread": [round(min(per_token), 3), round(max(per_token), 3)],
        "cpu_us_per_step_median": round(statistics.median(r["cpu_us_per_step"] for r in rounds), 2),
        "cpu_us_per_request_median": round(statistics.median(r["cpu_us_per_request"] for r in rounds), 1),
        "requests_kept": stats.get("requests_kept"), "requests_spans_dropped": stats.get("requests_spans_dropped"),
        "steps_recorded": stats.get("steps_recorded"),
        "token_times_unplaced": stats.get("token_times_unplaced"), "agent_errors": stats.get("agent_errors"),
        "agent_enriched": stats.get("agent_enriched"), "agent_enrichments_missing": stats.get("agent_enrichments_missing"),
        "agent_engine_finishes": stats.get("agent_engine_finishes"), "agent_orphans": stats.get("agent_orphans"),
        "load_average_1min_per_round": [round(x, 2) for x in load],
        "raw": rounds,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "raw"}, indent=1))
    if splits:
        medians = {k: statistics.median(p[k] for p in splits) for k in splits[0]}
        print("thread CPU inside each function, µs a token (median of the rounds; nested ones counted in each):")
        for k, v in sorted(medians.items(), key=lambda kv: -kv[1]):
            print(f"  {k:32s} {v:.3f}")
    if args.profile or args.split:
        return  # a profiled or split run's figures include the profiler's or the wrappers' cost: not written
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS / args.out}")


if __name__ == "__main__":
    main()
