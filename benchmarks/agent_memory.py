"""The agent process's memory over a long run: does its RSS level off, or grow with the requests it served?

Workload: ``--requests`` synthetic requests (default 100,000, ``--tokens`` output tokens each, default 128)
fed by a frontend ``Pipeline`` with default options through an ``AgentLink`` to one real agent (vLLM's,
``python -m otel_llm.instrumentation.vllm.agent_process``), which joins, decides, records metrics, builds
spans and exports them over OTLP/HTTP to a sink process that discards them. No engine. Two paths:

* ``--path steps`` (the default, as vLLM's adapter runs by default with an agent): this process also
  plays the EngineCore, writing every step through the EngineCore's own sink (``SocketSink``: the
  shared-memory ring the agent's step receiver is handed), ``--concurrency`` requests a cohort, a prefill
  step then one decode step a token; each request's start has ``steps_give_tokens`` and its finish is the
  engine's own numbers (``FinishFacts``), so the agent takes token times from the steps and holds the step
  window, the joins and the requests' state: what grows with traffic there, if anything does;
* ``--path stamped``: a start and a finish with stamped token times (an engine without statistics).

Queue times vary from request to request (a seeded generator), so the tail decision keeps some requests
for a cause beside the 5 % baseline.

Paced so that the channels do not drop (a flush every ``--batch`` requests: the agent catches up, its
exports go out); drops are counted and reported all the same (the link's, and the steps the EngineCore's
sink could not write). The agent's RSS (``stats()["agent_rss_bytes"]``, from its ``/proc/self/statm``)
is sampled every ``--every`` requests, after that batch's flush. The agent's CPU (schedstat) and this
process's are reported per request.

Run: ./run bench benchmarks/agent_memory.py [--requests 100000] [--tokens 128] [--path steps|stamped]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))


def stamped_request(rng: random.Random, i: int, tokens: int) -> tuple[Any, Any]:
    from otel_llm.core.summary import RequestSummary
    from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestTimeline

    rid = f"req-{i}"
    queue, prefill, itl = rng.expovariate(1 / 0.02), 0.02 + rng.random() * 0.05, 0.01 + rng.random() * 0.01
    decode = itl * (tokens - 1)
    e2e = queue + prefill + decode
    now = time.monotonic()
    base = now - e2e
    t = RequestTimeline(rid, time.time() - e2e, model="m", response_id=rid, input_tokens=64)
    t.events += [(QUEUED, base), (SCHEDULED, base + queue)]
    first = base + queue + prefill
    t.token_ts = [first + itl * k for k in range(tokens)]
    t.finish_reason = "length"
    s = RequestSummary(model="m", ttft=queue + prefill, e2e=e2e, queue=queue, prefill=prefill, decode=decode,
                       tpot=RequestSummary.mean_tpot(decode, tokens), input_tokens=64, output_tokens=tokens,
                       output_characters=4 * tokens, finish_reason="length")
    return t, s


class SyntheticEngine:
    """The EngineCore's side of the default path, played here: ``cohort`` starts its requests, writes a
    prefill step serving them all and one decode step a further token through the EngineCore's own sink,
    and finishes them with the engine's statistics those steps imply (the first token at the prefill
    step's end, the last at the last step's). Stamps are this process's monotonic clock as it goes; queue
    times are drawn (back-dated arrivals)."""

    PROMPT = 64

    def __init__(self, sink: Any, rng: random.Random, tokens: int) -> None:
        self.sink, self.rng, self.tokens = sink, rng, tokens
        self.steps = 0
        self._last_end: float | None = None

    def wait_for_agent(self, directory: str, timeout: float = 30.0) -> None:
        """Until the agent's step socket is in the directory (the sink's first write finds it there)."""
        deadline = time.monotonic() + timeout
        while not any(name.endswith(".sock") for name in os.listdir(directory)):
            if time.monotonic() > deadline:
                raise SystemExit("the agent's step socket did not appear")
            time.sleep(0.1)

    def _step(self, ids: list[str], tokens: list[int] | None, computed: list[int], prompt: bool) -> tuple[float, float]:
        from otel_llm.instrumentation.vllm.step_wire import Shares, StepPayload

        n = len(ids)
        start = time.monotonic()
        shares = Shares(ids, tokens, computed, (), list(range(n)) if prompt else (),
                        [self.PROMPT] * n if prompt else (), [0] * n if prompt else ())
        end = time.monotonic()
        idle = start - self._last_end if self._last_end is not None else None
        self.steps += 1
        self.sink(StepPayload(self.steps, start, end, n, 0, 0, 0.25, shares, 0, 1e-5, end - start, 1e-5, idle, None))
        self._last_end = end
        return start, end

    def cohort(self, pipeline: Any, ids: list[str]) -> None:
        from otel_llm.core.finish_facts import EngineStats, FinishFacts
        from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestTimeline

        now_wall, now = time.time(), time.monotonic()
        queued = {rid: now - self.rng.expovariate(1 / 0.02) for rid in ids}
        timelines = []
        for rid in ids:
            t = RequestTimeline(rid, now_wall - (now - queued[rid]), model="m", response_id=rid,
                                input_tokens=self.PROMPT)
            t.steps_give_tokens = True
            pipeline.start(t)
            timelines.append(t)
        scheduled, first = self._step(ids, [self.PROMPT] * len(ids), [0] * len(ids), prompt=True)
        last = first
        for k in range(1, self.tokens):
            _, last = self._step(ids, None, [self.PROMPT + k - 1] * len(ids), prompt=False)
        end_wall = time.time()
        for t in timelines:
            q = queued[t.request_id]
            stats = EngineStats(t.arrival, q, scheduled, first, last, first - q, self.tokens, 0)
            pipeline.finish_facts(FinishFacts(t.request_id, "length", end_wall, [(QUEUED, q), (SCHEDULED, scheduled)],
                                              None, 0, 4 * self.tokens, None, t.model, t.operation, t.provider,
                                              t.input_tokens, t.arrival, stats))


def run(args: argparse.Namespace, endpoint: str) -> dict[str, Any]:
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # before the agent starts: it inherits them
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    from opentelemetry.metrics import NoOpMeter
    from opentelemetry.trace import NoOpTracer

    from otel_llm.agent import destinations, protocol
    from otel_llm.agent.link import AgentLink
    from otel_llm.core.config import Config
    from otel_llm.core.pipeline import Pipeline
    from otel_llm.core.providers import _sdk_meter_provider, _sdk_tracer_provider
    from otel_llm.guard import Guard
    from otel_llm.instrumentation.vllm import AGENT_MODULE
    from otel_llm.instrumentation.vllm.step_transport import STEP_DIR_ENV, SocketSink, open_step_dir, remove_if_empty

    tp, mp = _sdk_tracer_provider(), _sdk_meter_provider()  # as otel-llm builds them from OTEL_*
    verdict = destinations.Verdict()
    dest = destinations.describe(tp, mp, verdict)
    tp.shutdown()
    mp.shutdown()
    if dest is None:
        raise SystemExit(f"the agent cannot stand in for these providers: {verdict.reason}")
    config = Config.resolve({}, environ={})  # the defaults
    step_dir = open_step_dir().path if args.path == "steps" else None  # the agent inherits it, binds its socket there
    if step_dir is None:
        os.environ.pop(STEP_DIR_ENV, None)
    link = AgentLink(Guard(), AGENT_MODULE)
    if not link.start():
        raise SystemExit("the agent did not start")
    link.configure(protocol.AgentConfig(config, dest))
    pipeline = Pipeline(config, NoOpTracer(), NoOpMeter("frontend"), engine="vllm")
    pipeline.attach(link)
    rng = random.Random(7)
    series: list[dict[str, Any]] = []
    failed_flushes = 0

    def sample(done: int) -> None:
        stats = pipeline.stats()
        series.append({"requests": done, "rss_bytes": stats.get("agent_rss_bytes", 0),
                       "agent_cpu_s": round(stats["agent_cpu_ns"] / 1e9, 2)})
        print(f"{done:>8} requests: agent RSS {stats.get('agent_rss_bytes', 0) / 2**20:7.1f} MiB", flush=True)

    engine = SyntheticEngine(SocketSink(step_dir), rng, args.tokens) if step_dir is not None else None
    if engine is not None:
        engine.wait_for_agent(step_dir)
    wall0, cpu0 = time.monotonic(), time.process_time()
    try:
        sample(0)
        done = 0
        while done < args.requests:
            n = min(args.concurrency, args.requests - done) if engine is not None else 1
            if engine is not None:
                engine.cohort(pipeline, [f"req-{done + k}" for k in range(n)])
            else:
                t, s = stamped_request(rng, done, args.tokens)
                pipeline.start(t)
                pipeline.finish(t.request_id, s)
            before, done = done, done + n
            if done // args.batch > before // args.batch or done == args.requests:
                failed_flushes += not pipeline.flush(60.0)
            if done // args.every > before // args.every:
                sample(done)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        stats = pipeline.stats()
    finally:
        link.close()
        pipeline.close(1.0)
        if engine is not None:
            engine.sink.close()
        if step_dir is not None:
            remove_if_empty(step_dir)  # (the agent removed its socket as it exited)
    rss = [p["rss_bytes"] for p in series]
    return {
        "series": series,
        "rss_first_bytes": rss[0], "rss_last_bytes": rss[-1], "rss_max_bytes": max(rss),
        "rss_after_first_batch_bytes": rss[1] if len(rss) > 1 else rss[0],
        "path": args.path, "requests": args.requests, "tokens_per_request": args.tokens, "batch": args.batch,
        "concurrency": args.concurrency if engine is not None else None,
        "steps_written": engine.steps if engine is not None else None,
        "steps_dropped": engine.sink.dropped if engine is not None else None,
        "steps_recorded": stats.get("steps_recorded"),
        "requests_kept": stats.get("requests_kept"), "agent_dropped": stats["agent_dropped"],
        "agent_lost": stats["agent_lost"], "agent_oversized": stats["agent_oversized"],
        "agent_orphans": stats.get("agent_orphans"), "failed_flushes": failed_flushes,
        "wall_s": round(wall, 1),
        "agent_cpu_us_per_request": round(stats["agent_cpu_ns"] / 1e3 / args.requests, 1),
        "frontend_cpu_us_per_request": round(cpu * 1e6 / args.requests, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2_000, help="requests between flushes (pacing)")
    ap.add_argument("--every", type=int, default=5_000, help="requests between RSS samples")
    ap.add_argument("--path", choices=("steps", "stamped"), default="steps",
                    help="steps: token times from engine steps, finishes as the engine's numbers (the default "
                         "path with an agent); stamped: stamped token times")
    ap.add_argument("--concurrency", type=int, default=32, help="requests a cohort, served by the same steps (steps)")
    ap.add_argument("--out", default="agent_memory.json")
    args = ap.parse_args()
    from vllm_overhead import start_sink

    sink, endpoint = start_sink()
    try:
        out: dict[str, Any] = {
            "workload": f"{args.requests} synthetic requests x {args.tokens} tokens, "
                        + (f"token times from engine steps ({args.concurrency} requests a step), finishes as the "
                           f"engine's numbers" if args.path == "steps" else "stamped token times")
                        + f", default options, one agent, OTLP/HTTP to a discarding sink, a flush every {args.batch}",
            "machine": f"{platform.machine()} {os.cpu_count()} cores",
            "python": platform.python_version(),
            "load_average_1m_before": round(os.getloadavg()[0], 1),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                                     text=True).stdout.strip(),
        }
        out.update(run(args, endpoint))
        out["load_average_1m_after"] = round(os.getloadavg()[0], 1)
    finally:
        sink.terminate()
        sink.wait(10)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "series"}, indent=1))
    print(f"wrote {RESULTS / args.out}")


if __name__ == "__main__":
    main()
