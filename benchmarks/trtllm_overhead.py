"""What the TensorRT-LLM adapter costs the caller's thread, measured on the stand-in package.

TensorRT-LLM cannot run here, so this measures only our own code, on the stand-in classes of
tests/trtllm/fake_trtllm.py (release 1.2.1's names, real wrapping, real core):

1. Per streamed update: ``DetokenizedGenerationResultBase._handle_response`` with our wrapper around
   a stand-in body that does the minimum TensorRT-LLM does for one token (extend ``token_ids``, set
   ``_last_token_ids_len``), minus the same body unwrapped. CPU ns per update, median of repeats.
2. Per finished request, on the thread that read the result: the finish (perf metrics -> timeline and
   summary, the ledger, the core's decision and hand-off to the span thread). CPU µs per request.
3. The iteration ledger alone under a serving load: requests of 200 iterations each, 64 scheduled per
   iteration, finishing before their stats arrive (stats pulled in one batch, as a ``/metrics`` scrape
   does); CPU µs per iteration read, which must not grow with the number of requests waiting. That work
   runs on the ledger's own thread; the thread that pulls the stats only queues them.

The engine's own per-update work (IPC, detokenization) is not in either number. Machine: 2 vCPUs
shared with other work, so treat the numbers as orders of magnitude.

    .venv/bin/python benchmarks/trtllm_overhead.py

Prints the numbers and writes benchmarks/results/trtllm_overhead.json.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "trtllm")]  # tests/support and the stand-in package

import fake_trtllm as fake  # noqa: E402
from trtllm_env import instrumented  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "trtllm_overhead.json"
UPDATES = 20_000


def per_update(env, repeats: int = 15) -> dict[str, float]:
    from tensorrt_llm.llmapi.llm import LLM
    from tensorrt_llm.sampling_params import SamplingParams

    wrappers = env.inst._engine_table.targets[3].wrapper.__self__  # TRTLLMWrappers
    llm = LLM(model="m")

    def body(response):  # what TensorRT-LLM does at least, per update of one token
        o = response_owner[0]._outputs[0]
        o._last_token_ids_len = len(o.token_ids)
        o.token_ids.append(7)

    response_owner = [None]
    plain, ours = [], []
    for _ in range(repeats):
        res = llm.generate_async("a b c", SamplingParams(max_tokens=10**9), streaming=True)
        response_owner[0] = res
        t0 = time.process_time_ns()
        for _ in range(UPDATES):
            body(None)
        plain.append((time.process_time_ns() - t0) / UPDATES)
        res._outputs[0].token_ids.clear()
        t0 = time.process_time_ns()
        for _ in range(UPDATES):
            wrappers.handle_response(body, res, (None,), {})
        ours.append((time.process_time_ns() - t0) / UPDATES)
        res.__dict__.pop("_otel_llm_timeline", None)
        env.inst.telemetry.requests.clear()
    return {"plain_ns": statistics.median(plain), "instrumented_ns": statistics.median(ours),
            "overhead_ns_per_update": statistics.median(o - p for o, p in zip(ours, plain))}


def per_request(env, n: int = 2000) -> dict[str, float]:
    from tensorrt_llm.llmapi.llm import LLM
    from tensorrt_llm.sampling_params import SamplingParams

    llm = LLM(model="m", engine=fake.FakeEngine(max_batch=64))
    wrappers = env.inst._engine_table.targets[3].wrapper.__self__
    costs = []
    for _ in range(n):
        res = llm.generate_async("a b c", SamplingParams(max_tokens=2), streaming=False)
        res.result()  # finished through the wrapper; now time the finish alone on a fresh one
    for _ in range(n):
        res = llm.generate_async("a b c", SamplingParams(max_tokens=2), streaming=False)
        t = res.__dict__["_otel_llm_timeline"]
        while not res._done:  # let TensorRT-LLM's side finish without our wrapper
            while res.queue.empty():
                llm._executor.step()
            fake.DetokenizedGenerationResultBase._handle_response.__wrapped__(res, res.queue.get())
        t0 = time.process_time_ns()
        wrappers._finish(res, t, None)
        costs.append(time.process_time_ns() - t0)
    assert env.inst.telemetry.flush(30)
    return {"finish_us_median": statistics.median(costs) / 1000,
            "finish_us_p90": statistics.quantiles(costs, n=10)[-1] / 1000}


def ledger_scaling(batch: int = 64, length: int = 200) -> dict[str, float]:
    from otel_llm.core.summary import RequestSummary
    from otel_llm.core.timeline import RequestTimeline
    from otel_llm.instrumentation.tensorrt_llm.iterations import IterationLedger

    out = {}
    for iterations in (1000, 4000):
        ledger = IterationLedger(lambda step: None, lambda rid, s: None, max_steps=8192, max_waiting=1 << 20,
                                 wait_s=1e9, background=False)  # the work itself, as its thread does it
        ledger.expect()
        # a steady batch: request r runs iterations [r * length / batch, that + length)
        n_requests = iterations * batch // length
        for r in range(n_requests):
            first = r * length // batch
            ledger.finished(RequestTimeline(f"r{r}", 0.0, input_tokens=8), RequestSummary(),
                            (first, first + length - 1))
        waiting = len(ledger.waiting)
        stats = [{"iter": k, "iterLatencyMS": 10.0,
                  "inflightBatchingStats": {"numScheduledRequests": batch, "numContextRequests": 0,
                                            "numGenRequests": batch, "numCtxTokens": 0}}
                 for k in range(iterations + length)]
        t0 = time.process_time_ns()
        for st in stats:
            ledger.observe(st)
        per = (time.process_time_ns() - t0) / len(stats) / 1000
        out[f"us_per_iteration_with_{waiting}_waiting"] = per
    return out


def main() -> None:
    modules = fake.build()
    fake.install(modules)
    env = instrumented(modules, sample_rate=0.05, baseline_detail="phases", tail_quantile=0.99)
    try:
        out = {"per_update": per_update(env), "per_request": per_request(env), "ledger": ledger_scaling(),
               "machine": f"{platform.machine()}, {platform.python_version()}, 2 shared vCPUs (loaded)",
               "note": "stand-in TensorRT-LLM (tests/trtllm/fake_trtllm.py); our code only, not the engine's"}
    finally:
        env.inst.uninstrument()
        fake.uninstall()
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
