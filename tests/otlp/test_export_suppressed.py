"""Our own exports run inside OpenTelemetry's suppress-instrumentation context, as the SDK's processors run
their exporters: with an HTTP-client instrumentation active (requests, which the OTLP/HTTP exporter uses and
``opentelemetry-bootstrap`` installs), sending our spans makes no span of its own."""

from __future__ import annotations

import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from support.otlp_sink import OTLPSink
from test_otlp_wire import RESOURCE, finish_request, telemetry_for


def test_direct_export_makes_no_span_under_an_http_client_instrumentation():
    client_spans = InMemorySpanExporter()  # what the requests instrumentation records, on a provider of its own
    client_provider = TracerProvider()
    client_provider.add_span_processor(SimpleSpanProcessor(client_spans))
    instrumentor = RequestsInstrumentor()
    instrumentor.instrument(tracer_provider=client_provider)
    try:
        with OTLPSink() as sink:
            tp = TracerProvider(resource=RESOURCE)
            tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint=f"{sink.endpoint}/v1/traces")))
            tel = telemetry_for(tp)
            assert tel.spans.wire_export() is not None  # the direct route
            finish_request(tel, "r1", tokens=20)
            assert tel.flush(10) and tp.force_flush()
            assert tel.spans.wire_export().counts.spans_sent == len(sink.spans()) > 0
            assert client_spans.get_finished_spans() == ()  # nothing of our export was traced
            # the instrumentation is live: the application's own request through requests is traced
            requests.get(f"{sink.endpoint}/", timeout=10)
            assert len(client_spans.get_finished_spans()) == 1
            tel.close()
            tp.shutdown()
    finally:
        instrumentor.uninstrument()
