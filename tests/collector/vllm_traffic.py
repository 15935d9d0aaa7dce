"""Run in a subprocess by test_vllm.py: a real vLLM engine with native tracing to one gateway and our SDK
exporting spans to another; dumps vLLM's own TTFT numbers and the SDK's metrics as JSON.

A subprocess because vLLM's native tracing sets the global tracer provider, which must not leak
into the pytest process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helpers in tests/support


def main(native_endpoint: str, sdk_endpoint: str, out_path: str) -> None:
    from support.engine import make_llm, prepare_env

    prepare_env()
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    import otel_llm

    tp = TracerProvider(resource=Resource.create({"service.name": "sdk"}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sdk_endpoint, insecure=True)))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    instrumented = otel_llm.instrument(tracer_provider=tp, meter_provider=mp, sample_rate=1.0, tail_quantile=0.0)

    from vllm import SamplingParams

    llm = make_llm(otlp_traces_endpoint=f"http://{native_endpoint}")
    prompts = [f"request {i} " + "word " * (3 + 5 * i) for i in range(6)]
    llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0), use_tqdm=False)

    vllm_ttft: dict[str, float] = {}
    for m in llm.get_metrics():
        if m.name == "vllm:time_to_first_token_seconds":
            vllm_ttft = {"count": float(m.count), "sum": float(m.sum)}
    otel_llm.flush()  # our spans are built on a background thread
    native_tp = trace.get_tracer_provider()
    if hasattr(native_tp, "force_flush"):
        native_tp.force_flush()
    tp.force_flush()
    data = reader.get_metrics_data()
    with open(out_path, "w") as f:
        json.dump({"instrumented": instrumented, "vllm_ttft": vllm_ttft, "requests": len(prompts),
                   "sdk_metrics": json.loads(data.to_json()) if data else None}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
