"""Decode-step spans written as OTLP wire bytes and sent with the provider's own exporters."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPCExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                       ExportTraceServiceResponse)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from otel_llm.otlp import encode as wire
from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.otlp.direct_export import DirectExport
from otel_llm.otlp.routes import Router
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestTimeline
from support.otlp_sink import OTLPSink, decode

RESOURCE = Resource.create({"service.name": "wire-test", "deployment": "ci", "replicas": 3})
SCOPE = InstrumentationScope("otel_llm", "9.9", "https://example.test/schema")


@pytest.mark.parametrize("state", [TraceState(), TraceState([("vendor", "x1")])])
@pytest.mark.parametrize("remote", [False, True])
def test_wire_bytes_equal_the_sdk_encoders_for_the_same_spans(state, remote):
    parent = SpanContext(0x0123456789ABCDEF0123456789ABCDEF, 0xFEDCBA9876543210, remote, TraceFlags(1), state)
    ids = wire.span_ids(300)
    index, tokens = wire.IntAttribute(sc.STEP_INDEX, cache_below=100), wire.IntAttribute(sc.STEP_TOKENS)
    steps = [(ids[i], 1_700_000_000_000_000_000 + 7 * i, 1_700_000_000_000_000_000 + 7 * i + 5, i + 1,
              1 + (i % 3 == 0)) for i in range(300)]  # indices past the attribute cache, multi-token steps
    sdk = [ReadableSpan(name=sc.SPAN_DECODE_STEP, parent=parent, resource=RESOURCE, instrumentation_scope=SCOPE,
                        context=SpanContext(parent.trace_id, int.from_bytes(sid, "big"), False, parent.trace_flags,
                                            parent.trace_state),
                        attributes={sc.STEP_INDEX: i, sc.STEP_TOKENS: n}, start_time=start, end_time=end)
           for sid, start, end, i, n in steps]
    encoder = wire.SiblingSpans(parent, sc.SPAN_DECODE_STEP)
    ours = wire.RequestFrame.for_tracer(RESOURCE, SCOPE).request(
        encoder.encode(sid, start, end, index(i) + tokens(n)) for sid, start, end, i, n in steps)
    if not remote:  # decode steps always have a local parent (the decode span): byte for byte
        assert ours == encode_spans(sdk).SerializeToString()
    else:  # our encoder always says "local parent"; everything else identical
        expected = encode_spans(sdk)
        for span in expected.resource_spans[0].scope_spans[0].spans:
            span.flags = 0x100
        assert ExportTraceServiceRequest.FromString(ours) == expected


def test_attribute_values_of_every_supported_type_round_trip():
    attrs = {"s": "héllo", "i": -3, "big": 2**62, "f": 0.25, "b": True, "no": False, "arr": ("a", "b"),
             "ints": [1, 2]}
    decoded = decode(wire.RequestFrame.for_tracer(RESOURCE, SCOPE).request(
        [wire.SiblingSpans(SpanContext(1, 2, False), "x").encode(b"\x00" * 7 + b"\x01", 1, 2,
                                                                 wire.attributes(attrs))]))
    assert decoded[0].attributes == {**attrs, "ints": (1, 2)}
    with pytest.raises(TypeError, match="attribute 'd'"):
        wire.attributes({"d": {"nested": 1}})


def test_span_ids_are_distinct_and_never_zero():
    ids = wire.span_ids(10_000)
    assert len(set(ids)) == 10_000 and all(len(i) == 8 and i != bytes(8) for i in ids)
    assert wire.span_ids(0) == []


# -- through the pipeline, to real OTLP receivers ------------------------------------------------


def stalled_gaps(tokens: int) -> list[float]:
    """10 ms between tokens, 50 ms for every tenth (decode steps 5, 15, ...): stalls kept as their own
    spans, windows between them."""
    return [0.05 if i % 10 == 5 else 0.01 for i in range(1, tokens)]


def expected_rows(tokens: int) -> int:
    stalls = [i for i in range(1, tokens) if i % 10 == 5]
    return len(stalls) + sum(1 for lo, hi in zip([0] + stalls, stalls + [tokens]) if hi - lo > 1)


def finish_request(telemetry: Pipeline, rid: str, tokens: int) -> None:
    base = time.monotonic() - 2.0
    t = RequestTimeline(rid, time.time() - 2.0, model="m", response_id=rid, input_tokens=10)
    assert telemetry.start(t)
    t.events += [(QUEUED, base), (SCHEDULED, base + 0.01)]
    t.token_ts.append(base + 0.05)
    for g in stalled_gaps(tokens):
        t.token_ts.append(t.token_ts[-1] + g)
    decode_s = t.token_ts[-1] - t.token_ts[0]
    telemetry.finish(rid, RequestSummary(model="m", ttft=0.05, e2e=0.05 + decode_s, queue=0.01, prefill=0.04,
                                         decode=decode_s, tpot=0.01, input_tokens=10, output_tokens=tokens))


def telemetry_for(tp: TracerProvider, **options) -> Pipeline:
    config = Config.resolve({"sample_rate": 1.0, "baseline_detail": "steps", **options}, environ={})
    return Pipeline(config, tp.get_tracer("otel_llm", "9.9"), MeterProvider().get_meter("t"), "test", router=Router)


def check_trace(spans, tokens: int) -> None:
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (request,) = [s for s in spans if not s.parent_span_id]
    (decode_span,) = by_name[sc.SPAN_DECODE]
    rows = sorted(by_name[sc.SPAN_DECODE_STEP] + by_name.get(sc.SPAN_DECODE_WINDOW, []), key=lambda s: s.start_ns)
    assert len(rows) == expected_rows(tokens)
    assert {s.trace_id for s in spans} == {request.trace_id}
    assert all(s.parent_span_id == decode_span.span_id for s in rows)
    stalls = [s.attributes[sc.STEP_INDEX] for s in rows if s.name == sc.SPAN_DECODE_STEP]
    assert [i for i in stalls if i % 10 == 5] == [i for i in range(1, tokens) if i % 10 == 5]
    assert sum(s.attributes.get(sc.STEP_TOKENS) or s.attributes[sc.WINDOW_TOKENS] for s in rows) == tokens - 1
    # the rows tile the decode span, on the same clock as the spans the SDK built
    assert rows[0].start_ns == decode_span.start_ns
    assert all(a.end_ns == b.start_ns for a, b in zip(rows, rows[1:]))
    assert rows[-1].end_ns <= decode_span.end_ns
    assert {s.service for s in spans} == {"wire-test"}
    assert len({s.span_id for s in spans}) == len(spans)


def test_decode_steps_go_direct_over_otlp_http_with_the_exporters_settings():
    with OTLPSink() as sink:
        tp = TracerProvider(resource=RESOURCE)
        exporter = HTTPExporter(endpoint=f"{sink.endpoint}/v1/traces", compression=Compression.Gzip)
        tp.add_span_processor(BatchSpanProcessor(exporter))
        tel = telemetry_for(tp)
        assert tel.spans.wire_export() is not None
        finish_request(tel, "r1", tokens=40)
        assert tel.flush(10) and tp.force_flush()
        check_trace(sink.spans(), 40)
        # every span of the request went direct: request, queue, prefill, decode and its rows
        assert tel.spans.wire_export().counts.spans_sent == len(sink.spans()) == 4 + expected_rows(40)
        tel.close()
        tp.shutdown()


class GRPCTraceSink:
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.metadata: list[dict] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def export(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.requests.append(ExportTraceServiceRequest.FromString(request))
            self.metadata.append(dict(context.invocation_metadata()))
            return ExportTraceServiceResponse().SerializeToString()

        handler = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def spans(self):
        return [s for r in self.requests for s in decode(r.SerializeToString())]


def test_decode_steps_go_direct_over_otlp_grpc_with_its_headers():
    sink = GRPCTraceSink()
    try:
        tp = TracerProvider(resource=RESOURCE)
        exporter = GRPCExporter(endpoint=f"localhost:{sink.port}", insecure=True, headers={"x-tenant": "t1"})
        tp.add_span_processor(BatchSpanProcessor(exporter))
        tel = telemetry_for(tp)
        finish_request(tel, "r1", tokens=25)
        assert tel.flush(10) and tp.force_flush()
        check_trace(sink.spans(), 25)
        assert all(m.get("x-tenant") == "t1" for m in sink.metadata)
        tel.close()
        tp.shutdown()
    finally:
        sink.server.stop(0)


def test_any_other_span_processor_sees_every_span_instead():
    with OTLPSink() as sink:
        tp = TracerProvider(resource=RESOURCE)
        tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint=f"{sink.endpoint}/v1/traces")))
        tel = telemetry_for(tp)
        assert tel.spans.wire_export() is not None
        memory = InMemorySpanExporter()  # added after instrumenting: it must not miss the decode steps
        tp.add_span_processor(SimpleSpanProcessor(memory))
        finish_request(tel, "r1", tokens=10)
        assert tel.flush(10) and tp.force_flush()
        assert tel.spans.wire_export() is None
        names = [s.name for s in memory.get_finished_spans()]
        assert names.count(sc.SPAN_DECODE_STEP) + names.count(sc.SPAN_DECODE_WINDOW) == expected_rows(10)
        check_trace(sink.spans(), 10)  # and the OTLP destination still gets them, via the processors
        tel.close()
        tp.shutdown()


def test_the_option_turns_it_off():
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint="http://127.0.0.1:9/v1/traces")))
    assert telemetry_for(tp, direct_export=False).spans.wire_export() is None
    assert telemetry_for(tp).spans.wire_export() is not None
    tp.shutdown()


def test_a_dead_endpoint_drops_counted_and_a_full_buffer_refuses():
    frame = wire.RequestFrame.for_tracer(RESOURCE, SCOPE)
    calls = []

    def dead(data: bytes) -> bool:
        calls.append(len(data))
        return False

    direct = DirectExport([dead], frame, max_batch_bytes=1000, max_buffer_bytes=2000, schedule_delay=60)
    encoder = wire.SiblingSpans(SpanContext(1, 2, False), "x")
    chunk = b"".join(encoder.encode(i, 1, 2, b"") for i in wire.span_ids(5))
    assert direct.add(chunk, 5)
    assert direct.flush(5)
    assert direct.counts.spans_dropped == 5 and direct.counts.requests_failed == 1 and len(calls) == 1
    assert not direct.add(b"x" * 3000, 40)  # over the buffer bound: refused at once, counted
    assert direct.counts.spans_dropped == 45
    direct.close()
    assert not direct.add(chunk, 5)  # closed


def test_batches_split_by_size_and_go_out_on_the_schedule():
    frame = wire.RequestFrame.for_tracer(RESOURCE, SCOPE)
    got: list[int] = []
    direct = DirectExport([lambda data: got.append(len(decode(data))) or True], frame,
                          max_batch_bytes=2000, schedule_delay=0.05)
    encoder = wire.SiblingSpans(SpanContext(1, 2, False), "x")
    for _ in range(10):
        direct.add(b"".join(encoder.encode(i, 1, 2, b"") for i in wire.span_ids(20)), 20)
    deadline = time.monotonic() + 5
    while sum(got) < 200 and time.monotonic() < deadline:  # no flush: the schedule delay sends them
        time.sleep(0.01)
    assert sum(got) == 200 and max(got) <= 40  # 2,000 bytes ~ 2 chunks of 20 spans
    assert direct.counts.spans_sent == 200
    direct.close()


class CountingIds:
    """Deterministic ids, so the SDK's tracer and ours produce the same spans."""

    def __init__(self) -> None:
        self.n = 0

    def generate_span_id(self) -> int:
        self.n += 1
        return self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return 0xABC000 + self.n

    def is_trace_id_random(self) -> bool:
        return False


def script(tracer) -> None:
    """What the span builder does with a tracer: roots (local or remote parent), links, events, status."""
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    remote = SpanContext(0xFEED, 0xBEEF, True, TraceFlags(1), TraceState([("v", "1")]))
    root = tracer.start_span("chat m", context=trace.set_span_in_context(trace.NonRecordingSpan(remote)),
                             kind=SpanKind.SERVER, start_time=100,
                             attributes={"gen_ai.response.finish_reasons": ("abort",), "llm.slo.met": False,
                                         "llm.latency.e2e": 1.5, "gen_ai.usage.output_tokens": 7})
    child = tracer.start_span("llm.queue", context=trace.set_span_in_context(root), start_time=100)
    child.add_event("llm.engine.queued", timestamp=105)
    child.add_event("with.attrs", {"k": "v", "n": 2}, timestamp=106)
    child.end(end_time=110)
    root.set_status(Status(StatusCode.ERROR, "aborted: finish reason abort"))
    root.end(end_time=200)
    links = [Link(SpanContext(0xAB + i, 0xCD + i, i % 2 == 1, TraceFlags(1))) for i in range(5)]
    step = tracer.start_span(sc.SPAN_ENGINE_STEP, context=trace.set_span_in_context(trace.INVALID_SPAN),
                             start_time=10, attributes={sc.ENGINE_STEP_ID: 42, sc.STEP_KV_CACHE_USAGE: 0.5},
                             links=links)
    step.end(end_time=20)


def _samplers():
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased

    # the default (children of our spans: the sampler's known answer, without calling it), and others
    # that must be asked: one that drops every child of a local sampled parent, one that is not ParentBased
    return {"default": None, "local-children-off": ParentBased(ALWAYS_ON, local_parent_sampled=ALWAYS_OFF),
            "ratio": TraceIdRatioBased(1.0)}


@pytest.mark.parametrize("sampler", sorted(_samplers()))
@pytest.mark.parametrize("max_links", [None, 3])
def test_wire_tracer_writes_what_the_sdk_writes_for_the_same_spans(max_links, sampler):
    from opentelemetry.sdk.trace import SpanLimits

    from otel_llm.otlp.wire_tracer import WireTracer

    limits = SpanLimits(max_links=max_links) if max_links else None
    chosen = {"sampler": _samplers()[sampler]} if _samplers()[sampler] is not None else {}
    memory = InMemorySpanExporter()
    sdk_tp = TracerProvider(resource=RESOURCE, id_generator=CountingIds(), span_limits=limits, **chosen)
    sdk_tp.add_span_processor(SimpleSpanProcessor(memory))
    script(sdk_tp.get_tracer("otel_llm", "9.9"))
    expected = encode_spans(memory.get_finished_spans())

    sent: list[bytes] = []
    tp = TracerProvider(resource=RESOURCE, id_generator=CountingIds(), span_limits=limits, **chosen)
    sdk_tracer = tp.get_tracer("otel_llm", "9.9")
    direct = DirectExport([lambda data: sent.append(data) or True],
                          wire.RequestFrame.for_tracer(RESOURCE, sdk_tracer._instrumentation_scope))
    tracer = WireTracer(sdk_tracer, direct)
    # the fences: the default sampler is recognized (else every span would ask it, correct but dearer), and a
    # link's cache key is read as one slice of the SpanContext tuple (else its three properties, dearer)
    from otel_llm.otlp import wire_tracer

    assert tracer._local_children == (sampler == "default")
    assert wire_tracer._SLICE_KEY
    script(tracer)
    assert direct.flush(5)
    assert ExportTraceServiceRequest.FromString(b"".join(sent)) == expected
    assert b"".join(sent) == expected.SerializeToString()  # byte for byte, too
    direct.close()


def test_engine_steps_go_direct_linked_to_the_kept_requests_and_honour_the_sampler():
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    from otel_llm.core.timeline import RequestShare, StepRecord

    class NoEngineSteps(Sampler):  # a user's own sampler: it sees each step's links, and says no
        seen_links: list[int] = []

        def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
                          trace_state=None):
            if name == sc.SPAN_ENGINE_STEP:
                self.seen_links.append(len(links or ()))
                return SamplingResult(Decision.DROP)
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

        def get_description(self) -> str:
            return "NoEngineSteps"

    for sampler, expect_steps in ((None, True), (NoEngineSteps(), False)):
        with OTLPSink() as sink:
            tp = TracerProvider(resource=RESOURCE, **({"sampler": sampler} if sampler else {}))
            tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint=f"{sink.endpoint}/v1/traces")))
            tel = telemetry_for(tp)
            base = time.monotonic()
            tel.start(RequestTimeline("a", time.time(), model="m"))
            b = RequestTimeline("b", time.time(), model="m")
            b.events.append((SCHEDULED, base - 0.02))
            b.token_ts += [base - 0.01, base + 0.01]  # its second token came out of step 7
            tel.start(b)
            tel.add_step(StepRecord(7, base, base + 0.01, [RequestShare("a", 16, True), RequestShare("b", 1, False)]))
            for rid in ("a", "b"):
                tel.finish(rid, RequestSummary(model="m", ttft=0.01, e2e=0.02, output_tokens=2))
            assert tel.flush(10) and tp.force_flush()
            spans = sink.spans()
            tel.close()
            tp.shutdown()
            steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
            if not expect_steps:  # the provider's sampler said no to the step, which saw both links
                assert steps == [] and len(spans) > 2 and NoEngineSteps.seen_links == [2]
                continue
            (step,) = steps
            roots = {s.span_id: s for s in spans if not s.parent_span_id and s.name != sc.SPAN_ENGINE_STEP}
            assert len(roots) == 2 and sorted(step.links) == sorted((r.trace_id, r.span_id) for r in roots.values())
            assert step.attributes[sc.STEP_NUM_PREFILL_TOKENS] == 16 and step.attributes[sc.STEP_BATCH_SIZE] == 2
            assert step.trace_id not in {r.trace_id for r in roots.values()} and not step.parent_span_id
            # a's chunk and b's decode step, which a's prefill stalled, name the step and carry its facts
            (chunk,) = [s for s in spans if s.name == sc.SPAN_PREFILL_CHUNK]
            (decode_step,) = [s for s in spans if s.name == sc.SPAN_DECODE_STEP]
            assert chunk.attributes[sc.ENGINE_STEP_ID] == decode_step.attributes[sc.ENGINE_STEP_ID] == 7
            assert chunk.attributes[sc.STEP_OTHER_PREFILL_TOKENS] == 0  # its own chunk is not someone else's
            assert decode_step.attributes[sc.STEP_OTHER_PREFILL_TOKENS] == 16
            assert decode_step.attributes[sc.STEP_BATCH_SIZE] == 2
            assert decode_step.attributes[sc.STEP_DURATION] == pytest.approx(0.01)
            # engine steps under their own service (and Phoenix project); the requests under the provider's
            assert step.service == step.resource[sc.OPENINFERENCE_PROJECT_NAME] == "wire-test-engine-steps"
            assert {s.service for s in spans if s.name != sc.SPAN_ENGINE_STEP} == {"wire-test"}


def test_a_dead_collector_costs_only_dropped_spans_counted_in_stats_and_metrics():
    import socket

    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from support.metrics import points_by_name

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tp = TracerProvider(resource=RESOURCE)
    tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1)))
    reader = InMemoryMetricReader()
    config = Config.resolve({"sample_rate": 1.0, "baseline_detail": "steps"}, environ={})
    tel = Pipeline(config, tp.get_tracer("otel_llm"), MeterProvider(metric_readers=[reader]).get_meter("t"), "test",
                   router=Router)
    finish_request(tel, "r1", tokens=10)
    assert tel.flush(30)
    stats = tel.stats()
    assert stats["requests_finished"] == stats["requests_kept"] == 1
    spans = 4 + expected_rows(10)  # request, 3 phases, decode rows
    assert stats["direct_spans_dropped"] == spans and stats["direct_spans_sent"] == 0
    points = points_by_name(reader.get_metrics_data())
    assert [p.value for p in points["otel_llm.spans.dropped_direct"]] == [spans]
    kept = [p.value for p in points["otel_llm.requests"] if p.attributes["otel_llm.state"] == "kept"]
    assert kept == [1]
    tel.close()
    tp.shutdown()


def test_spans_of_requests_finished_just_before_exit_are_sent():
    """By the instrumentor's exit hook (its Lifecycle): the pipeline itself registers none."""
    import subprocess
    import sys
    import textwrap

    with OTLPSink() as sink:
        code = textwrap.dedent(f"""
            import sys
            sys.path[:0] = [{str(__import__("pathlib").Path(__file__).parent)!r}, {str(__import__("pathlib").Path(__file__).parents[1])!r}]
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.metrics import MeterProvider
            from otel_llm.instrumentation import gate
            from otel_llm.instrumentation.vllm import VLLMInstrumentor
            from test_otlp_wire import RESOURCE, finish_request
            gate.get_dependency_conflicts = lambda dependencies: None  # instrument where vLLM is absent too
            tp = TracerProvider(resource=RESOURCE)
            tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint="{sink.endpoint}/v1/traces")))
            # (no engine here, nor vLLM where the oldest SDK is tested: the instrumentor's own exit hook alone)
            VLLMInstrumentor().instrument(tracer_provider=tp, meter_provider=MeterProvider(), sample_rate=1.0,
                                          baseline_detail="steps", engine_steps=False, skip_dep_check=True)
            finish_request(VLLMInstrumentor().telemetry, "r1", tokens=30)
            # no flush, no close: the interpreter exits with the request still queued
        """)
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        spans = sink.spans()
        check_trace(spans, 30)


def test_a_sampler_that_drops_the_decode_span_drops_its_steps_too():
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class NoDecode(Sampler):
        def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
                          trace_state=None):
            return SamplingResult(Decision.DROP if name == sc.SPAN_DECODE else Decision.RECORD_AND_SAMPLE,
                                  attributes)

        def get_description(self) -> str:
            return "NoDecode"

    with OTLPSink() as sink:
        tp = TracerProvider(resource=RESOURCE, sampler=NoDecode())
        tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint=f"{sink.endpoint}/v1/traces")))
        tel = telemetry_for(tp)
        finish_request(tel, "r1", tokens=10)
        assert tel.flush(10) and tp.force_flush()
        names = [s.name for s in sink.spans()]
        tel.close()
        tp.shutdown()
    assert sc.SPAN_QUEUE in names and sc.SPAN_DECODE not in names and sc.SPAN_DECODE_STEP not in names


def test_attributes_inline_path_writes_the_generic_encoders_bytes():
    """``attributes`` writes str/int/float inline and caches encoded names: the same bytes as ``key_value``
    for every value type (bool and IntEnum are int subclasses and take the generic path), and the same error."""
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    values = [0, 1, 127, 128, -1, -2 ** 63, 2 ** 64 - 1, 0.0, -0.5, 1e300, float("inf"), True, False, "", "x" * 200,
              "é漢", (1, 2), ["a", "b"], (True, 1.5), Level.HIGH, (),
              # arrays, written inline item by item: small and large ints, negative, str, float, mixed, nested
              tuple(range(130)), (0, 127, 128, -1, 2 ** 63 - 1), ("length",), ("é漢", "", "x" * 130),
              [0.25, -0.0, float("inf")], [1, "a", 2.5, False, Level.HIGH], ((1, 2), ["a"]), (1 << 70,)]
    for i, value in enumerate(values):
        attrs = {"gen_ai.request.model": "m", f"k{i}": value, "ключ" * 40: value}
        for _ in range(2):  # names encoded, then from the cache
            assert wire.attributes(attrs) == b"".join(
                wire.field(b"\x4a", wire.key_value(k, v)) for k, v in attrs.items())
    nan = wire.attributes({"v": float("nan")})
    assert nan == wire.field(b"\x4a", wire.key_value("v", float("nan")))
    for bad in (None, object(), [None], (1, None), ["a", object()]):
        with pytest.raises(TypeError, match="attribute 'k'"):
            wire.attributes({"k": bad})


def _full_detail_request(multi: bool):
    """A kept request with everything full detail writes: two prefill chunks (one step shared with another
    request's prompt), a preemption, decode steps whose engine steps carry facts (others' prefill, anatomy),
    stalls kept as rows and windows between them; ``multi``: speculative steps of several tokens."""
    from otel_llm.core.spec_decode import SpecStep
    from otel_llm.core.timeline import PREEMPTED, PrefillChunk, RequestShare, StepRecord

    base = 1000.0
    t = RequestTimeline("r", 1_700_000_000.0, model="m", response_id="r", input_tokens=48)
    t.events += [(QUEUED, base), (SCHEDULED, base + 0.01)]
    t.chunks = [PrefillChunk(1, base + 0.01, base + 0.02, 32), PrefillChunk(2, base + 0.02, base + 0.03, 16)]
    steps = [StepRecord(1, base + 0.01, base + 0.02, [RequestShare("r", 32, True), RequestShare("o", 20, True)]),
             StepRecord(2, base + 0.02, base + 0.03, [RequestShare("r", 16, True)])]
    ts = base + 0.03
    for i in range(1, 60):
        gap = 0.05 if i % 10 == 5 else 0.01 + (i % 3) * 1e-4
        shares = [RequestShare("r", 2 if multi and i % 4 == 0 else 1, False)]
        if i == 7:  # another request's prompt in this step: a decode stall with a cause
            shares.append(RequestShare("p", 24, True))
        step = StepRecord(10 + i, ts, ts + gap, shares, running=3, waiting=1, preempted=int(i == 21))
        step.model_s, step.execute_s, step.idle_s = gap * 0.8, gap * 0.9, 1e-5 * i
        if multi and i % 2 == 0:  # verified drafts: the rows' drafted counts (one accepted where it made 2)
            step.spec = SpecStep([0], [2], [shares[0].tokens - 1])
        steps.append(step)
        ts += gap
        t.add_tokens(ts, shares[0].tokens)
    t.events += [(PREEMPTED, base + 0.3), (SCHEDULED, base + 0.35)]
    t.token_ts.insert(0, base + 0.03)
    if t.multi_token_steps:  # the first token was inserted in front: shift the multi-token indices
        t.multi_token_steps = {i + 1: n for i, n in t.multi_token_steps.items()}
    if multi:
        t.spec = [sum(1 for st in steps if st.spec), sum(st.spec.draft_tokens for st in steps if st.spec),
                  sum(sum(st.spec.accepted) for st in steps if st.spec)]
    e2e = ts - base
    s = RequestSummary(model="m", ttft=0.03, e2e=e2e, queue=0.01, prefill=0.02, decode=e2e - 0.03, tpot=0.012,
                       input_tokens=48, output_tokens=len(t.token_ts))
    return t, s, steps


@pytest.mark.parametrize("multi", [False, True])
def test_a_full_detail_requests_bytes_equal_the_attribute_dict_paths(monkeypatch, multi):
    """Decode rows (steps and windows) are written as attribute bytes without building a dict, and the
    request's other spans through WireSpan's encoder: the bytes sent must be exactly what the attribute-dict
    path (``attributes`` of the same dicts, checked above against the generic encoder) sends."""
    import random

    from otel_llm.core.clock import WallClock
    from otel_llm.core.config import Detail
    from otel_llm.core.spans import SpanBuilder
    from otel_llm.otlp import routes

    class DictRows(routes._WireRows):
        """The wire route's rows, each from the attribute dict the other routes build, encoded generically."""

        def _row(self, name: str, start: int, end: int, attrs: dict) -> None:
            sid = next(self._ids, None) or wire.span_ids(1)[0]  # the wire rows' draw, so the ids match
            self._parts.append(wire.SiblingSpans(self._parent, name).encode(sid, start, end, wire.attributes(attrs)))

        def step(self, start, end, index, tokens, step, own_prefill_tokens, drafted=None):
            attrs = {sc.STEP_INDEX: index, sc.STEP_TOKENS: tokens}
            if drafted is not None:
                attrs[sc.STEP_DRAFTED] = drafted
            if step is not None:
                attrs.update(self._facts.get(step, own_prefill_tokens))
            self._row(sc.SPAN_DECODE_STEP, start, end, attrs)

        def window(self, start, end, tokens, first, last, gap_mean, gap_max, drafted=None):
            attrs = {sc.WINDOW_TOKENS: tokens, sc.WINDOW_FIRST_INDEX: first, sc.WINDOW_LAST_INDEX: last,
                     sc.WINDOW_GAP_MEAN: gap_mean, sc.WINDOW_GAP_MAX: gap_max}
            if drafted is not None:
                attrs[sc.WINDOW_DRAFTED] = drafted
            self._row(sc.SPAN_DECODE_WINDOW, start, end, attrs)

    sent: list[tuple[bytes, int]] = []
    monkeypatch.setattr(DirectExport, "add", lambda self, spans, count, frame=None: sent.append((spans, count)) or True)
    tp = TracerProvider(resource=RESOURCE)
    tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint="http://127.0.0.1:9/v1/traces")))
    t, s, steps = _full_detail_request(multi)
    clock = WallClock()
    out = {}
    wire_rows = routes._WireRows
    for encoded in (True, False):
        monkeypatch.setattr(routes, "_WireRows", wire_rows if encoded else DictRows)
        builder = SpanBuilder(tp.get_tracer("otel_llm", "9.9"), router=routes.Router)
        assert builder.wire_export() is not None
        sent.clear()
        random.seed(7)  # the same span and trace ids on both paths
        kept = builder.request(t, s, {"gen_ai.request.model": "m", "llm.slo.met": True, "n": (1, 2)}, Detail.STEPS,
                               clock, steps, tpot_slo=0.02)
        assert kept is not None and kept.linked_steps
        out[encoded] = list(sent)
    assert out[True] == out[False]
    names = [sp.name for sp in decode(wire.RequestFrame.for_tracer(RESOURCE, SCOPE).request(
        [b for b, _ in out[True]]))]
    # everything was there to compare: chunks, a preemption's spans, decode-step rows and windows
    for name in (sc.SPAN_PREFILL_CHUNK, sc.SPAN_REQUEUE, sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW):
        assert name in names, name
    if multi:  # and the draft counts, on both kinds of row
        blob = b"".join(b for b, _ in out[True])
        assert sc.STEP_DRAFTED.encode() in blob and sc.WINDOW_DRAFTED.encode() in blob
    tp.shutdown()


def test_wire_rows_beyond_the_count_drawn_still_get_their_own_span_ids():
    """The route draws ``count`` span ids up front; a row past them draws one of its own (valid, distinct),
    and every row is sent."""
    from otel_llm.core.step_facts import FactsCache
    from otel_llm.otlp import routes

    class Sent:
        def add(self, spans: bytes, count: int) -> bool:
            self.spans, self.count = spans, count
            return True

    parent = SpanContext(0x0123456789ABCDEF0123456789ABCDEF, 0xFEDCBA9876543210, False, TraceFlags(1))
    direct = Sent()
    rows = routes._WireRows(direct, parent, 1, FactsCache(), routes.EncodedFacts())
    rows.step(10, 20, 1, 1, None, 0)
    rows.window(20, 30, 3, 2, 4, 0.01, 0.02)
    rows.step(30, 40, 5, 2, None, 0)
    rows.close()
    assert direct.count == 3
    spans = decode(wire.RequestFrame.for_tracer(RESOURCE, SCOPE).request([direct.spans]))
    assert [sp.name for sp in spans] == [sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW, sc.SPAN_DECODE_STEP]
    ids = [sp.span_id for sp in spans]
    assert len(set(ids)) == 3 and all(len(sid) == 16 and sid != "0" * 16 for sid in ids)
    assert [sp.attributes.get(sc.STEP_INDEX, sp.attributes.get(sc.WINDOW_FIRST_INDEX)) for sp in spans] == [1, 2, 5]
