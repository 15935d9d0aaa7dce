"""The materializer's GIL offer on a real vLLM engine: after every job (main until 2026-11-30) vs once ~0.3 ms
of work ran since the last offer, in one process, interleaved rounds.

Same engine and workload as ``vllm_overhead.py`` (64 requests x 128 output tokens, offline
``LLM.generate``, tiny model on CPU), ``instrument()`` defaults, spans to a null exporter. Modes: ``none``
(uninstrumented), ``old`` (``Materializer._run`` as it was: ``time.sleep(0)`` after each job), ``new``
(this checkout's ``_run``); everything else is this checkout's code in both. Per measurement: process CPU
per output token (2 workloads) and the materializer thread's own CPU (``pthread_getcpuclockid``).
Writes benchmarks/results/materializer_yield_ab.json.

Run: /work/bin/wtpy benchmarks/materializer_yield_ab.py
"""
import json
from pathlib import Path
import sys, os, time, statistics
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
def main():
    from support.engine import engine_args, prepare_env
    prepare_env(); os.environ.pop("OTEL_LLM_STEP_DIR", None)
    from vllm import LLM, SamplingParams
    import otel_llm
    from otel_llm.core import materializer as mz
    from otel_llm.core.guard import GUARD
    from otel_llm.instrumentation.vllm import VLLMInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    new_run = mz.Materializer._run
    def old_run(self):  # main's loop
        while True:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
                self._cv.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._work(job)
            except Exception as exc:
                GUARD.failed("span materializer", exc)
            time.sleep(0)
    class Null(SpanExporter):
        def export(self, spans): return SpanExportResult.SUCCESS
    tp = TracerProvider(); tp.add_span_processor(BatchSpanProcessor(Null())); mp = MeterProvider()
    otel_llm.instrument(tracer_provider=tp, meter_provider=mp)
    llm = LLM(**engine_args(max_num_seqs=64, max_num_batched_tokens=512))
    otel_llm.uninstrument()
    prompts = [{"prompt_token_ids": [5 + (i * 31 + j) % 400 for j in range(16 + (i % 8) * 8)]} for i in range(64)]
    params = SamplingParams(max_tokens=128, ignore_eos=True, temperature=0.0)
    llm.generate(prompts, params, use_tqdm=False)
    res = {"none": [], "old": [], "new": []}
    mth = {"old": [], "new": []}
    order = ["none", "old", "new"]
    loads = [os.getloadavg()[0]]
    for rnd in range(8):
        for mode in (order if rnd % 2 == 0 else order[::-1]):
            if mode != "none":
                mz.Materializer._run = old_run if mode == "old" else new_run
                otel_llm.instrument(tracer_provider=tp, meter_provider=mp)
                r = VLLMInstrumentor().step_receiver
                if r is not None: r.drain(lambda s: None)
            c0 = time.process_time()
            for _ in range(2):
                llm.generate(prompts, params, use_tqdm=False)
            if mode != "none":
                otel_llm.flush()
                th = VLLMInstrumentor().telemetry.materializer._thread
                mth[mode].append(time.clock_gettime(time.pthread_getcpuclockid(th.ident)) / (2 * 64 * 128) * 1e6)
            cpu = time.process_time() - c0
            if mode != "none":
                otel_llm.uninstrument()
            res[mode].append(cpu / (2 * 64 * 128) * 1e6)
        loads.append(os.getloadavg()[0])
        print(rnd, {k: round(v[-1], 2) for k, v in res.items()}, {k: round(v[-1], 2) for k, v in mth.items()}, os.getloadavg()[0], flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print("median us/token", med)
    print("paired new-old", statistics.median(b - a for a, b in zip(res["old"], res["new"])),
          "old-none", statistics.median(b - a for a, b in zip(res["none"], res["old"])),
          "new-none", statistics.median(b - a for a, b in zip(res["none"], res["new"])))
    print("materializer thread us/token", {k: statistics.median(v) for k, v in mth.items()})
    out = {"workload": "64 requests x 128 output tokens x 2 per measurement, offline LLM.generate, tiny model, CPU",
           "unit": "CPU us per output token", "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": len(res["none"]),
           "median_process": med, "paired_new_minus_old": statistics.median(b - a for a, b in zip(res["old"], res["new"])),
           "paired_old_minus_none": statistics.median(b - a for a, b in zip(res["none"], res["old"])),
           "paired_new_minus_none": statistics.median(b - a for a, b in zip(res["none"], res["new"])),
           "median_materializer_thread": {k: statistics.median(v) for k, v in mth.items()},
           "load_average_1min_per_round": loads, "raw_process": res, "raw_materializer_thread": mth}
    path = Path(__file__).parent / "results" / "materializer_yield_ab.json"
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)
if __name__ == "__main__": main()
