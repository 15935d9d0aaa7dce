"""Shared fixtures: in-memory OpenTelemetry providers and one instrumented real vLLM engine per session."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm.testing.engine import prepare_env
from otel_llm.testing.metrics import points_by_name

prepare_env()


class Otel:
    """In-memory span and metric capture, re-armed per test."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self) -> list[ReadableSpan]:
        assert otel_llm.flush(10)  # spans are built on a background thread
        return list(self.spans.get_finished_spans())

    def histogram(self, name: str) -> list[Any]:
        """Data points of one histogram, across all attribute sets."""
        assert otel_llm.flush(10)  # kept requests record their metrics with their spans
        return points_by_name(self.reader.get_metrics_data())[name]

    def counter(self, name: str) -> float:
        return sum(p.value for p in self.histogram(name))

    @contextlib.contextmanager
    def instrumented(self, **options: Any) -> Iterator[Any]:
        """Re-instrument with these options; yields the vLLM instrumentor (its ``telemetry`` is live)."""
        from otel_llm.instrumentation.vllm import VLLMInstrumentor

        otel_llm.uninstrument()
        self.spans.clear()
        # readers are cumulative: a fresh one per instrumentation keeps tests independent
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        otel_llm.instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options)
        try:
            yield VLLMInstrumentor()
        finally:
            otel_llm.uninstrument()


@pytest.fixture(scope="session")
def otel() -> Otel:
    return Otel()


@pytest.fixture(scope="session")
def llm(otel: Otel) -> Any:
    """One real vLLM engine (EngineCore in its own process, the default) for the session.

    Instrumented while it is built, so the engine starts with per-request statistics on and
    the step hooks armed in its EngineCore process.
    """
    from otel_llm.testing.engine import make_llm

    with otel.instrumented(sample_rate=1.0):
        engine = make_llm()
    yield engine
    otel_llm.uninstrument()
