"""Shared fixtures: in-memory OpenTelemetry providers and one instrumented real vLLM engine per session."""

from __future__ import annotations

import contextlib
import multiprocessing.util  # noqa: F401  (first: see below)
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, settings
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from support.engine import prepare_env
from support.metrics import points_by_name
from support.otlp_sink import OTLPSink

prepare_env()

# Hypothesis times each example (200 ms deadline) and flags slow data generation: both measure the machine,
# not our code, and fail on a loaded 2-core box. Every property test here runs without them. Examples are
# derived from each test's name (`derandomize`), so a run draws what the previous one drew: a failure found
# once is found again, and the suite does not fail on one machine's draw only.
settings.register_profile("deterministic", deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("deterministic")

# multiprocessing's exit hook joins non-daemon children (vLLM's EngineCore); vLLM's own shutdown of
# them runs from weakref.finalize's exit hook. atexit runs hooks in reverse order of registration,
# so multiprocessing's must be registered first, or a session whose first weakref.finalize (e.g. a
# TemporaryDirectory in a serve test) came before vLLM's import hangs at exit joining an EngineCore
# nobody told to stop. Importing multiprocessing.util above registers it.


class Otel:
    """In-memory span and metric capture, re-armed per test.

    ``instrumented(transport="otlp")`` sends spans instead as a deployment does (batch processor,
    OTLP/HTTP exporter, hence our direct export) to a real receiver on loopback, and reads them
    back from there, so the same assertions cover both paths."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.sink: OTLPSink | None = None
        self.otlp_provider: TracerProvider | None = None

    def finished(self) -> list[ReadableSpan]:
        assert otel_llm.flush(60)  # spans are built on a background thread (60 s: a bound for a hang, not a speed)
        if self.sink is not None:
            assert self.otlp_provider is not None and self.otlp_provider.force_flush()
            return [s.readable() for s in self.sink.spans()]
        return list(self.spans.get_finished_spans())

    def histogram(self, name: str) -> list[Any]:
        """Data points of one histogram, across all attribute sets."""
        assert otel_llm.flush(60)  # kept requests record their metrics with their spans
        return points_by_name(self.reader.get_metrics_data())[name]

    def counter(self, name: str) -> float:
        return sum(p.value for p in self.histogram(name))

    @contextlib.contextmanager
    def instrumented(self, transport: str = "memory", **options: Any) -> Iterator[Any]:
        """Re-instrument with these options; yields the vLLM instrumentor (its ``telemetry`` is live)."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        from otel_llm.instrumentation.vllm import VLLMInstrumentor

        otel_llm.uninstrument()
        self.spans.clear()
        # readers are cumulative: a fresh one per instrumentation keeps tests independent
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        tracer_provider = self.tracer_provider
        if transport == "otlp":
            self.sink = OTLPSink().start()
            tracer_provider = self.otlp_provider = TracerProvider()
            tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
                endpoint=f"{self.sink.endpoint}/v1/traces")))
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=self.meter_provider, **options)
        try:
            yield VLLMInstrumentor()
        finally:
            otel_llm.uninstrument()
            if self.sink is not None:
                self.otlp_provider.shutdown()
                self.sink.stop()
                self.sink = self.otlp_provider = None


@pytest.fixture(scope="session")
def otel() -> Otel:
    return Otel()


@pytest.fixture(scope="session")
def llm(otel: Otel) -> Any:
    """One real vLLM engine (EngineCore in its own process, the default) for the session.

    Instrumented while it is built, so the engine starts with per-request statistics on and
    the step hooks armed in its EngineCore process.
    """
    from support.engine import make_llm

    with otel.instrumented(sample_rate=1.0):
        engine = make_llm()
    yield engine
    otel_llm.uninstrument()
