"""The agent process's memory over a long run: does its RSS level off, or grow with the requests it served?

Workload: ``--requests`` synthetic requests (default 100,000; each a start and a finish with ``--tokens``
stamped token times, default 128, as vLLM's adapter hands them over with token times stamped) fed by a
frontend ``Pipeline`` with default options through an ``AgentLink`` to one real agent
(``python -m otel_llm.agent``), which decides, records metrics, builds spans and exports them over
OTLP/HTTP to a sink process that discards them. No engine. Latencies vary from request to request (a
seeded generator), so the tail decision keeps some requests for a cause beside the 5 % baseline.

Paced so that the socket does not drop (a flush every ``--batch`` requests: the agent catches up, its
exports go out); drops are counted and reported all the same. The agent's RSS
(``stats()["agent_rss_bytes"]``, from its ``/proc/self/statm``) is sampled every ``--every`` requests,
after that batch's flush. The agent's CPU (schedstat) and this process's are reported per request.

Run: ./run bench benchmarks/agent_memory.py [--requests 100000] [--tokens 128]
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


def request(rng: random.Random, i: int, tokens: int) -> tuple[Any, Any]:
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


def run(args: argparse.Namespace, endpoint: str) -> dict[str, Any]:
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # before the agent starts: it inherits them
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    from opentelemetry.metrics import NoOpMeter
    from opentelemetry.trace import NoOpTracer

    from otel_llm.agent import destinations, protocol
    from otel_llm.agent.link import AgentLink
from otel_llm.instrumentation.vllm import AGENT_MODULE
    from otel_llm.core.config import Config
    from otel_llm.core.pipeline import Pipeline
    from otel_llm.core.providers import _sdk_meter_provider, _sdk_tracer_provider
    from otel_llm.guard import Guard

    tp, mp = _sdk_tracer_provider(), _sdk_meter_provider()  # as otel-llm builds them from OTEL_*
    verdict = destinations.Verdict()
    dest = destinations.describe(tp, mp, verdict)
    tp.shutdown()
    mp.shutdown()
    if dest is None:
        raise SystemExit(f"the agent cannot stand in for these providers: {verdict.reason}")
    config = Config.resolve({}, environ={})  # the defaults
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

    wall0, cpu0 = time.monotonic(), time.process_time()
    try:
        sample(0)
        for i in range(args.requests):
            t, s = request(rng, i, args.tokens)
            pipeline.start(t)
            pipeline.finish(t.request_id, s)
            done = i + 1
            if done % args.batch == 0 or done == args.requests:
                failed_flushes += not pipeline.flush(60.0)
            if done % args.every == 0:
                sample(done)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        stats = pipeline.stats()
    finally:
        link.close()
        pipeline.close(1.0)
    rss = [p["rss_bytes"] for p in series]
    return {
        "series": series,
        "rss_first_bytes": rss[0], "rss_last_bytes": rss[-1], "rss_max_bytes": max(rss),
        "rss_after_first_batch_bytes": rss[1] if len(rss) > 1 else rss[0],
        "requests": args.requests, "tokens_per_request": args.tokens, "batch": args.batch,
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
    ap.add_argument("--out", default="agent_memory.json")
    args = ap.parse_args()
    from vllm_overhead import start_sink

    sink, endpoint = start_sink()
    try:
        out: dict[str, Any] = {
            "workload": f"{args.requests} synthetic requests x {args.tokens} stamped tokens, default options, "
                        f"one agent, OTLP/HTTP to a discarding sink, a flush every {args.batch}",
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
