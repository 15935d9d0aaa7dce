"""What otel-llm costs a real vLLM engine (CPU build, tiny model), against no telemetry and vLLM's own tracing.

Workload: 64 requests x 128 output tokens through offline ``LLM.generate``, repeated in
interleaved rounds over four modes:

    none      no telemetry (vLLM's per-request statistics on, as our instrumentation turns them on)
    default   otel_llm.instrument() defaults (tail decision + 5% baseline at phase detail)
    full      every request kept at full detail (one span per decode step, engine-step spans)
    native    vLLM's own tracing, one span per request: what --otlp-traces-endpoint turns on (vLLM's
              global tracer provider, OutputProcessor.do_tracing), switched on for the same engine

Spans go over real OTLP/HTTP to a sink in another process (it discards them), through the
SDK's BatchSpanProcessor. Measured per run: output tokens/s; frontend CPU time (all
threads of this process, so span building and OTLP encoding count); the p99 gap between
consecutive batches of tokens reaching the frontend (the inter-token latency a streaming
client would see, which GC stalls from telemetry would inflate; one probe, identical in all
modes, stamps each ``process_outputs`` call). Plus a microbenchmark of the per-token hot path.

Denominators: on a GPU server the model's forward runs on the GPU, so what our CPU
competes with is vLLM's *frontend* (this process: output processing, detokenization; an API
server adds HTTP streaming) and the EngineCore's scheduling loop. So the instrumentation's
extra frontend CPU per token is also reported as a share of vLLM's own frontend CPU per token
(mode ``none``, same run), and the EngineCore's CPU per engine step beside it, with a direct
microbenchmark of the step hooks at batch 64 (``engine_hooks_us_per_step``: the hooks cannot
be switched off in an EngineCore that is already running, so the engine-side columns of the
interleaved modes all include them).

Observer effect on a streaming event loop: a ticker thread (identical in all modes) sleeps
1 ms at a time and records how late it wakes up; its max and p99 lateness show the longest
stretch something else held the GIL. The materializer's jobs are also timed one by one (wall
and thread CPU), the direct measurement of its longest GIL-holding stretch.

Run: ./run bench benchmarks/vllm_overhead.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

N_REQUESTS, OUTPUT_TOKENS = 64, 128
RESULTS = Path(__file__).parent / "results"

SINK = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H); print(s.server_address[1], flush=True); s.serve_forever()
"""


def start_sink() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


class Probe:
    """Stamps every process_outputs call: the frontend's view of token arrival."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def install(self) -> None:
        import wrapt

        def probe(wrapped, instance, args, kwargs):
            self.stamps.append(time.perf_counter())
            return wrapped(*args, **kwargs)

        wrapt.wrap_function_wrapper("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs", probe)

    def p99_gap_ms(self, start: int) -> float:
        s = self.stamps[start:]
        gaps = sorted(b - a for a, b in zip(s, s[1:]))
        return 1000 * gaps[int(0.99 * (len(gaps) - 1))] if gaps else float("nan")


class Ticker:
    """A 1 ms ticker thread: how late it wakes up is how long another thread held the GIL."""

    def __init__(self) -> None:
        import threading

        self.late: list[float] = []
        self.cpu_s = 0.0  # the ticker's own CPU: taken out of the frontend's (the same per second in every mode,
        # but modes differ in wall time, so left in it would add noise proportional to throughput's)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        perf, sleep, late, cpu = time.perf_counter, time.sleep, self.late, time.thread_time
        c0 = cpu()
        while not self._stop.is_set():
            t0 = perf()
            sleep(0.001)
            late.append(perf() - t0 - 0.001)
            self.cpu_s = cpu() - c0

    def window(self, start: int) -> dict:
        s = sorted(self.late[start:])
        if not s:
            return {}
        return {"ticker_p99_late_ms": 1000 * s[int(0.99 * (len(s) - 1))], "ticker_max_late_ms": 1000 * s[-1]}

    def stop(self) -> None:
        self._stop.set()


class JobTimer:
    """Times each materializer job (wall and this thread's CPU): its longest stretch holding the GIL."""

    def __init__(self) -> None:
        self.jobs: list[tuple[float, float]] = []

    def install(self, telemetry) -> None:
        work = telemetry.materializer._work
        jobs = self.jobs

        def timed(job):
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return work(job)
            finally:
                jobs.append((time.perf_counter() - w0, time.thread_time() - c0))
        telemetry.materializer._work = timed

    def window(self, start: int) -> dict:
        jobs = self.jobs[start:]
        if not jobs:
            return {}
        return {"materializer_jobs": len(jobs), "materializer_job_max_wall_ms": 1000 * max(w for w, _ in jobs),
                "materializer_job_max_cpu_ms": 1000 * max(c for _, c in jobs),
                "materializer_cpu_s": sum(c for _, c in jobs)}


def providers(endpoint: str | None):
    """A tracer provider whose batch processor exports over OTLP/HTTP to the sink at ``endpoint`` (what direct
    export writes bytes for), or to an exporter that discards (``None``); and a meter provider."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Null(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    if endpoint is None:
        tp.add_span_processor(BatchSpanProcessor(Null()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # as OTEL_* configures it (what a deployment does, and what lets an agent process export for it):
        # the variable is inherited by the processes started from here. (Not the traces-only variable: vLLM's
        # EngineCore and workers start tracers of their own, over gRPC, where that one is set)
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return tp, MeterProvider()  # metrics recorded in memory (no reader): the recording cost counts


def run_once(llm, prompts, params, probe: Probe, flush=None, repeat: int = 1, ticker: "Ticker | None" = None,
             jobs: "JobTimer | None" = None) -> dict:
    """The workload ``repeat`` times back to back (one measurement; longer ones are less noisy)."""
    start = len(probe.stamps)
    tick0, job0, steps0 = len(ticker.late) if ticker else 0, len(jobs.jobs) if jobs else 0, steps_recorded()
    engine0 = engine_cpu_s()
    cpu0, t0 = time.process_time() - (ticker.cpu_s if ticker else 0.0), time.perf_counter()
    tokens = 0
    for _ in range(repeat):
        outs = llm.generate(prompts, params, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    wall = time.perf_counter() - t0
    if flush is not None:
        flush()  # the spans' export (encoding, sending) is part of what this run cost in CPU
    cpu = time.process_time() - (ticker.cpu_s if ticker else 0.0) - cpu0  # without the probe's own CPU
    engine = engine_cpu_s() - engine0
    assert tokens == repeat * N_REQUESTS * OUTPUT_TOKENS
    steps = steps_recorded()
    return {"tokens_per_s": tokens / wall, "cpu_s": cpu, "engine_cpu_s": engine, "wall_s": wall, "tokens": tokens,
            "p99_gap_ms": probe.p99_gap_ms(start), **span_counts(),
            "engine_steps": steps - steps0 if steps is not None and steps0 is not None else None,
            **(ticker.window(tick0) if ticker else {}), **(jobs.window(job0) if jobs else {})}


SINK_PIDS: set[int] = set()


def engine_cpu_s() -> float:
    """CPU seconds of this process's children but the sink: the EngineCore (and its threads)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        if child.pid in SINK_PIDS:
            continue
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def span_counts() -> dict:
    """What our telemetry sent and dropped so far (counts since instrument())."""
    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    telemetry = VLLMInstrumentor().telemetry
    if telemetry is None:
        return {}
    stats = telemetry.stats()
    return {k: stats.get(k) for k in ("requests_kept", "requests_spans_dropped", "direct_spans_sent",
                                      "direct_spans_dropped")}


def steps_recorded() -> int | None:
    """Engine steps our frontend has received so far (None when not instrumented)."""
    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    telemetry = VLLMInstrumentor().telemetry
    return telemetry.counts.steps_recorded if telemetry is not None else None


def engine_hooks_us_per_step(batch: int = 64, steps: int = 400, rounds: int = 5) -> dict:
    """The EngineCore step hooks on their own, on ``engine_step_hooks.py``'s stand-ins (one definition of
    what the hooks read of vLLM's scheduler), at ``batch`` decoding requests, with the real sink (a frontend
    on a ring, drained between steps, untimed): CPU per step with the hooks armed, disarmed (no sink: a
    method that only checks), and the bare calls, interleaved in slices of 25 steps over ``rounds`` rounds
    (medians of per-round medians), so a slow spell of the machine hits all three alike.
    ``engine_step_hooks.py`` breaks the figure down."""
    import random
    import tempfile

    from engine_step_hooks import SLICE, Scene, Wired, steps_ns

    from otel_llm.instrumentation.vllm.step_hooks import StepHooks
    from otel_llm.instrumentation.vllm.step_transport import SocketSink, StepReceiver

    scene = Scene(batch, 0)
    directory = tempfile.mkdtemp(prefix="otel-llm-bench-")
    receiver = StepReceiver(directory)
    got: list = []
    armed_hooks, disarmed_hooks = StepHooks(), StepHooks()  # armed by hand: arm() would also wrap vLLM's
    sink = SocketSink(directory)
    armed_hooks.sink = sink.__call__

    def drain() -> None:
        receiver.drain(got.append)

    try:
        wired = {"bare": Wired(None, scene), "disarmed": Wired(disarmed_hooks.targets, scene),
                 "armed": Wired(armed_hooks.targets, scene)}  # the C hook methods where built
        for w in wired.values():
            steps_ns(w, scene, 50, drain)
        per_round: dict[str, list[float]] = {m: [] for m in wired}
        for _ in range(rounds):
            taken: dict[str, list[int]] = {m: [] for m in wired}
            for _ in range(steps // SLICE):
                order = list(wired)
                random.shuffle(order)
                for m in order:
                    taken[m] += steps_ns(wired[m], scene, SLICE, drain)
            for m in wired:
                per_round[m].append(statistics.median(taken[m]) / 1000)
    finally:
        armed_hooks.sink = None
        sink.close()
        receiver.close()
    sent = 50 + rounds * (steps // SLICE) * SLICE
    if len(got) < sent:  # the hooks failed on the stand-ins (their guard counted it): no figure, not a wrong one
        return {"error": f"{len(got)} step records received for {sent} steps"}
    med = {m: statistics.median(v) for m, v in per_round.items()}
    return {"batch": batch, "rounds": rounds, "bare_us": round(med["bare"], 2),
            "disarmed_us": round(med["disarmed"], 2), "armed_us": round(med["armed"], 2),
            "hooks_us_per_step": round(med["armed"] - med["bare"], 2),
            "hooks_us_per_step_rounds": [round(a - b, 2) for a, b in zip(per_round["armed"], per_round["bare"])],
            "records_received": len(got)}


def hot_path_ns_per_token() -> float:
    """The per-token bookkeeping (``record_outputs``) on vLLM's own EngineCoreOutput structs."""
    from vllm.v1.engine import EngineCoreOutput

    from otel_llm.core.timeline import RequestTimeline
    from otel_llm.instrumentation.vllm.wrappers import record_outputs

    batch, steps = 64, 2000
    requests = {str(i): RequestTimeline(str(i), 0.0) for i in range(batch)}
    outputs = [EngineCoreOutput(request_id=str(i), new_token_ids=[7]) for i in range(batch)]
    states = dict.fromkeys(requests)  # all still running
    samples = []
    for _ in range(5):
        for t in requests.values():
            t.token_ts.clear()
        t0 = time.perf_counter_ns()
        for i in range(steps):
            record_outputs(requests, states, outputs, float(i))
        samples.append((time.perf_counter_ns() - t0) / (steps * batch))
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=3, help="workload repetitions per measurement")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/support: test helpers, not shipped
    from support.engine import engine_args, prepare_env

    prepare_env()
    os.environ.pop("OTEL_LLM_STEP_DIR", None)
    sink, endpoint = start_sink()
    SINK_PIDS.add(sink.pid)
    try:
        from vllm import LLM, SamplingParams

        from otel_llm.instrumentation.vllm import VLLMInstrumentor
        from telemetry_modes import ModeSwitch

        probe = Probe()
        probe.install()
        ticker, jobs = Ticker(), JobTimer()
        switch = ModeSwitch(*providers(endpoint), endpoint)  # arms the step hooks for the engine it builds
        llm = switch.build(lambda: LLM(**engine_args(max_num_seqs=64, max_num_batched_tokens=512)))
        switch.processors.append(llm.llm_engine.output_processor)
        prompts = [{"prompt_token_ids": [5 + (i * 31 + j) % 400 for j in range(16 + (i % 8) * 8)]}
                   for i in range(N_REQUESTS)]
        params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0.0)
        modes = ("none", "default", "full", "native")
        run_once(llm, prompts, params, probe)  # warm-up
        print(f"load average before: {os.getloadavg()}", flush=True)
        load = [os.getloadavg()[0]]
        results: dict[str, list[dict]] = {m: [] for m in modes}
        order = list(modes)
        rng = random.Random(0)
        for r in range(args.rounds):
            rng.shuffle(order)  # no mode always runs first (or right after another)
            for mode in order:
                switch.enter(mode)
                flush = switch.flush if mode != "none" else None
                if VLLMInstrumentor().telemetry is not None:
                    jobs.install(VLLMInstrumentor().telemetry)
                res = run_once(llm, prompts, params, probe, flush, args.repeat, ticker, jobs)
                switch.leave()
                results[mode].append(res)
                print(f"round {r + 1} {mode:8s} {res['tokens_per_s']:8.0f} tok/s  cpu {res['cpu_s']:.2f}s  "
                      f"engine cpu {res['engine_cpu_s']:.2f}s  "
                      f"p99 gap {res['p99_gap_ms']:.2f} ms  ticker max late {res.get('ticker_max_late_ms', 0):.1f} ms",
                      flush=True)
            load.append(os.getloadavg()[0])
        ticker.stop()
        hot = hot_path_ns_per_token()
        hooks = engine_hooks_us_per_step()
    finally:
        sink.terminate()

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    def ratio(mode: str) -> float:  # median of per-round ratios: rounds are interleaved, so paired
        return statistics.median(a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(results[mode], results["none"]))

    tokens = results["none"][0]["tokens"]  # per measurement
    # the workload is deterministic (same prompts, greedy, ignore_eos): every measurement runs the same
    # engine steps, counted by our frontend where it is instrumented
    step_counts = [r["engine_steps"] for m in ("default", "full") for r in results[m] if r.get("engine_steps")]
    steps = statistics.median(step_counts) if step_counts else float("nan")
    frontend_none = 1e6 * med("none", "cpu_s") / tokens  # vLLM's own frontend CPU per token (stats on)

    def med_opt(mode: str, key: str) -> float | None:
        values = [r[key] for r in results[mode] if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    table = []
    for mode in modes:
        extra = 1e6 * (med(mode, "cpu_s") - med("none", "cpu_s")) / tokens
        table.append({
            "mode": mode,
            "tokens_per_s": round(med(mode, "tokens_per_s")),
            "throughput_vs_none": round(ratio(mode), 4),
            "frontend_cpu_us_per_token_over_none": round(
                1e6 * (med(mode, "cpu_s") - med("none", "cpu_s")) / tokens, 2),
            # the extra CPU against what a token costs all in (frontend + EngineCore) without telemetry:
            # the throughput loss on a CPU-bound box, measured by the steadier quantity
            "cpu_share_over_none": round((med(mode, "cpu_s") - med("none", "cpu_s"))
                                         / (med("none", "cpu_s") + med("none", "engine_cpu_s")), 4),
            "p99_itl_ms": round(med(mode, "p99_gap_ms"), 2),
            "p99_itl_vs_none": round(med(mode, "p99_gap_ms") / med("none", "p99_gap_ms"), 3),
            # the right denominators: vLLM's own frontend CPU per token, the EngineCore's per step
            "frontend_cpu_us_per_token": round(1e6 * med(mode, "cpu_s") / tokens, 2),
            "frontend_share_of_vllm_frontend": round(extra / frontend_none, 4),
            "engine_cpu_us_per_step": round(1e6 * med(mode, "engine_cpu_s") / steps, 1),
            "ticker_p99_late_ms": med_opt(mode, "ticker_p99_late_ms"),
            "ticker_max_late_ms": med_opt(mode, "ticker_max_late_ms"),
            "materializer_job_max_wall_ms": med_opt(mode, "materializer_job_max_wall_ms"),
            "materializer_job_max_cpu_ms": med_opt(mode, "materializer_job_max_cpu_ms"),
            "materializer_cpu_us_per_token": round(1e6 * med_opt(mode, "materializer_cpu_s") / tokens, 2)
            if med_opt(mode, "materializer_cpu_s") is not None else None,
        })
    print()
    print(f"{'mode':8s} {'tok/s':>8s} {'vs none':>8s} {'CPU us/tok':>11s} {'CPU share':>10s} {'p99 ITL ms':>11s} "
          f"{'vs none':>8s}")
    for row in table:
        print(f"{row['mode']:8s} {row['tokens_per_s']:8d} {row['throughput_vs_none']:8.3f} "
              f"{row['frontend_cpu_us_per_token_over_none']:11.2f} {100 * row['cpu_share_over_none']:9.2f}% "
              f"{row['p99_itl_ms']:11.2f} {row['p99_itl_vs_none']:8.3f}")
    allin = 1e6 * (med("none", "cpu_s") + med("none", "engine_cpu_s")) / tokens
    print(f"all-in CPU per token without telemetry: {allin:.1f} us (frontend + EngineCore)")
    print(f"\nfrontend CPU per token without telemetry (vLLM's own, stats on): {frontend_none:.2f} us; "
          f"engine steps per measurement: {steps}")
    print(f"{'mode':8s} {'front us/tok':>12s} {'+ us/tok':>9s} {'share of vLLM frontend':>23s} "
          f"{'engine us/step':>15s} {'ticker p99/max ms':>18s} {'job max wall/cpu ms':>20s}")
    for row in table:
        print(f"{row['mode']:8s} {row['frontend_cpu_us_per_token']:12.2f} {row['frontend_cpu_us_per_token_over_none']:9.2f} "
              f"{100 * row['frontend_share_of_vllm_frontend']:22.1f}% {row['engine_cpu_us_per_step']:15.1f} "
              f"{row['ticker_p99_late_ms']!s:>8s}/{row['ticker_max_late_ms']!s:<9s} "
              f"{row['materializer_job_max_wall_ms']!s:>9s}/{row['materializer_job_max_cpu_ms']!s}")
    print(f"\nhot path: {hot:.0f} ns per token (vLLM EngineCoreOutput structs, batch 64)")
    print(f"EngineCore step hooks alone (batch 64, CPU per step): {hooks}")
    RESULTS.mkdir(exist_ok=True)
    out = {"workload": f"{N_REQUESTS} requests x {OUTPUT_TOKENS} output tokens, offline LLM.generate, tiny model, CPU",
           "rounds": args.rounds, "repeat_per_measurement": args.repeat, "machine": f"{platform.machine()} {os.cpu_count()} cores",
           "date": time.strftime("%Y-%m-%d"), "table": table, "hot_path_ns_per_token": round(hot),
           "allin_cpu_us_per_token_none": round(allin, 1),
           "frontend_cpu_us_per_token_none": round(frontend_none, 2), "engine_steps_per_measurement": steps,
           "engine_hooks_cpu_per_step": hooks, "load_average_1min_per_round": load,
           "raw": results}
    (RESULTS / "vllm_overhead.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / 'vllm_overhead.json'}")


if __name__ == "__main__":
    main()
