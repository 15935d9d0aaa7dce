"""Spans are buffered as encoded bytes and framed back into an export request at the byte level."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector_testkit import export_request, request_attrs, span
from otel_llm_collector.spans import ENCODED, ERROR, GROUP, REQUEST, ROOT, encode_request, extract


def test_encode_request_round_trips_spans_resources_scopes_and_schema_urls() -> None:
    a = export_request(span(1, 1, attrs=request_attrs()), span(1, 2, parent=1, attrs={"x": "y" * 300}), service="a")
    a.resource_spans[0].schema_url = "https://opentelemetry.io/schemas/1.26.0"
    a.resource_spans[0].scope_spans[0].schema_url = "scope-schema"
    a.resource_spans[0].scope_spans[0].scope.version = "1.2"
    b = export_request(span(2, 1, error=True), service="b")
    c = export_request(span(3, 1), service="a")  # same resource and scope as `a`, another request: merged
    c.resource_spans[0].schema_url = "https://opentelemetry.io/schemas/1.26.0"
    c.resource_spans[0].scope_spans[0].schema_url = "scope-schema"
    c.resource_spans[0].scope_spans[0].scope.version = "1.2"
    items = [(rec[GROUP], rec[ENCODED]) for req in (a, b, c) for rec in extract(req).spans]
    out = ExportTraceServiceRequest.FromString(encode_request(items))
    assert len(out.resource_spans) == 2
    ra, rb = out.resource_spans
    assert ra.resource == a.resource_spans[0].resource and ra.schema_url == a.resource_spans[0].schema_url
    assert len(ra.scope_spans) == 1 and ra.scope_spans[0].scope == a.resource_spans[0].scope_spans[0].scope
    assert ra.scope_spans[0].schema_url == "scope-schema"
    assert list(ra.scope_spans[0].spans) == list(a.resource_spans[0].scope_spans[0].spans) + \
        list(c.resource_spans[0].scope_spans[0].spans)
    assert rb.resource == b.resource_spans[0].resource and list(rb.scope_spans[0].spans) == \
        list(b.resource_spans[0].scope_spans[0].spans)
    assert encode_request([]) == b""


def test_extract_marks_request_spans_and_rejects_bad_trace_ids() -> None:
    req = export_request(span(1, 1, attrs=request_attrs(model="llama")), span(1, 2, parent=1, error=True))
    bad = req.resource_spans[0].scope_spans[0].spans.add()
    bad.trace_id = b"\0" * 16
    got = extract(req)
    assert got.rejected == 1 and len(got.spans) == 2 and len(got.requests) == 1
    (first, second) = got.spans
    assert first[REQUEST] and first[ROOT] and not first[ERROR]  # request, root, no error
    assert not second[REQUEST] and not second[ROOT] and second[ERROR]
    r = got.requests[0]
    assert r.summary.model == "llama" and r.source == "otel_llm" and r.service == "svc"


def test_wire_view_reads_every_kind_of_value_as_the_full_classes_do() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

    from otel_llm.otlp.view import any_value, value_of

    values = [AnyValue(string_value="llama"), AnyValue(string_value=""), AnyValue(string_value="ü" * 200),
              AnyValue(bool_value=True), AnyValue(bool_value=False), AnyValue(int_value=0), AnyValue(int_value=-7),
              AnyValue(int_value=2**62), AnyValue(double_value=0.25), AnyValue(double_value=0.0),
              AnyValue(double_value=float("-inf")), AnyValue(bytes_value=b"\0\1"), AnyValue(),
              AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="stop"), AnyValue(int_value=1)])),
              AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(int_value=1))]))]
    for v in values * 2:  # twice: the second read comes from the cache
        assert repr(value_of(v.SerializeToString())) == repr(any_value(v)), v


def test_extract_keeps_each_span_as_received_and_the_last_of_repeated_keys() -> None:
    from collector_testkit import any_value as av
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    from otel_llm import semconv as sc

    s = span(1, 1, attrs=request_attrs(model="first"))
    s.attributes.append(KeyValue(key=sc.REQUEST_MODEL, value=av("last")))  # a repeated key: the last wins
    req = export_request(s, span(1, 2, parent=1, attrs={"step": 3}))
    raw = req.SerializeToString()
    got = extract(req, raw)
    sent = req.resource_spans[0].scope_spans[0].spans
    assert [rec[ENCODED] for rec in got.spans] == [x.SerializeToString() for x in sent]
    assert got.requests[0].summary.model == "last" and extract(req).spans == got.spans
    # a CLIENT span with request latencies is a request span (its time to first chunk is not a client call)
    c = span(2, 1, attrs={sc.RESPONSE_TIME_TO_FIRST_CHUNK: 0.2, **request_attrs()})
    c.kind = 3
    both = extract(export_request(c))
    assert len(both.requests) == 1 and both.clients is None


def test_receive_path_facts_equal_the_cores_derivation_over_full_class_attributes() -> None:
    """``extract`` decodes only what ``fast.summary``'s reader reads: same summary, source and reason
    as ``request_facts`` over the full classes' attribute dict, for ours, native, odd-typed and plain spans."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    from otel_llm import semconv as sc
    from otel_llm_collector.spans import attributes, request_facts

    cases = [request_attrs(), request_attrs(model="", e2e=2, ttft=True, **{sc.SAMPLING_REASON: "slo:ttft"}),
             {sc.LATENCY_TTFT: 0.3, sc.USAGE_OUTPUT_TOKENS: 7.9, sc.ERROR_TYPE: "timeout", "other": [1, 2]},
             {sc.VLLM_TTFT: 0.1, sc.VLLM_E2E: 1.1, sc.VLLM_DECODE: 0.9, sc.VLLM_COMPLETION_TOKENS: 10,
              sc.RESPONSE_FINISH_REASONS: ["stop"], sc.SAMPLING_REASON: 3},
             {sc.VLLM_E2E: 1.0}, {"http.method": "GET"}, {}]
    spans = [span(i + 1, 1, attrs=a) for i, a in enumerate(cases)]
    for code, message in ((Status.STATUS_CODE_OK, "fine"), (Status.STATUS_CODE_UNSET, "x"),
                          (Status.STATUS_CODE_ERROR, ""), (Status.STATUS_CODE_ERROR, "boom")):
        s = span(len(spans) + 1, 1)
        s.status.code, s.status.message = code, message
        spans.append(s)
    req = export_request(*spans)
    got = extract(req, req.SerializeToString())
    by_trace = {f.trace_id: f for f in got.requests}
    for s, rec in zip(spans, got.spans):
        want = request_facts(s.trace_id, "svc", attributes(s.attributes))
        assert by_trace.get(s.trace_id) == want and (rec[REQUEST] == want), s
        assert rec[ERROR] == (s.status.code == Status.STATUS_CODE_ERROR), s
    assert len(got.requests) == 5


def test_a_non_finite_token_count_is_no_count_and_does_not_fail_the_request() -> None:
    """An int field sent as a NaN or infinite double reads as absent; it raised, refusing the whole export request."""
    from otel_llm import semconv as sc

    odd = {sc.USAGE_OUTPUT_TOKENS: float("nan"), sc.USAGE_INPUT_TOKENS: float("inf"),
           sc.NUM_PREEMPTIONS: float("-inf")}
    got = extract(export_request(span(1, 1, attrs=request_attrs(**odd)), span(2, 1)))
    assert len(got.spans) == 2 and len(got.requests) == 1
    s = got.requests[0].summary
    assert s.output_tokens is None and s.input_tokens is None and s.e2e == 1.0


def test_typed_decoders_equal_converting_the_decoded_value() -> None:
    """The receive path's typed decoders (fast paths on the raw bytes) against ``CONVERTERS[kind](value_of(...))``:
    one- and two-byte varints and their edges, longer and negative (10-byte) ints, a non-minimal varint, a repeated
    field (the last wins), doubles, other types."""
    import math

    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    from otel_llm.core.summary import CONVERTERS
    from otel_llm.otlp.view import value_of
    from otel_llm_collector.spans import TYPED

    ints = [0, 1, 127, 128, 129, 255, 256, 300, 16383, 16384, 2**31, 2**63 - 1, -1, -128, -2**63]
    encodings = [AnyValue(int_value=v).SerializeToString() for v in ints]
    encodings += [AnyValue(double_value=v).SerializeToString() for v in (0.0, -0.5, 2.5, 1e300, math.inf)]
    encodings += [AnyValue(bool_value=True).SerializeToString(), AnyValue(string_value="m").SerializeToString(),
                  AnyValue().SerializeToString(), b"\x18\x85\x80\x00",  # 5, non-minimal
                  AnyValue(int_value=3).SerializeToString() + AnyValue(int_value=200).SerializeToString(),
                  AnyValue(double_value=1.5).SerializeToString() + AnyValue(int_value=2).SerializeToString()]
    for raw in encodings:
        AnyValue.FromString(raw)  # each is valid
        for kind, decode in TYPED.items():
            want, got = CONVERTERS[kind](value_of(raw)), decode(raw)
            assert type(got) is type(want) and got == want, (kind, raw, want, got)
