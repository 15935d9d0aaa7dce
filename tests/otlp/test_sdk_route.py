"""The SDK route (any span processor we do not know) hands every span to the processors as the SDK's
Tracer does: ``on_start`` with the span live and its parent context, then ``on_end``; decode rows too."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from otel_llm import semconv as sc
from test_otlp_wire import RESOURCE, finish_request, telemetry_for


class Recorder(SpanProcessor):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_start(self, span, parent_context=None) -> None:
        parent = trace.get_current_span(parent_context).get_span_context() if parent_context is not None else None
        self.calls.append(("start", span.context.span_id, span.name, span.end_time, parent))
        span.set_attribute("processor.saw_start", True)  # a live span: processors may enrich it

    def on_end(self, span) -> None:
        self.calls.append(("end", span.context.span_id, span.name, span.attributes.get("processor.saw_start")))


def test_every_span_starts_on_the_processors_before_it_ends():
    tp = TracerProvider(resource=RESOURCE)
    recorder = Recorder()
    tp.add_span_processor(recorder)
    tel = telemetry_for(tp)
    assert tel.spans.route.kind == "sdk"
    finish_request(tel, "r1", tokens=12)
    assert tel.flush(10)
    starts = {c[1]: c for c in recorder.calls if c[0] == "start"}
    ends = [c for c in recorder.calls if c[0] == "end"]
    rows = [c for c in ends if c[2] in (sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW)]
    assert rows and len(ends) == len(starts) == len(recorder.calls) / 2
    for _, span_id, name, saw_start in ends:
        assert span_id in starts and starts[span_id][2] == name and saw_start is True
        assert recorder.calls.index(starts[span_id]) < recorder.calls.index(("end", span_id, name, True))
    (decode,) = [c for c in ends if c[2] == sc.SPAN_DECODE]
    for _, span_id, *_ in rows:
        start = starts[span_id]
        assert start[3] is None  # not ended yet when the processor saw it start
        assert start[4] is not None and start[4].span_id == decode[1]  # its parent context: the decode span
    tel.close()
    tp.shutdown()
