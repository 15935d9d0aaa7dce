"""Issue 15, first acceptance: for every recorded exchange and every way of calling, the caller's result or
exception is identical with and without instrumentation, and so are the request headers (in wire order)
and the body the server receives, apart from the W3C trace headers we add. A caller's own
``traceparent`` is theirs: not duplicated, not overwritten, and our ``tracestate`` stays out with it."""

from __future__ import annotations

import types
from typing import Any, Iterator

import httpx
import httpx2
import pytest
from openai import Omit

from replay_calls import HELPERS, VARIANTS, call, helper_applies, helper_call
from replay_server import Received, ReplayServer, all_names, load

TRACE = ("traceparent", "tracestate")


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as s:
        yield s


def without_trace(r: Received) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in r.headers if k.lower() not in TRACE)


def trace_headers(r: Received) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in r.headers if k.lower() in TRACE]


def traceparent_of(span: Any) -> str:
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def both_ways(client: Any, replay: ReplayServer, mode: str, name: str, variant: str = "plain",
              helper: str | None = None, **overrides: Any) -> tuple[Any, Received, Any, Received]:
    """The same call without, then with, instrumentation: (outcome, request received) for each.
    ``helper``: through openai's ``.parse()`` / ``with_raw_response.parse()`` / ``.stream()`` instead."""
    rec = load(name)

    def once() -> Any:
        if helper is not None:
            return helper_call(mode, replay.base_url(name), rec, helper, **overrides)
        return call(mode, replay.base_url(name), rec, variant, **overrides)

    client.instrumentor.uninstrument()
    try:
        replay.take()
        plain = once()
        (plain_req,) = replay.take()
    finally:
        client.reinstrument()
    client.spans.clear()
    ours = once()
    (our_req,) = replay.take()
    return plain, plain_req, ours, our_req


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", all_names())
def test_every_recording_same_result_same_request(client: Any, replay: ReplayServer, name: str, mode: str,
                                                  variant: str) -> None:
    plain, plain_req, ours, our_req = both_ways(client, replay, mode, name, variant)
    assert ours == plain
    assert (our_req.method, our_req.path, our_req.body) == (plain_req.method, plain_req.path, plain_req.body)
    assert without_trace(our_req) == without_trace(plain_req)
    assert trace_headers(plain_req) == []
    spans = client.finished()
    assert len(spans) == 1, [s.name for s in spans]
    assert trace_headers(our_req) == [("traceparent", traceparent_of(spans[0]))]


# openai raises before sending for a ``.parse()`` whose tools are not ``strict``: nothing reaches the server
HELPER_CASES = [(n, h) for n in all_names() for h in HELPERS if helper_applies(load(n), h)
                and not (h != "stream" and "tools" in load(n).request)]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name,helper", HELPER_CASES)
def test_helpers_same_result_same_request(client: Any, replay: ReplayServer, name: str, helper: str,
                                          mode: str) -> None:
    """``.parse()`` and ``with_raw_response.parse()`` (wrapped themselves: they post directly) and ``.stream()``
    (timed through ``create``): the same outcome, body and headers, one span, its ``traceparent`` sent."""
    plain, plain_req, ours, our_req = both_ways(client, replay, mode, name, helper=helper)
    assert ours == plain
    assert (our_req.method, our_req.path, our_req.body) == (plain_req.method, plain_req.path, plain_req.body)
    assert without_trace(our_req) == without_trace(plain_req)
    spans = client.finished()
    assert len(spans) == 1, [s.name for s in spans]
    assert trace_headers(our_req) == [("traceparent", traceparent_of(spans[0]))]


HEADER_MAPPINGS = {
    "dict": lambda h: dict(h),
    "httpx.Headers": lambda h: httpx.Headers(h),
    "httpx2.Headers": lambda h: httpx2.Headers(h),
    "MappingProxyType": lambda h: types.MappingProxyType(dict(h)),
}


@pytest.mark.parametrize("kind", list(HEADER_MAPPINGS))
@pytest.mark.parametrize("name", ["chat_text", "chat_text_stream", "responses_text_stream", "embeddings"])
def test_caller_headers_of_any_mapping_type_are_kept(client: Any, replay: ReplayServer, kind: str, name: str) -> None:
    given = HEADER_MAPPINGS[kind]({"Idempotency-Key": "abc-123", "X-Caller": "kept", "Authorization": "Bearer sk-own"})
    before = dict(given.items())
    plain, plain_req, ours, our_req = both_ways(client, replay, "sync", name, extra_headers=given)
    assert ours == plain
    assert without_trace(our_req) == without_trace(plain_req)
    sent = {k.lower(): v for k, v in our_req.headers}
    assert (sent["idempotency-key"], sent["x-caller"], sent["authorization"]) == ("abc-123", "kept", "Bearer sk-own")
    assert [k for k, _ in trace_headers(our_req)] == ["traceparent"]
    assert dict(given.items()) == before  # the caller's object is not mutated


def test_omit_removes_a_default_header_with_or_without_us(client: Any, replay: ReplayServer) -> None:
    plain, plain_req, ours, our_req = both_ways(client, replay, "sync", "chat_text",
                                                extra_headers={"X-Stainless-Lang": Omit(), "X-A": "1"})
    assert "x-stainless-lang" in {k.lower() for k, _ in replay_default_headers(replay)}
    assert "x-stainless-lang" not in {k.lower() for k, _ in our_req.headers}
    assert without_trace(our_req) == without_trace(plain_req)


def replay_default_headers(replay: ReplayServer) -> tuple[tuple[str, str], ...]:
    import openai

    openai.OpenAI(base_url=replay.base_url("chat_text"), api_key="sk-test").chat.completions.create(
        **load("chat_text").request)
    (req,) = replay.take()
    return req.headers


@pytest.mark.parametrize("spelling", ["traceparent", "Traceparent", "TRACEPARENT"])
@pytest.mark.parametrize("kind", list(HEADER_MAPPINGS))
def test_callers_own_traceparent_is_respected(client: Any, replay: ReplayServer, spelling: str, kind: str) -> None:
    theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    given = HEADER_MAPPINGS[kind]({spelling: theirs, "tracestate": "vendor=theirs"})
    plain, plain_req, ours, our_req = both_ways(client, replay, "sync", "chat_text_stream", extra_headers=given)
    assert ours == plain
    assert our_req.headers == plain_req.headers  # nothing added, nothing changed
    assert [v for k, v in our_req.headers if k.lower() == "traceparent"] == [theirs]
    assert len(client.finished()) == 1  # the call is still measured


def test_callers_traceparent_alone_keeps_our_tracestate_out(client: Any, replay: ReplayServer) -> None:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context
    from opentelemetry.trace.span import TraceState
    from opentelemetry import context as otel_context

    parent = NonRecordingSpan(SpanContext(0x1234, 0x5678, True, TraceFlags(1), TraceState([("ours", "1")])))
    token = otel_context.attach(set_span_in_context(parent))
    try:
        _, _, _, with_state = both_ways(client, replay, "sync", "chat_text")
        assert [k for k, _ in trace_headers(with_state)] == ["traceparent", "tracestate"]  # ours: the pair
        theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        _, plain_req, _, our_req = both_ways(client, replay, "sync", "chat_text", extra_headers={"traceparent": theirs})
    finally:
        otel_context.detach(token)
    assert trace_headers(our_req) == [("traceparent", theirs)]
    assert our_req.headers == plain_req.headers


def test_traceparent_in_client_default_headers_is_respected(client: Any, replay: ReplayServer) -> None:
    import openai

    theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    c = openai.OpenAI(base_url=replay.base_url("chat_text"), api_key="sk-test", max_retries=0,
                      default_headers={"traceparent": theirs})
    replay.take()
    c.chat.completions.create(**load("chat_text").request)
    (req,) = replay.take()
    assert trace_headers(req) == [("traceparent", theirs)]


def test_one_shot_iterables_in_the_request_are_not_consumed(client: Any, replay: ReplayServer) -> None:
    """Content capture must not read a generator the client is about to send (the body would lose it)."""
    client.reinstrument(capture_content="true")
    try:
        rec = load("chat_text")
        messages = rec.request["messages"]
        replay.take()
        call("sync", replay.base_url("chat_text"), rec, messages=(m for m in messages))
        (req,) = replay.take()
        client.instrumentor.uninstrument()
        call("sync", replay.base_url("chat_text"), rec, messages=(m for m in messages))
        (plain,) = replay.take()
    finally:
        client.reinstrument()
    assert req.body == plain.body and b"weather" in req.body
