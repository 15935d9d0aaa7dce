"""What the receive path must refuse beyond plain garbage (tests/collector/test_bad_input.py): requests that the
reading view alone would accept (it leaves attribute values, names, events and status messages encoded). The
two-pass path refuses them because the full OTLP classes parse every request first; the one-pass path
(``fast/_wire.c``, what the receivers use when it is built) refuses them itself, with the reason. Both receivers
are checked end to end with the path the gateway uses (tests/collector/test_wire_onepass.py: that it is the
one-pass path, and its verdicts against upb's on thousands of inputs)."""

from __future__ import annotations

import http.client

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector_testkit import export_request, loopback_config, request_attrs, span
from otel_llm.otlp import messages
from otel_llm_collector.gateway import Gateway
from otel_llm_collector import spans
from otel_llm_collector.spans import ONE_PASS, Received, extract, read_request

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _patched(build, old: bytes, new: bytes) -> bytes:
    """A valid request's encoding with one marked run of bytes replaced by another of the same length (so
    every enclosing length stays right and only the marked part is wrong)."""
    raw = build().SerializeToString()
    assert len(old) == len(new) and raw.count(old) == 1
    return raw.replace(old, new)


def _with_value(value: AnyValue) -> Span:
    s = span(1, 1, attrs=request_attrs())
    s.attributes.append(KeyValue(key="odd", value=value))
    return s


def _twice(s: Span) -> Span:
    s.attributes.append(KeyValue(key="odd", value=AnyValue(bytes_value=b"QZ")))
    s.attributes.append(KeyValue(key="odd", value=AnyValue(string_value="fine")))
    return s


def _field(tag: int, body: bytes) -> bytes:
    """One length-delimited field: tag byte, varint length, body."""
    n, size = len(body), b""
    while n >= 0x80:
        size += bytes((n & 0x7F | 0x80,))
        n >>= 7
    return bytes((tag,)) + size + bytes((n,)) + body


def _nested_too_deep(depth: int = 120) -> bytes:
    """A request whose one span carries an attribute of arrays nested ``depth`` deep, encoded by hand (the
    classes refuse to build it: their own parse of a copy hits the depth limit)."""
    value = AnyValue(int_value=1).SerializeToString()
    for _ in range(depth):
        value = _field(0x2A, _field(0x0A, value))  # AnyValue.array_value { ArrayValue.values }
    encoded = span(1, 1, attrs=request_attrs()).SerializeToString() + _field(0x4A, _field(0x0A, b"odd")
                                                                              + _field(0x12, value))
    return _field(0x0A, _field(0x12, _field(0x12, encoded)))  # request { resource_spans { scope_spans { spans } } }


def _with_event(s: Span, name: str) -> Span:
    s.events.add(time_unix_nano=5, name=name)
    return s


def _with_status(s: Span, message: str) -> Span:
    s.status.code = 2
    s.status.message = message
    return s


CASES = {
    # bytes_value (field 7) turned into string_value (field 1): the string is not UTF-8
    "attribute string not UTF-8": _patched(lambda: export_request(_with_value(AnyValue(bytes_value=b"\xff\xfeMK"))),
                                           b"\x3a\x04\xff\xfeMK", b"\x0a\x04\xff\xfeMK"),
    # a string inside the value claims 5 bytes where 2 follow (the value's own length is right)
    "attribute value truncated inside": _patched(lambda: export_request(_with_value(AnyValue(bytes_value=b"QZ"))),
                                                 b"\x3a\x02QZ", b"\x0a\x05QZ"),
    # a tag with wire type 7 (there is none) inside the value
    "attribute value with an invalid wire type": _patched(
        lambda: export_request(_with_value(AnyValue(bytes_value=b"QZ"))), b"\x3a\x02QZ", b"\x0f\x02QZ"),
    # the same key twice, the first value malformed: the view's map keeps the last value only
    "an earlier value of a repeated key malformed": _patched(
        lambda: export_request(_twice(span(1, 1, attrs=request_attrs()))), b"\x3a\x02QZ", b"\x0a\x05QZ"),
    # arrays nested deeper than the parser's limit (100 levels from the request)
    "attribute value nested too deep": _nested_too_deep(),
    "span name not UTF-8": _patched(lambda: export_request(span(1, 1, name="NAMEMARK", attrs=request_attrs())),
                                    b"NAMEMARK", b"NAME\xff\xfe\xfd\xfc"),
    "event name not UTF-8": _patched(
        lambda: export_request(_with_event(span(1, 1, attrs=request_attrs()), "EVENTMRK")),
        b"EVENTMRK", b"EVEN\xff\xfe\xfd\xfc"),
    "status message not UTF-8": _patched(
        lambda: export_request(_with_status(span(1, 1, attrs=request_attrs()), "STATUSMK")),
        b"STATUSMK", b"STAT\xff\xfe\xfd\xfc"),
}


@pytest.mark.parametrize("label", sorted(CASES))
def test_the_view_alone_would_accept_what_the_full_parse_refuses(label: str) -> None:
    raw = CASES[label]
    assert len(extract(None, raw).spans) == 1  # type: ignore[arg-type]  # the view reads it without complaint
    with pytest.raises(messages.MalformedRequest):
        messages.parse_request(raw)


@pytest.mark.parametrize("label", sorted(CASES))
def test_the_one_pass_reader_refuses_it_with_a_reason(label: str) -> None:
    with pytest.raises(messages.MalformedRequest, match=r"^malformed ExportTraceServiceRequest: .+ at byte \d+$"):
        read_request(CASES[label], one_pass=True)


@pytest.fixture(scope="module")
def gw():
    g = Gateway(loopback_config(), manual_ticks=True).start()
    yield g
    g.shutdown()


@pytest.mark.parametrize("one_pass", [True, False], ids=["one_pass", "two_pass"])
@pytest.mark.parametrize("label", sorted(CASES))
def test_both_receivers_refuse_it_and_count_it(gw: Gateway, label: str, one_pass: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On the path the gateway uses (one pass, the extension being built) and on the fallback (two passes)."""
    monkeypatch.setattr(spans, "ONE_PASS", one_pass)  # read_request reads it per call
    raw = CASES[label]
    accepted = gw.telemetry.value("receiver_accepted_spans", transport="grpc")
    before = gw.telemetry.value("receiver_bad_requests", transport="grpc", reason="malformed")
    with grpc.insecure_channel(gw.grpc_endpoint) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            call(raw, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in err.value.details()
    assert gw.telemetry.value("receiver_bad_requests", transport="grpc", reason="malformed") == before + 1
    assert gw.telemetry.value("receiver_accepted_spans", transport="grpc") == accepted

    conn = http.client.HTTPConnection("127.0.0.1", gw.http.port, timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=raw, headers={"Content-Type": "application/x-protobuf",
                                                              "Content-Length": str(len(raw))})
        r = conn.getresponse()
        status, body = r.status, r.read()
    finally:
        conn.close()
    assert status == 400 and "malformed" in Status.FromString(body).message


def test_the_receivers_read_in_one_pass(gw: Gateway) -> None:
    """The receivers above ran the gateway's ``read_request``: the one-pass reader (the extension is built)."""
    assert ONE_PASS
    assert gw.grpc is not None and gw.grpc._parse == gw.read_request
    assert gw.http is not None and gw.http.parse == gw.read_request
    assert isinstance(gw.read_request(export_request(span(1, 1)).SerializeToString()), Received)
