"""Full detail's span building and per-request metrics, replayed from requests captured on the real engine.

``--capture``: runs the real vLLM engine (tiny model, CPU; ``vllm_overhead.py``'s workload: 64 requests x
128 output tokens, offline ``LLM.generate``) at full detail (``sample_rate=1.0, baseline_detail="steps"``,
direct export to a discarding OTLP/HTTP sink) and pickles what ``SpanBuilder.request`` was given for each
request of two workloads (timeline, summary, attributes, detail, clock offset, the engine steps it ran in,
TPOT SLO) to ``--data``. The steps and stamps are the engine's own, so the spans built from them are the
real engine's mix (~27 a request: request, phases, chunks, decode-step rows and windows).

Replay (``--root A --root B``, interleaved rounds, one subprocess per checkout and round): each checkout
builds those requests' spans (wire route: OTLP bytes, direct export; the exporter's ``add`` captures the
bytes instead of sending) and records their metrics with the exemplar context a kept request has, as the
materializer does. Reported per checkout: thread CPU per output token of ``SpanBuilder.request`` and of
``metrics.record`` (medians over passes, then over rounds), and the spans' count, bytes and SHA-256 with
ids drawn from a seeded ``random`` (the SDK's default id generator draws from it): two checkouts that
write the same spans give the same hash.

Run: /work/bin/wtpy benchmarks/full_detail_replay.py --capture --data /tmp/full_detail_requests.pkl
     /work/bin/wtpy benchmarks/full_detail_replay.py --data /tmp/full_detail_requests.pkl --root /tmp/main-src --root .
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
OUTPUT_TOKENS = 128


def capture(data: str) -> None:
    import copy

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.path.insert(0, str(Path(__file__).parent))
    from support.engine import engine_args, prepare_env
    prepare_env()
    os.environ.pop("OTEL_LLM_STEP_DIR", None)
    from vllm import LLM, SamplingParams

    import otel_llm
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from otel_llm.core import spans
    from vllm_overhead import start_sink

    captured: list[bytes] = []
    request = spans.SpanBuilder.request

    def recording(self, t, s, attributes, detail, clock, steps=(), tpot_slo=None, choice_of=None, max_spans=None):
        if choice_of is None:
            t2 = copy.copy(t)
            t2.native = t2.group = None  # the engine's own objects: not part of what spans are built from
            captured.append(pickle.dumps((t2, s, dict(attributes), detail, clock.offset_ns, list(steps), tpot_slo)))
        return request(self, t, s, attributes, detail, clock, steps, tpot_slo, choice_of, max_spans)
    spans.SpanBuilder.request = recording
    sink, endpoint = start_sink()
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    mp = MeterProvider()
    otel_llm.instrument(tracer_provider=tp, meter_provider=mp)  # the step hooks armed for the engine
    llm = LLM(**engine_args(max_num_seqs=64, max_num_batched_tokens=512))
    otel_llm.uninstrument()
    prompts = [{"prompt_token_ids": [5 + (i * 31 + j) % 400 for j in range(16 + (i % 8) * 8)]} for i in range(64)]
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0.0)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    otel_llm.instrument(tracer_provider=tp, meter_provider=mp, sample_rate=1.0, baseline_detail="steps")
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False)
    otel_llm.flush()
    otel_llm.uninstrument()
    sink.terminate()
    Path(data).write_bytes(pickle.dumps(captured))
    print(f"captured {len(captured)} requests to {data}")


class _Clock:
    """The captured request's WallClock (its offset), so every checkout writes the same timestamps."""

    __slots__ = ("offset_ns",)

    def __init__(self, offset_ns: int) -> None:
        self.offset_ns = offset_ns

    def mono_ns(self, mono_s: float) -> int:
        return int(mono_s * 1e9) + self.offset_ns

    @staticmethod
    def wall_ns(wall_s: float) -> int:
        return int(wall_s * 1e9)


def child(data: str, passes: int) -> dict:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import NonRecordingSpan

    from otel_llm.core.config import Config
    from otel_llm.core.pipeline import Pipeline
    from otel_llm.otlp import direct_export

    sent: list[tuple[bytes, int]] = []
    direct_export.DirectExport.add = lambda self, spans, count, frame=None: sent.append((spans, count)) or True
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")))
    pipeline = Pipeline(Config.resolve({"sample_rate": 1.0, "baseline_detail": "steps"}), tp.get_tracer("otel_llm"),
                        MeterProvider().get_meter("bench"), "vllm")
    jobs = [pickle.loads(b) for b in pickle.loads(Path(data).read_bytes())]
    tt = time.thread_time_ns
    rows, digest = [], {}
    for n in range(passes + 1):  # the first is a warm-up, and the one whose bytes are hashed
        random.seed(n)
        sent.clear()
        spans_ns = metrics_ns = 0
        for t, s, attrs, detail, offset, steps, slo in jobs:
            a = tt()
            kept = pipeline.spans.request(t, s, attrs, detail, _Clock(offset), steps, slo)
            b = tt()
            pipeline.metrics.record(s, trace.set_span_in_context(NonRecordingSpan(kept.context)) if kept else None)
            spans_ns, metrics_ns = spans_ns + b - a, metrics_ns + tt() - b
        if n == 0:
            raw = b"".join(x for x, _ in sent)
            digest = {"spans": sum(c for _, c in sent), "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        else:
            rows.append((spans_ns, metrics_ns))
    tokens = len(jobs) * OUTPUT_TOKENS
    pipeline.close()
    return {"spans_us_per_token": statistics.median(r[0] for r in rows) / tokens / 1e3,
            "metrics_us_per_token": statistics.median(r[1] for r in rows) / tokens / 1e3, **digest}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/tmp/full_detail_requests.pkl")
    ap.add_argument("--capture", action="store_true", help="capture requests from the real engine to --data")
    ap.add_argument("--root", action="append", help="a checkout to measure (repeatable)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--passes", type=int, default=5, help="passes over the captured requests per round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "full_detail_replay.json"))
    args = ap.parse_args()
    if args.capture:
        capture(args.data)
        return
    if args.child:
        print(json.dumps(child(args.data, args.passes)))
        return
    roots = [str(Path(r).resolve()) for r in (args.root or [str(Path(__file__).resolve().parents[1])])]
    results: dict[str, list[dict]] = {r: [] for r in roots}
    load = [os.getloadavg()[0]]
    for rnd in range(args.rounds):
        for root in (roots if rnd % 2 == 0 else roots[::-1]):
            proc = subprocess.run([sys.executable, __file__, "--child", "--data", args.data, "--passes",
                                   str(args.passes)], env=dict(os.environ, PYTHONPATH=root), cwd=root,
                                  capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{root}: {proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results[root].append(res)
            print(f"round {rnd + 1} {root}: {res}", flush=True)
        load.append(os.getloadavg()[0])
    summary = {r: {k: (round(statistics.median(x[k] for x in results[r]), 3) if isinstance(results[r][0][k], float)
                       else results[r][0][k]) for k in results[r][0]} for r in roots}
    out = {"workload": "requests captured on the real engine at full detail (64 requests x 128 output tokens a "
                       "workload), their spans built (wire route) and metrics recorded (exemplar context)",
           "unit": "thread CPU us per output token", "rounds": args.rounds, "passes_per_round": args.passes,
           "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores, shared",
           "load_average_1min_per_round": load, "median": summary, "raw": results}
    if len(roots) == 2:
        a, b = roots
        for k in ("spans_us_per_token", "metrics_us_per_token"):
            out[f"paired_b_minus_a_{k}"] = round(statistics.median(
                y[k] - x[k] for x, y in zip(results[a], results[b])), 3)
        out["same_spans_and_bytes"] = all(x[k] == y[k] for x, y in zip(results[a], results[b])
                                          for k in ("spans", "bytes", "sha256"))
    for r in roots:
        print(r, summary[r])
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}; load {load}")


if __name__ == "__main__":
    main()
