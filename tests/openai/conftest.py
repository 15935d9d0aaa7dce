"""One real ``vllm serve`` (tiny model, loopback, instrumented with ``opentelemetry-instrument``) per
session, one in-test OTLP/HTTP receiver for both processes' spans, and the real ``openai`` client
instrumented with our adapter (spans to memory and, over OTLP, to the same receiver)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.core.config import Config
from otel_llm.instrumentation.openai import OpenAIInstrumentor
from support.metrics import points_by_name
from support.otlp_sink import OTLPSink
from support.server import VLLMServer

# A TPOT SLO low enough that the tiny model's chunk gaps cross it: the gap profile has something to count.
SLO = "ttft=5,tpot=0.001,e2e=30"


@pytest.fixture(scope="session")
def sink() -> Iterator[OTLPSink]:
    with OTLPSink() as s:
        yield s


@pytest.fixture(scope="session")
def server(sink: OTLPSink) -> Iterator[VLLMServer]:
    # Engine-step spans off: the joined trace needs the request and its phases, and thousands of step
    # spans decoded by the in-test receiver would compete for this process's GIL with the client we time.
    with VLLMServer(otlp_endpoint=sink.endpoint, env={"OTEL_LLM_ENGINE_STEPS": "false"}) as s:
        yield s


@dataclass
class Client:
    """The instrumented client side: where its spans and metrics land."""

    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider
    instrumentor: OpenAIInstrumentor

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metric_points(self, name: str) -> list[Any]:
        return points_by_name(self.metrics.get_metrics_data())[name]

    def reinstrument(self, **options: Any) -> None:
        self.instrumentor.uninstrument()
        self.instrumentor.instrument(tracer_provider=self.tracer_provider, meter_provider=self._meter_provider,
                                     config=Config.resolve({"slo": SLO, **options}))

    _meter_provider: Any = None


@pytest.fixture(scope="session")
def client_side(sink: OTLPSink) -> Iterator[Client]:
    memory = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{sink.endpoint}/v1/traces"),
                                             schedule_delay_millis=200))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    inst = OpenAIInstrumentor()
    inst.instrument(tracer_provider=tp, meter_provider=mp, config=Config.resolve({"slo": SLO}))
    c = Client(memory, reader, tp, inst)
    c._meter_provider = mp
    yield c
    inst.uninstrument()
    tp.shutdown()
    mp.shutdown()


@pytest.fixture
def client(client_side: Client) -> Client:
    client_side.spans.clear()
    return client_side
