"""otel-llm demo: a real vLLM engine (CPU, tiny random-weights model), instrumented, on a mixed workload.

Requests arrive over time, mostly short chats plus a few long documents whose prefill
stalls everyone's decode. The SLOs and the arrival rate are calibrated on this machine
first (a burst measures what it can serve, a rehearsal of the same workload at the paced
rate sets each SLO at its 90th percentile), so a realistic share of requests breaches wherever the
demo runs. Prints TTFT / TPOT / end-to-end percentiles (from the metrics, as Prometheus
would compute them), goodput against the SLOs, what the tail sampler kept and why, and the
slowest requests with their phase breakdown and the engine steps that stretched them.
Traces go to an OTLP/JSON file (or, with --otlp, to an OTLP endpoint); the demo ends by
writing the timeline report of that file (HTML, and a Chrome trace for Perfetto).

    ./run demo                      # writes out/demo-traces.jsonl, out/demo-report.html, out/demo-report.trace.json
    ./run demo --otlp               # sends to $OTEL_EXPORTER_OTLP_ENDPOINT (default localhost:4318)
    ./run demo --slo ttft=0.5,tpot=0.05,e2e=5   # fixed SLOs instead of calibrated ones
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm.core import semconv as sc
from otel_llm.core.metrics import SLO_BREACHES
from otel_llm.otlp.file import OTLPJsonFileExporter
from otel_llm.views.report import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/support: test helpers, not shipped
from support.engine import make_llm  # noqa: E402
from support.metrics import points_by_name  # noqa: E402

RATE = 40.0  # requests/s offered at most; paced down to what the machine serves (calibrate)
CALIBRATION_QUANTILE = 0.9  # each SLO is this quantile of the calibration run: ~10% breach each
PACE = 0.7  # offered load as a share of the measured capacity: busy, with a queue that does not grow without bound
WORKLOAD_SEED = 1  # the run and its rehearsal (calibration) are the same workload


def workload(n: int, rng: random.Random, rate: float = RATE) -> list[tuple[float, dict, int]]:
    """(arrival offset s, prompt, max_tokens): chats arriving at ``rate`` req/s (Poisson), every 8th a long document."""
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        long = i % 8 == 5
        length = rng.randint(300, 420) if long else rng.randint(12, 64)
        prompt = {"prompt_token_ids": [3 + rng.randrange(500) for _ in range(length)]}
        out.append((t, prompt, rng.randint(8, 24) if long else rng.randint(24, 96)))
    return out


def run(llm, plan) -> int:
    """Feed requests at their arrival times and step the engine (what LLM.generate does, over time)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    start, i, done = time.monotonic(), 0, 0
    while i < len(plan) or engine.has_unfinished_requests():
        now = time.monotonic() - start
        while i < len(plan) and plan[i][0] <= now:
            _, prompt, max_tokens = plan[i]
            engine.add_request(f"req-{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            i += 1
        if engine.has_unfinished_requests():
            done += sum(1 for o in engine.step() if o.finished)
        else:
            time.sleep(0.001)
    return done


@dataclass(frozen=True)
class Calibration:
    capacity: float  # requests/s the engine finished in a burst of the workload
    rate: float  # requests/s the demo offers
    slo: str  # "ttft=...,tpot=...,e2e=..."
    requests: int  # in the calibration run

    def describe(self) -> str:
        return (f"calibrated on this machine: a burst of the workload was served at {self.capacity:.1f} req/s, so "
                f"requests arrive at {self.rate:.1f} req/s ({PACE:.0%} of that, at most {RATE:g}); SLOs = the "
                f"p{100 * CALIBRATION_QUANTILE:.0f} of TTFT / TPOT / end-to-end in a rehearsal of the same "
                f"{self.requests} requests at that rate: {self.slo} (--slo to fix them)")


def calibrate(llm, memory: InMemorySpanExporter, requests: int, rng_seed: int = 2, burst: int = 24
              ) -> Calibration:
    """Measure what this machine serves, then set SLOs a realistic share of requests will breach.

    Needs otel_llm instrumented with ``sample_rate=1.0`` and ``memory`` receiving the spans: the
    request spans carry each request's own TTFT / TPOT / e2e (exact, not bucketed)."""
    plan = [(0.0, prompt, max_tokens) for _, prompt, max_tokens in workload(burst, random.Random(rng_seed))]
    t0 = time.monotonic()
    run(llm, plan)
    capacity = burst / (time.monotonic() - t0)
    rate = min(RATE, PACE * capacity)
    otel_llm.flush()
    memory.clear()
    run(llm, workload(requests, random.Random(WORKLOAD_SEED), rate))  # a rehearsal of the very run to come
    otel_llm.flush()
    values: dict[str, list[float]] = {"ttft": [], "tpot": [], "e2e": []}
    for s in memory.get_finished_spans():
        a = s.attributes or {}
        for key, attr in (("ttft", sc.LATENCY_TTFT), ("tpot", sc.LATENCY_TPOT), ("e2e", sc.LATENCY_E2E)):
            if isinstance(a.get(attr), (int, float)):
                values[key].append(float(a[attr]))
    memory.clear()
    slo = ",".join(f"{key}={_round_up(sorted(v)[min(len(v) - 1, int(CALIBRATION_QUANTILE * len(v)))])}"
                   for key, v in values.items() if v)
    return Calibration(capacity, rate, slo, requests)


def _round_up(seconds: float) -> str:
    """Two significant digits, rounded up (an SLO is a round number a person would write)."""
    digits = 1 - math.floor(math.log10(seconds)) if seconds > 0 else 3
    step = 10 ** -digits
    return f"{math.ceil(round(seconds / step, 6)) * step:.{max(digits, 0)}f}"  # round: 0.07 / 0.01 is 7.000000000000001


def quantile_from_histogram(point, q: float) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding the rank."""
    rank = q * point.count
    seen, lower = 0, 0.0
    for upper, count in zip(list(point.explicit_bounds) + [float("inf")], point.bucket_counts):
        if count and seen + count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
        lower = upper
    return lower


def report(spans, reader, wall: float, finished: int, slo: str) -> None:
    got = points_by_name(reader.get_metrics_data())
    print(f"\n{finished} requests in {wall:.1f} s; SLOs: {slo}\n")
    print(f"{'':22s} {'p50':>9s} {'p95':>9s} {'p99':>9s}   (from the metrics, as Prometheus computes them)")
    for label, name in (("time to first token", "gen_ai.server.time_to_first_token"),
                        ("time per output token", "gen_ai.server.time_per_output_token"),
                        ("end to end", "gen_ai.server.request.duration")):
        (point,) = got[name]
        print(f"{label:22s} " + " ".join(f"{1000 * quantile_from_histogram(point, q):7.1f}ms" for q in (.5, .95, .99)))
    total = sum(p.value for p in got["llm.server.requests"])
    good = sum(p.value for p in got["llm.server.requests.good"])
    print(f"\ngoodput: {good:.0f} of {total:.0f} requests met every SLO at once ({100 * good / total:.0f}%)")
    breaches = collections.Counter()
    for p in got.get(SLO_BREACHES, ()):
        breaches[(p.attributes[sc.SLO_OBJECTIVE], p.attributes[sc.SLOW_CAUSE])] += p.value
    for (objective, cause), n in sorted(breaches.items(), key=lambda kv: -kv[1]):
        print(f"  {objective} breaches caused by {cause}: {n:.0f}")

    requests = [s for s in spans if s.attributes and sc.LATENCY_E2E in s.attributes]
    reasons = collections.Counter(str(s.attributes[sc.SAMPLING_REASON]) for s in requests)
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    print(f"tail sampling kept {len(requests)} of {finished} requests ({dict(reasons)}), "
          f"{len(steps)} engine steps, {len(spans)} spans in all")

    children = collections.defaultdict(list)
    for s in spans:
        if s.parent:
            children[s.parent.span_id].append(s)
    linked = collections.defaultdict(list)
    for st in steps:
        for link in st.links:
            linked[link.context.span_id].append(st)
    print("\nslowest kept requests:")
    for r in sorted(requests, key=lambda s: -s.attributes[sc.LATENCY_E2E])[:5]:
        a = r.attributes
        print(f"  {a[sc.RESPONSE_ID]:8s} e2e {1000 * a[sc.LATENCY_E2E]:6.1f}ms = queue+frontend "
              f"{(children_ms(children, r, sc.SPAN_QUEUE)):5.1f} + prefill {1000 * a.get(sc.LATENCY_PREFILL, 0):5.1f} "
              f"+ decode {1000 * a.get(sc.LATENCY_DECODE, 0):6.1f}   in {a[sc.USAGE_INPUT_TOKENS]} / out "
              f"{a[sc.USAGE_OUTPUT_TOKENS]} tokens, preemptions {a[sc.NUM_PREEMPTIONS]}, kept for {a[sc.SAMPLING_REASON]}")
        if sc.SLOW_CAUSE in a:  # the slow-cause verdict, with the seconds of each cause that cost something
            costs = ", ".join(f"{c} {1000 * a[sc.SLOW_SECONDS[c]]:.1f}ms" for c in sc.SLOW_CAUSES if a[sc.SLOW_SECONDS[c]])
            print(f"      why: {a[sc.SLOW_CAUSE]}" + (f" ({costs})" if costs else ""))
        worst = sorted(linked[r.context.span_id], key=lambda s: s.start_time - s.end_time)[:3]
        for st in worst:
            sa = st.attributes
            print(f"      engine step {1000 * (st.end_time - st.start_time) / 1e9:5.1f}ms {sa[sc.STEP_PHASE]:7s} "
                  f"batch {sa[sc.STEP_BATCH_SIZE]:2d}: prefill {sa[sc.STEP_NUM_PREFILL_TOKENS]:3d} tokens "
                  f"({sa[sc.STEP_NUM_PREFILL_REQS]} req), decode {sa[sc.STEP_NUM_DECODE_TOKENS]:2d} tokens, "
                  f"KV cache {100 * sa[sc.STEP_KV_CACHE_USAGE]:.0f}%" + step_anatomy(sa))


def step_anatomy(sa) -> str:
    """Where the step's time went (what the engine measured) and, with device peaks known, its bound."""
    parts = [f"{label} {1000 * sa[key]:.1f}ms" for label, key in (
        ("schedule", sc.STEP_SCHEDULE_TIME), ("model", sc.STEP_MODEL_TIME), ("output", sc.STEP_OUTPUT_TIME),
        ("idle before", sc.STEP_IDLE_BEFORE)) if key in sa]
    if sc.STEP_BOUND in sa:
        parts.append(f"{sa[sc.STEP_BOUND]}-bound")
    return ("\n        " + ", ".join(parts)) if parts else ""


def children_ms(children, span, name: str) -> float:
    found = [c for c in children[span.context.span_id] if c.name == name]
    return (found[0].end_time - found[0].start_time) / 1e6 if found else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--out", default="out/demo-traces.jsonl", help="OTLP/JSON lines file for the traces")
    ap.add_argument("--otlp", action="store_true", help="send traces over OTLP/HTTP instead of to a file")
    ap.add_argument("--slo", help="fixed SLOs (e.g. ttft=0.5,tpot=0.05,e2e=5) instead of calibrating them here")
    ap.add_argument("--report", default="out/demo-report.html", help="timeline report to write (file mode)")
    args = ap.parse_args()

    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "otel-llm-demo"}))
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        exporter = OTLPSpanExporter()
        where = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).unlink(missing_ok=True)
        exporter = OTLPJsonFileExporter(args.out)
        where = args.out
    memory = InMemorySpanExporter()  # to print the report from the same spans
    tracer_provider.add_span_processor(SimpleSpanProcessor(memory))

    # warm-up and calibration: spans to memory only (the exporter is attached after them)
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(), sample_rate=1.0)
    print("starting vLLM (CPU, tiny random-weights model; ~30 s)...", flush=True)
    llm = make_llm(max_num_seqs=32, max_num_batched_tokens=512)
    run(llm, workload(8, random.Random(1)))  # warm-up: first-call costs are not the story here
    if args.slo:
        slo, rate = args.slo, RATE
        print(f"SLOs as given: {slo}; requests arrive at {rate:g} req/s")
    else:
        print("calibrating SLOs and arrival rate on this machine...", flush=True)
        cal = calibrate(llm, memory, args.requests)
        slo, rate = cal.slo, cal.rate
        print(cal.describe())
    otel_llm.flush()
    otel_llm.uninstrument()
    memory.clear()

    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]),
                        slo=slo, sample_rate=0.1)
    plan = workload(args.requests, random.Random(WORKLOAD_SEED), rate)
    t0 = time.monotonic()
    finished = run(llm, plan)
    wall = time.monotonic() - t0
    otel_llm.uninstrument()  # waits for the spans of finished requests (built on a background thread)
    tracer_provider.force_flush()
    report(list(memory.get_finished_spans()), reader, wall, finished, slo)
    print(f"\ntraces: {where}")
    if not args.otlp:
        tracer_provider.shutdown()
        trace_json = Path(args.report).with_suffix(".trace.json")
        written = write_report(args.out, args.report, trace_json)
        print(f"timeline report: {written.html}  (open in a browser; Perfetto: {trace_json})")
        print("  to see the traces in Jaeger or Tempo instead: README, 'Jaeger, Tempo and Phoenix recipes'; "
              "`./run demo --otlp` sends them to $OTEL_EXPORTER_OTLP_ENDPOINT")
        return
    tracer_provider.shutdown()


if __name__ == "__main__":
    main()
