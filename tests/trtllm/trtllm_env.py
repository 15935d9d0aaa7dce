"""The stand-in TensorRT-LLM instrumented through the real adapter and the real core, with in-memory providers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.core.config import Config
from otel_llm.instrumentation.tensorrt_llm import TensorRTLLMInstrumentor
from support.metrics import points_by_name


@dataclass
class Env:
    inst: TensorRTLLMInstrumentor
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    modules: dict

    def spans(self) -> list[ReadableSpan]:
        assert self.inst.telemetry.flush(10)
        return list(self.exporter.get_finished_spans())

    def waiting(self) -> int:
        """Finished requests waiting for their iteration stats (after the ledger's thread caught up)."""
        assert self.inst.telemetry.ledger.sync(10)
        return len(self.inst.telemetry.ledger.waiting)

    def clear(self) -> None:
        """Forget the spans so far (after the background thread built every one of them)."""
        assert self.inst.telemetry.flush(10)
        self.exporter.clear()

    def points(self, name: str) -> list[Any]:
        assert self.inst.telemetry.flush(10)
        return points_by_name(self.reader.get_metrics_data())[name]


def instrumented(modules: dict, **options: Any) -> Env:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    inst = TensorRTLLMInstrumentor()
    # A TPOT SLO below any gap makes every decode step eventful: the per-update decode steps and the
    # iterations behind them stay spans of their own instead of coalescing into llm.decode.window rows,
    # so these tests see all of what the adapter translated.
    opts = dict(sample_rate=1.0, baseline_detail="steps", tail_quantile=0, slo="tpot=0.000000001")
    opts.update(options)
    inst.instrument(tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[reader]),
                    config=Config.resolve(opts))
    return Env(inst, exporter, reader, tp, modules)


