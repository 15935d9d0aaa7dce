"""One real engine run with vLLM symbols removed in every process (support/fence_site/sitecustomize.py),
for tests/vllm/test_vllm_fence_fallbacks.py: writes what the frontend recorded, as JSON, to OTEL_LLM_TEST_RESULT.

    OTEL_LLM_TEST_REMOVE=module:Class.attr,... PYTHONPATH=support/fence_site:. python -m support.fenced_run
"""

from __future__ import annotations

import json
import os


def main() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_llm
    from support.log_lines import capture_otel_llm_log
    from otel_llm import semconv as sc
    from support.engine import make_llm
    from support.traces import engine_steps, request_trees

    log = capture_otel_llm_log()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider(), sample_rate=1.0,
                        baseline_detail="steps", tail_quantile=0)
    llm = make_llm()
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [3 + (j * 7) % 500 for j in range(1 + 23 * i)]} for i in range(8)]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0), use_tqdm=False)
    otel_llm.flush()
    spans = exporter.get_finished_spans()
    trees = request_trees(spans)
    requests = []
    for o in outputs:
        t = trees.get(o.request_id)
        chunks = t.grandchildren[sc.SPAN_PREFILL_CHUNK] if t else []
        requests.append({"prompt": len(o.prompt_token_ids), "generated": len(o.outputs[0].token_ids),
                         "chunk_tokens": sum(c.attributes[sc.CHUNK_TOKENS] for c in chunks),
                         "chunk_steps_linked": all(sc.ENGINE_STEP_ID in c.attributes for c in chunks)})
    stats = otel_llm.stats()
    with open(os.environ["OTEL_LLM_TEST_RESULT"], "w") as f:  # not stdout: vLLM's own lines go there
        json.dump({"requests": requests, "steps": len(engine_steps(spans)), "stats": stats, "log": log.lines},
                  f, default=str)
    otel_llm.uninstrument()


if __name__ == "__main__":
    main()
