"""The core's costs, measured without an engine: four sections, each writing the file named by what it measures.

* ``metrics`` (results/metrics_record_cost.json): what one finished request's metrics cost on the
  OpenTelemetry SDK: the public API against the bound recorders of ``otel_llm/core/sdk_metrics.py`` (the
  same values, the same aggregations). One ``ServerMetrics`` per path, on a ``MeterProvider`` with one
  reader (as a deployment has), a 128-token request's summary with its inter-token gaps; the public path
  records the gaps as one ``record`` per token (what the API offers), the bound path adds the request's
  bucket counts at once. Interleaved rounds, medians of thread CPU per request.
* ``verdict`` (results/verdict_cost.json): the slow-cause verdict, on constructed engine histories.
  1. ``Pipeline.add_step`` per step at decode batch sizes 16 and 256 (every request tracked), with the
     step window on, and with it replaced by a no-op (``StepWindow.add`` alone is the difference); best
     of interleaved repeats.
  2. ``decide()`` for a request that waited 500 steps and decoded 1,000, and one that decoded 2,500, in a
     window of 8,192 steps; per verdict and per step of the request's life.
* ``step_metrics`` (results/step_metrics_cost.json): the engine-step metrics, as the materializer thread
  records them (``StepDiagnosis.record`` and the adapters' ``AdapterStepMetrics.record``, on the
  pipeline's own instruments), for batches of 32 decode steps at batch 64: steps of the base model, of
  one LoRA adapter and of two (labelled ``multiple``, and one adapter-steps point each). Interleaved
  rounds, thread CPU per step; medians and the spread between rounds, and the adapters' cost as the
  median of per-round differences to the base model's steps.

* ``agent`` (results/agent_cpu.json): the agent process's CPU per token, its defaults replayed through the
  agent's own code (``benchmarks/agent_replay.py``, which takes its options and ``--profile`` run on its own).
* ``records`` (results/record_decode_cost.json): what the agent's ``records.decode`` costs per record kind (a
  served request's start, finish and enrichment as the vLLM hooks build them, and a sink count), with the C
  walker (``bounded_marshal.FAST``) and with the Python one, and ``--against REV``'s ``records.py`` and
  ``bounded_marshal.py`` (read from git) on the same bytes; the walk alone (``check``) per kind, C and Python.
  Interleaved rounds of ``timeit`` on thread CPU time; medians and the spread between rounds, µs per record.
* ``exit`` (results/launcher_exit.json): how long a script under ``opentelemetry-instrument`` takes to exit
  after its last line with nothing listening where our providers export (one refused openai call's span and
  metrics unsent), against the same script with ``OTEL_{TRACES,METRICS}_EXPORTER=none``: the bounded
  shutdown (``providers.SHUTDOWN_S``) plus what teardown adds. The clean venv of tests/core/test_launcher.py
  (this checkout's wheel and openai, no engines); interleaved rounds, wall seconds; medians, spreads and the
  median of per-round differences.

Run: ./run bench benchmarks/core_costs.py [--only metrics,verdict,step_metrics,agent,records,exit] [--against REV]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from otel_llm.core import metrics as m
from otel_llm.core.config import Config
from otel_llm.core.diagnosis.verdict import StepWindow, decide
from otel_llm.core.inter_token import gap_summary
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.slo import SLOTable
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import BLOCKED_MAX_SEQS, QUEUED, SCHEDULED, PrefillChunk, RequestTimeline, StepRecord

RESULTS = Path(__file__).parent / "results"
TOKENS = 128
ENGINE = 1 << 32
SECTIONS = ("metrics", "verdict", "step_metrics", "agent", "records", "exit")


# -- metrics: one finished request's metrics ----------------------------------------------------------

def public_bind(instrument, attributes):
    call = instrument.record if hasattr(instrument, "record") else instrument.add

    def record(amount, context=None):
        call(amount, attributes, context=context)
    return record


class PublicCounts:
    """The public API's only way to put a request's gaps in a histogram: a record per gap."""

    def __init__(self, instrument, attributes, boundaries) -> None:
        self.record, self.attributes = instrument.record, attributes

    def __call__(self, gaps: list[float]) -> None:
        for g in gaps:
            self.record(g, self.attributes)


def summary(stamps: list[float]) -> RequestSummary:
    s = RequestSummary(model="m", operation="chat", provider="vllm", ttft=0.1, e2e=3.0, queue=0.01, prefill=0.09,
                       decode=2.5, input_tokens=100, output_tokens=TOKENS, output_characters=500)
    s.tpot = RequestSummary.mean_tpot(s.decode, s.output_tokens)
    s.gaps = gap_summary(stamps)
    s.max_gap = s.gaps.max_gap
    return s


def metrics() -> None:
    stamps = [i * 0.02 + (0.003 if i % 7 == 0 else 0.0) for i in range(TOKENS)]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    paths = {}
    for name in ("public", "bound"):
        meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
        if name == "public":
            saved = m.bind_value
            m.bind_value = public_bind
            metrics = m.ServerMetrics(meter, SLOTable())
            metrics._bound(summary(stamps), ())  # bound (lazily) while the public path is in place
            m.bind_value = saved
        else:
            metrics = m.ServerMetrics(meter, SLOTable())
        paths[name] = metrics
    samples: dict[str, list[float]] = {"public": [], "bound": [], "public_itl": [], "bound_itl": [], "bucketing": []}
    n = 200
    for _ in range(7):
        for name, metrics in paths.items():
            s = summary(stamps)
            itl = s.gaps
            s.gaps = None  # the request's other metrics alone
            c0 = time.thread_time_ns()
            for _ in range(n):
                metrics.record(s)
            samples[name].append((time.thread_time_ns() - c0) / n / 1000)
            b = metrics._bound(s, ())
            c0 = time.thread_time_ns()
            if name == "public":
                per_gap = PublicCounts(metrics._itl[1], metrics.label_attributes(s, ()), None)
                for _ in range(n):
                    per_gap(gaps)
            else:
                for _ in range(n):
                    b.inter_token(itl.counts, itl.total, itl.lo, itl.hi)
            samples[f"{name}_itl"].append((time.thread_time_ns() - c0) / n / 1000)
        c0 = time.thread_time_ns()
        for _ in range(n):
            gap_summary(stamps)
        samples["bucketing"].append((time.thread_time_ns() - c0) / n / 1000)
    out = {k: round(statistics.median(v), 2) for k, v in samples.items()}
    out = {"us_per_request_other_metrics_public": out["public"], "us_per_request_other_metrics_bound": out["bound"],
           f"us_per_request_itl_{TOKENS}_tokens_public_record_per_gap": out["public_itl"],
           f"us_per_request_itl_{TOKENS}_tokens_bound_counts": out["bound_itl"],
           f"us_per_request_bucketing_{TOKENS}_tokens": out["bucketing"],
           "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    print(json.dumps(out, indent=1))
    (RESULTS / "metrics_record_cost.json").write_text(json.dumps(out, indent=1))


# -- verdict: the slow-cause verdict ------------------------------------------------------------------

def add_step_cost(batch: int, window: bool, reps: int) -> float:
    tele = Pipeline(Config.resolve({"max_steps": 1 << 20}, environ={}), TracerProvider().get_tracer("b"),
                     MeterProvider().get_meter("b"), "bench")
    if not window:
        tele.window.add = lambda *a: None  # type: ignore[method-assign]
    rids = [f"r{i}" for i in range(batch)]
    for r in rids:
        tele.start(RequestTimeline(r, 0.0))
    shares = [(r, 1, False) for r in rids]
    shares[0] = (rids[0], 64, True)
    records = [StepRecord(ENGINE | i, 1.0, 1.01, shares, batch, 0, 0, 0.5) for i in range(reps)]
    start = time.perf_counter()
    for r in records:
        tele.add_step(r)
    took = (time.perf_counter() - start) / reps
    tele.close(1.0)
    return took


def history() -> tuple[StepWindow, dict[str, RequestTimeline]]:
    """32 decoding requests; "w" waits 500 steps behind a full batch, then decodes 1,000 tokens."""
    window = StepWindow(8192)
    timelines = {r: RequestTimeline(r, 0.0) for r in ("r0", "w")}
    now, sid = 100.0, ENGINE

    def step(shares: list[tuple[str, int, bool]], blocked: int = 0, waiting: int = 0) -> None:
        nonlocal now, sid
        sid += 1
        start, now = now + 0.001, now + 0.011
        rec = StepRecord(sid, start, now, shares, len(shares), waiting, 0, None, queue_blocked=blocked)
        window.add(rec, sum(n for _, n, p in shares if p), sum(1 for *_, p in shares if not p))
        for rid, n, prefill in shares:
            t = timelines.get(rid)
            if t is None:
                continue
            if not t.steps:
                t.events.append((SCHEDULED, start))
            t.steps.append(sid)
            if prefill:
                t.chunks.append(PrefillChunk(sid, start, now, n))
            t.token_ts.append(now)

    timelines["r0"].events.append((QUEUED, now))
    decoders = [(f"r{i}", 1, False) for i in range(32)]
    for _ in range(2000):
        step(decoders)
    timelines["w"].events.append((QUEUED, now))
    for _ in range(500):
        step(decoders, BLOCKED_MAX_SEQS, 1)
    step([("w", 16, True)])
    for _ in range(1000):
        step([("w", 1, False)])
    return window, timelines


def verdict() -> None:
    results: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                     "python": platform.python_version(),
                     "load_average_1m": round(os.getloadavg()[0], 1), "add_step_us": {}, "verdict": {}}
    for batch, reps in ((16, 20000), (256, 2000)):
        on, off = [], []
        for _ in range(5):  # interleaved, best of each
            on.append(add_step_cost(batch, True, reps))
            off.append(add_step_cost(batch, False, reps))
        results["add_step_us"][f"batch_{batch}"] = {"with_window": round(min(on) * 1e6, 2),
                                                    "window_off": round(min(off) * 1e6, 2)}
    window, timelines = history()
    for rid, life in (("w", 1501), ("r0", 2500)):
        n, start = 20, time.perf_counter()
        for _ in range(n):
            v = decide(timelines[rid], window, ("e2e",))
        per = (time.perf_counter() - start) / n
        results["verdict"][rid] = {"steps_in_life": life, "ms_per_verdict": round(per * 1e3, 2),
                                   "us_per_step": round(per / life * 1e6, 2), "cause": v.cause}
    print(json.dumps(results, indent=1))
    (RESULTS / "verdict_cost.json").write_text(json.dumps(results, indent=1) + "\n")


# -- step_metrics: the engine-step metrics by adapter ---------------------------------------------------

STEP_ADAPTERS = {"base model": None, "one adapter": (1,), "two adapters": (1, 2)}


def step_batch(loras: tuple[int, ...] | None, first: int, batch: int = 64, steps: int = 32) -> list[StepRecord]:
    ids = [f"r{i}" for i in range(batch)]
    out = []
    for i in range(steps):
        t = 100.0 + (first + i) * 0.01
        step = StepRecord.of_lists(ENGINE | (first + i), t, t + 0.008, ids, None, (), batch, 0, 0, 0.5)
        step.schedule_s, step.execute_s, step.output_s = 0.0002, 0.0075, 0.0003
        step.loras = loras
        out.append(step)
    return out


def step_metrics() -> None:
    tele = Pipeline(Config.resolve({}, environ={}), TracerProvider().get_tracer("b"),
                    MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("b"), "bench")
    tele.adapters.note(1, "adapter-a")
    tele.adapters.note(2, "adapter-b")
    batches, per_batch = 200, 32
    samples: dict[str, list[float]] = {name: [] for name in STEP_ADAPTERS}
    first = 0
    for round_ in range(11):
        order = list(STEP_ADAPTERS.items())
        if round_ % 2:
            order.reverse()
        for name, loras in order:
            work = [step_batch(loras, first + b * per_batch) for b in range(batches)]
            first += batches * per_batch
            c0 = time.thread_time_ns()
            for steps in work:
                tele.diagnosis.record(steps, tele.adapter_steps.step_label)
                tele.adapter_steps.record(steps)
            samples[name].append((time.thread_time_ns() - c0) / (batches * per_batch) / 1000)
    tele.close(1.0)
    base = samples["base model"]
    out: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                 "python": platform.python_version(), "load_average_1m": round(os.getloadavg()[0], 1),
                 "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": len(base),
                 "batch": 64, "steps_per_record_call": per_batch, "us_per_step": {}, "added_us_per_step": {}}
    for name, got in samples.items():
        out["us_per_step"][name] = {"median": round(statistics.median(got), 3),
                                    "min": round(min(got), 3), "max": round(max(got), 3)}
        if name != "base model":
            diffs = [a - b for a, b in zip(got, base)]
            out["added_us_per_step"][name] = {"median": round(statistics.median(diffs), 3),
                                              "min": round(min(diffs), 3), "max": round(max(diffs), 3)}
    print(json.dumps(out, indent=1))
    (RESULTS / "step_metrics_cost.json").write_text(json.dumps(out, indent=1) + "\n")


def agent() -> None:
    sys.path.insert(0, str(Path(__file__).parent))  # its helper, beside it
    import agent_replay

    agent_replay.main([])


# -- records: the agent's decode of a request's records -------------------------------------------------------

def served_records() -> dict[str, bytes]:
    """A served chat request's records as the vLLM hooks build them (request_hooks.py, wrappers.py)."""
    from otel_llm.agent import records

    rid = "chatcmpl-7f3a9c2e5b1d4e8f9a0b1c2d3e4f5a6b-0-a1b2c3d4"
    parent = {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}
    sampling = {"gen_ai.request.max_tokens": 128, "gen_ai.request.temperature": 0.7, "gen_ai.request.top_p": 0.95,
                "gen_ai.request.seed": 7, "gen_ai.request.choice.count": 1}
    attributes = {"gen_ai.request.model": "tiny", "gen_ai.request.stream": True, "server.address": "127.0.0.1",
                  "server.port": 8000, "http.route": "/v1/chat/completions", "gen_ai.output.type": "text"}
    return {
        "start": records.encode(records.RequestStart(
            request_id=rid, arrival=1765000000.25, queued=5123.5, prompt_tokens=412, external_id=rid[:-9],
            model="tiny", trace_headers=parent, sampling=sampling, client_index=0, enriched=True)),
        "finish": records.encode(records.RequestFinish(
            request_id=rid, reason="length", arrival=1765000000.25, queued=5123.5, end=5125.75,
            end_wall=1765000002.5, prompt_tokens=412, output_tokens=128, external_id=rid[:-9], model="tiny",
            enriched=True)),
        "enrichment": records.encode(records.RequestEnrichment(
            request_id=rid, operation="chat", server=True, parent=parent, response_id=rid[:-11], model="tiny",
            attributes=attributes, reason="length", output_tokens=128, output_characters=612,
            first_output=1765000000.5, last_output=1765000002.5, end=1765000002.5)),
        "sink_counts": records.encode(records.SinkCounts(pid=4242, steps_dropped=3, requests_dropped=1)),
    }


def _baseline_records(rev: str):
    """``records.py`` and ``bounded_marshal.py`` of git revision ``rev``, imported as a package of their own."""
    import importlib
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    package = Path(tempfile.mkdtemp(prefix="record-decode-")) / "baseline_agent"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("records.py", "bounded_marshal.py"):
        text = subprocess.run(["git", "show", f"{rev}:otel_llm/agent/{name}"], cwd=root, capture_output=True,
                              text=True, check=True).stdout
        (package / name).write_text(text)
    sys.path.insert(0, str(package.parent))
    return importlib.import_module("baseline_agent.records")


def record_decode(against: str | None, rounds: int = 15, number: int = 2000) -> None:
    import timeit

    from otel_llm.agent import bounded_marshal, records

    data = served_records()
    for kind, raw in data.items():  # the same records on every path
        assert records.decode(raw) == records.decode(raw)

    def per_record(call, arg) -> float:  # thread CPU seconds a call
        return timeit.Timer(lambda: call(arg), timer=time.thread_time).timeit(number) / number

    def decode_with(loads):
        def run(raw: bytes) -> float:
            saved, bounded_marshal.loads = bounded_marshal.loads, loads
            try:
                return per_record(records.decode, raw)
            finally:
                bounded_marshal.loads = saved
        return run

    paths = {"decode, C walker": decode_with(bounded_marshal.loads),
             "decode, Python walker": decode_with(bounded_marshal.loads_py)}
    if not bounded_marshal.FAST:
        del paths["decode, C walker"]
    if against:
        base = _baseline_records(against)
        paths[f"decode at {against}"] = lambda raw: per_record(base.decode, raw)
    walks = {"check, Python": bounded_marshal.check_py}
    if bounded_marshal.FAST:
        walks["check, C"] = bounded_marshal.check
    for name, check in walks.items():
        paths[name] = lambda raw, check=check: per_record(check, raw[2:])
    samples = {(path, kind): [] for path in paths for kind in data}
    for round_ in range(rounds):
        order = list(paths) if round_ % 2 == 0 else list(reversed(paths))
        for path in order:
            for kind, raw in data.items():
                samples[path, kind].append(paths[path](raw) * 1e6)

    def spread(got: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(got), 2), "min": round(min(got), 2), "max": round(max(got), 2)}

    out: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                 "python": platform.python_version(), "load_average_1m": round(os.getloadavg()[0], 1),
                 "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": rounds, "records_per_sample": number,
                 "against": against, "c_walker": bounded_marshal.REASON or "built",
                 "bytes": {kind: len(raw) for kind, raw in data.items()},
                 "resolution": f"thread CPU over {number} records a sample: ~0.01 µs; the load sets the spread",
                 "us_per_record": {path: {kind: spread(samples[path, kind]) for kind in data} for path in paths}}
    print(json.dumps(out, indent=1))
    (RESULTS / "record_decode_cost.json").write_text(json.dumps(out, indent=1) + "\n")


def launcher_exit(rounds: int = 7) -> None:
    import tempfile

    from otel_llm.core.providers import SHUTDOWN_S

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/support: test helpers, not shipped
    from support.launcher import launcher_venv, nothing_listens, run

    if not nothing_listens(4318):
        sys.exit("exit: something listens on localhost:4318, where the exports must be refused")
    none = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
    samples: dict[str, list[float]] = {"otlp, nothing listening": [], "exporters none": []}
    with tempfile.TemporaryDirectory() as tmp:
        python = launcher_venv(Path(tmp) / "launcher")
        for round_ in range(rounds):
            order = list(samples)
            if round_ % 2:
                order.reverse()
            for name in order:
                _, after_last_line, _ = run(python, "launcher", Path(tmp), **({} if name.startswith("otlp") else none))
                samples[name].append(after_last_line)
    diffs = [a - b for a, b in zip(*samples.values())]

    def spread(got: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(got), 3), "min": round(min(got), 3), "max": round(max(got), 3)}

    out: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                 "python": platform.python_version(), "load_average_1m": round(os.getloadavg()[0], 1),
                 "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": rounds, "shutdown_budget_s": SHUTDOWN_S,
                 "resolution": "time.time() around a subprocess: milliseconds, the machine's load decides the rest",
                 "exit_s_after_last_line": {name: spread(got) for name, got in samples.items()},
                 "added_s": spread(diffs), "raw": {"added_s": [round(d, 3) for d in diffs]}}
    print(json.dumps(out, indent=1))
    (RESULTS / "launcher_exit.json").write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="sections to run: " + ",".join(SECTIONS))
    ap.add_argument("--against", default=None, help="records: a git revision whose decode to time beside this one")
    args = ap.parse_args()
    chosen = args.only.split(",")
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}: choose from {','.join(SECTIONS)}")
    RESULTS.mkdir(exist_ok=True)
    for name in chosen:
        if name == "records":
            record_decode(args.against)
            continue
        {"metrics": metrics, "verdict": verdict, "step_metrics": step_metrics, "agent": agent,
         "exit": launcher_exit}[name]()


if __name__ == "__main__":
    main()
