"""otel-llm demo: a real vLLM engine (CPU, tiny random-weights model), instrumented, on a scripted workload.

Five phases whose causes are known (``otel_llm.demo.scenario``): steady chat (quiet; measured first),
long documents prefilled beside decoding chats (prefill interference), a burst above max_num_seqs
(queueing), a KV-cache squeeze (preemptions, waiting for KV blocks), and two LoRA adapters with one
adapter slot (waiting for the LoRA slot). Arrivals are counted in engine
steps, and the SLOs are multiples of what the quiet phase measured on this machine, so each phase's
requests breach for the phase's reason however fast the machine is. Prints TTFT / TPOT / end-to-end
percentiles (from the metrics, as Prometheus would compute them), goodput, a verdict table (cause ->
requests -> seconds lost -> the phase built to cause it) and the slowest requests with the engine
steps that stretched them. An epilogue runs n-gram speculative decoding on an engine of its own
(``otel_llm.demo.speculation``) and prints what it drafted and accepted (``--no-spec`` skips it).
Traces go to an OTLP/JSON file (or, with --otlp, to an OTLP endpoint); the demo ends by writing the
timeline report of that file (HTML, and a Chrome trace for Perfetto).

    ./run demo                      # writes out/demo-traces.jsonl, out/demo-report.html, out/demo-report.trace.json
    ./run demo --otlp               # sends to $OTEL_EXPORTER_OTLP_ENDPOINT (default localhost:4318)
    ./run demo --slo ttft=0.5,tpot=0.05   # fixed SLOs instead of ones measured in the quiet phase
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Iterator

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm.demo import console, scenario, speculation
from otel_llm.demo.tiny_model import ensure_tiny_model
from otel_llm.otlp.file import OTLPJsonFileExporter
from otel_llm.views.phoenix import OpenInferenceSpans
from otel_llm.views.report import write_report

SERVICE = "otel-llm-demo"


@contextlib.contextmanager
def engine_log(path: Path) -> Iterator[None]:
    """Send what vLLM, torch and their C++ libraries write to stderr into ``path`` (engine start and
    stop are chatty; none of it is the demo's story)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def make_engine(log: Path, engine_args: dict | None = None):
    """The scenario's engine, its EngineCore in this process (each ``step()`` is one scheduler step)."""
    os.environ.update(scenario.ENGINE_ENV)
    os.environ["VLLM_LOGGING_LEVEL"] = os.environ.get("OTEL_LLM_DEMO_VLLM_LOG_LEVEL", "ERROR")
    with engine_log(log):
        from vllm import LLM

        return LLM(model=ensure_tiny_model(), **(engine_args or scenario.ENGINE_ARGS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/demo-traces.jsonl", help="OTLP/JSON lines file for the traces")
    ap.add_argument("--otlp", action="store_true", help="send traces over OTLP/HTTP instead of to a file")
    ap.add_argument("--slo", help="fixed SLOs (e.g. ttft=0.5,tpot=0.05) instead of measuring them in the quiet phase")
    ap.add_argument("--report", default="out/demo-report.html", help="timeline report to write (file mode)")
    ap.add_argument("--summary", help="also write the verdict table per phase as JSON here")
    ap.add_argument("--scale", type=int, default=2, help="waves per cause phase (default 2; 1 is a short run)")
    ap.add_argument("--no-spec", action="store_true", help="skip the speculative-decoding epilogue (a third engine)")
    args = ap.parse_args()
    if args.scale < 1:
        ap.error("--scale must be at least 1")
    if args.slo:
        try:
            otel_llm.SLOTable.coerce(args.slo)
        except ValueError as exc:
            ap.error(f"--slo: {exc}")

    resource = Resource.create({"service.name": SERVICE, "openinference.project.name": SERVICE})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(OpenInferenceSpans())  # span kinds and the verdict where Phoenix shows them
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        where = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).unlink(missing_ok=True)
        exporter = OTLPJsonFileExporter(args.out)
        where = args.out
    log = Path(args.out).with_name("demo-vllm.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    phases = scenario.phases(args.scale)
    memory = InMemorySpanExporter()  # to print the report from the same spans
    tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    # the quiet measurements before each phase: every request sampled, spans kept apart
    measured = InMemorySpanExporter()
    measuring = TracerProvider(resource=resource)
    measuring.add_span_processor(SimpleSpanProcessor(measured))

    @contextlib.contextmanager
    def measure() -> Iterator:
        # the last phase's spans exported first: encoding them on the batch processor's thread while the
        # engine steps (same process, one GIL) slows the steps two to three times, and loosens the SLOs
        tracer_provider.force_flush()
        measured.clear()
        otel_llm.instrument(tracer_provider=measuring, meter_provider=MeterProvider(), sample_rate=1.0,
                            tail_quantile=0)
        try:
            yield lambda: (otel_llm.flush(), console.request_attributes(measured.get_finished_spans()))[1]
        finally:
            otel_llm.uninstrument()

    @contextlib.contextmanager
    def judge(slo: str) -> Iterator:
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider, slo=slo, sample_rate=0.1)
        try:
            yield
        finally:
            otel_llm.uninstrument()  # waits for the spans of finished requests (built on a background thread)

    def said(run: scenario.PhaseRun) -> None:
        before = f"{run.baseline.describe()}\n    " if run.baseline is not None else ""
        print(f"  phase {run.phase.name}: {before}{len(run.phase.arrivals)} requests in {run.seconds:.1f} s "
              f"({run.phase.built})", flush=True)

    print(f"starting vLLM (CPU, tiny random-weights model, EngineCore in this process; ~30-90 s; its log: {log})...",
          flush=True)
    adapters = scenario.adapter_requests(Path(ensure_tiny_model()).parent / "demo-adapters")
    runs: list[scenario.PhaseRun] = []
    wall = 0.0
    for lora in (False, True):  # the LoRA phase on an engine of its own (scenario.LORA_ENGINE_ARGS says why)
        these = [p for p in phases if p.lora == lora]
        if not these:
            continue
        if lora:
            print("starting a second engine, with one LoRA slot, for the LoRA phase...", flush=True)
        with measure():  # the engine is built instrumented (per-request statistics on), and warmed up
            llm = make_engine(log, scenario.LORA_ENGINE_ARGS if lora else scenario.ENGINE_ARGS)
            scenario.warm_up(llm.llm_engine, these, adapters)
        if not runs:
            print(f"SLOs as given: {args.slo}" if args.slo else
                  "each phase's SLOs: from a quiet measurement of its own requests' shape just before it", flush=True)
        t0 = time.monotonic()
        runs += scenario.run_phases(llm.llm_engine, these, measure, judge, args.slo, said, adapters)
        wall += time.monotonic() - t0
        with engine_log(log):  # the engine's shutdown messages
            del llm
            gc.collect()
    finished = sum(len(r.phase.arrivals) for r in runs)
    tracer_provider.force_flush()
    spans = list(memory.get_finished_spans())
    got = console.points_by_name(reader.get_metrics_data())
    tallies = scenario.tally(phases, console.request_attributes(spans))

    slo = args.slo or "per phase, above"
    print(f"\n{finished} requests in {wall:.1f} s; SLOs: {slo}\n")
    for lines in (console.latency_lines(got), [""], console.goodput_lines(got), [""],
                  console.verdict_table(tallies), [""], console.slowest_lines(spans)):
        print("\n".join(lines))
    print(f"\ntraces: {where}")
    tracer_provider.shutdown()
    if not args.otlp:
        trace_json = Path(args.report).with_suffix(".trace.json")
        limits = None
        if len({r.slo for r in runs}) == 1:  # one set of SLOs for the whole run: the report shows them
            judged = otel_llm.SLO.parse(runs[0].slo)
            limits = {k: v for k, v in (("ttft", judged.ttft), ("tpot", judged.tpot), ("e2e", judged.e2e)) if v}
        written = write_report(args.out, args.report, trace_json, slo=limits)
        print(f"timeline report: {written.html}  (open in a browser; Perfetto: {trace_json})")
        print("  to see the traces in Jaeger, Tempo or Phoenix instead: docs/views.md; "
              "`./run demo --otlp` sends them to $OTEL_EXPORTER_OTLP_ENDPOINT")
    accepted = None if args.no_spec else speculate(log, measure)
    if args.summary:
        write_summary(Path(args.summary), runs, wall, tallies, accepted)


def speculate(log: Path, measure) -> speculation.Acceptance:
    """The epilogue: n-gram speculative decoding on an engine of its own (``otel_llm.demo.speculation``)."""
    print(f"\nspeculative decoding (n-gram, {speculation.DRAFT_TOKENS} draft tokens) on an engine of its own: drafts "
          "change every decode step, so it does not share the phases' engine; no verdict cause (a verify "
          "step is the request's own work), so here is what it accepted...", flush=True)
    started = time.monotonic()
    with measure() as finished:
        llm = make_engine(log, speculation.ENGINE_ARGS_SPEC)
        scenario.drive(llm.llm_engine, speculation.ARRIVALS)
        got = speculation.acceptance(finished())
    print(f"  {got.line()}; {time.monotonic() - started:.1f} s with the engine's start", flush=True)
    with engine_log(log):
        del llm
        gc.collect()
    return got


def write_summary(path: Path, runs: list[scenario.PhaseRun], wall: float, tallies: list[scenario.PhaseTally],
                  accepted: speculation.Acceptance | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    slos = {r.phase.name: r.slo for r in runs}
    spec = None if accepted is None else {"requests": accepted.requests, "drafted": accepted.drafted,
                                          "accepted": accepted.accepted, "verify_steps": accepted.verify_steps}
    path.write_text(json.dumps({"wall_s": round(wall, 2), "speculative_decoding": spec, "phases": [
        {"phase": t.phase.name, "slo": slos.get(t.phase.name), "built_to_cause": sorted(t.phase.causes),
         "requests": t.requests, "load_requests": t.load, "load_breached": t.load_breached,
         "load_causes": t.load_causes,
         "breached": t.breached, "causes": t.causes, "seconds": {c: round(s, 4) for c, s in t.seconds.items()},
         "right": t.right, "share_right": None if t.share_right is None else round(t.share_right, 4)}
        for t in tallies]}, indent=1))


if __name__ == "__main__":
    main()
