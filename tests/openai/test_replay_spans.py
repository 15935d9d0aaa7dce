"""Issue 15 acceptance 2 and 3, against the recorded exchanges: every span ends exactly once with the right
status; streamed calls of every output kind (text, tool-call arguments, refusals, Responses events) have
a time to first chunk and chunk counts that match the recorded stream; no characters-per-second record
from a call without characters; raw-response and embeddings calls measured as plain calls are.

The expected numbers are computed here from the recording itself, by the definition the README states
(a chunk is a chat/completions chunk with choices, or a Responses ``*.delta`` event), independently of
the adapter's readers."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any, Iterator

import openai
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from replay_calls import HELPERS, VARIANTS, call, helper_applies, helper_call
from replay_server import Recording, ReplayServer, all_names, load

STREAMS = [n for n in all_names() if load(n).stream]
BODIES = [n for n in all_names() if not load(n).stream and load(n).status == 200]


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as s:
        yield s


def expected(rec: Recording) -> dict[str, Any]:
    """Chunks, characters and output kinds of a recorded stream, up to where the client stops reading."""
    chunks, chars, kinds = 0, 0, set()
    for p in rec.payloads():
        if "error" in p and "choices" not in p and "type" not in p:
            break  # chat's in-band error: openai raises there
        if rec.api == "responses":
            t = p.get("type", "")
            if t.endswith(".delta"):
                chunks += 1
                chars += len(p.get("delta") or "")
                kinds.add({"response.output_text.delta": "text", "response.refusal.delta": "refusal",
                           "response.function_call_arguments.delta": "tool_call"}.get(t, "other"))
            continue
        if not p.get("choices"):
            continue
        chunks += 1
        for c in p["choices"]:
            d = c.get("delta") or {}
            if d.get("content"):
                chars += len(d["content"])
                kinds.add("text")
            if d.get("refusal"):
                chars += len(d["refusal"])
                kinds.add("refusal")
            for t in d.get("tool_calls") or ():
                fn = t.get("function") or {}
                chars += len(fn.get("name") or "") + len(fn.get("arguments") or "")
                kinds.add("tool_call")
    return {"chunks": chunks, "chars": chars, "kinds": kinds}


def failure_of(rec: Recording) -> str | None:
    if rec.name == "chat_error_mid_stream":
        return "APIError"
    if rec.name == "chat_connection_drop":
        return "APIConnectionError"
    if rec.name == "responses_failed_stream":
        return "APIError"  # its ``error`` event carries an ``error`` object: openai raises on it
    if rec.name == "responses_error_event_stream":
        return "ERR_SOMETHING"  # an ``error`` event without an ``error`` object: yielded, not raised
    if rec.name == "responses_failed_event_stream":
        return "rate_limit_exceeded"  # ``response.failed``: openai yields it, raises nothing; the span says it
    return None


def one_span(client: Any) -> Any:
    gc.collect()
    spans = client.finished()
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def duration_count(client: Any) -> int:
    """Duration records so far: one per call that ended (``finish`` ran once, whatever ended it)."""
    try:
        return sum(p.count for p in client.metric_points("gen_ai.client.operation.duration"))
    except KeyError:
        return 0


def rate_points(client: Any) -> int:
    try:
        return sum(p.count for p in client.metric_points("llm.client.output.characters_per_second"))
    except KeyError:
        return 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", STREAMS)
def test_streams_every_output_kind(client: Any, replay: ReplayServer, name: str, mode: str, variant: str) -> None:
    rec, want = load(name), expected(load(name))
    rates, durations = rate_points(client), duration_count(client)
    outcome = call(mode, replay.base_url(name), rec, variant)
    span = one_span(client)
    a = span.attributes
    assert duration_count(client) == durations + 1  # ended exactly once (the SDK would take a 2nd end quietly)
    failure = failure_of(rec)
    assert span.kind == SpanKind.CLIENT and span.name == f"chat {rec.request['model']}"
    if failure is None:
        assert outcome[0] == "ok" and span.status.status_code == StatusCode.UNSET
        assert a["llm.client.stream.end"] == "complete"
    else:
        assert span.status.status_code == StatusCode.ERROR and a["error.type"] == failure
        assert a["llm.client.slo.met"] is False
    assert a["llm.client.chunks"] == want["chunks"]
    assert a["llm.client.output_characters"] == want["chars"]
    assert set(a.get("llm.client.output.kinds", ())) == want["kinds"]
    if want["chunks"]:
        ttfc = a["gen_ai.response.time_to_first_chunk"]
        assert 0 < ttfc <= a["gen_ai.response.time_to_first_chunk"] <= a["llm.client.duration"]
        if want["chars"]:
            assert ttfc <= a["llm.client.time_to_first_content"] <= a["llm.client.duration"]
    assert rate_points(client) == rates + (1 if want["chars"] else 0)  # never a 0 chars/s record
    if failure is None and rec.api == "chat":
        last = rec.payloads()[-1]
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
            last["usage"]["prompt_tokens"], last["usage"]["completion_tokens"])
        assert a["gen_ai.response.id"] == last["id"]
        reasons = [c["finish_reason"] for p in rec.payloads() for c in p.get("choices", []) if c["finish_reason"]]
        assert list(a["gen_ai.response.finish_reasons"]) == reasons


REASONS = {"responses_text_stream": ("stop",), "responses_tool_calls_stream": ("tool_calls",),
           "responses_text": ("stop",), "responses_failed_event_stream": ("error",),
           "responses_content_filter": ("content_filter",)}  # status incomplete, reason content_filter


@pytest.mark.parametrize("name", list(REASONS))
def test_responses_finish_reasons_are_finish_reasons(client: Any, replay: ReplayServer, name: str) -> None:
    call("sync", replay.base_url(name), load(name))
    assert one_span(client).attributes["gen_ai.response.finish_reasons"] == REASONS[name]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", BODIES)
def test_bodies_plain_and_raw_alike(client: Any, replay: ReplayServer, name: str, mode: str, variant: str) -> None:
    rec = load(name)
    rates, durations = rate_points(client), duration_count(client)
    outcome = call(mode, replay.base_url(name), rec, variant)
    assert outcome[0] == "ok"
    span = one_span(client)
    assert duration_count(client) == durations + 1
    a = span.attributes
    assert span.status.status_code == StatusCode.UNSET
    body = rec.json
    if rec.api == "embeddings":
        assert span.name == f"embeddings {rec.request['model']}"
        assert a["gen_ai.operation.name"] == "embeddings"
        assert a["gen_ai.embeddings.dimension.count"] == len(body["data"][0]["embedding"])
        assert a["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
        assert a["gen_ai.response.model"] == body["model"]
        assert "gen_ai.usage.output_tokens" not in a and "llm.client.output.characters_per_second" not in a
        if "encoding_format" in rec.request:
            assert a["gen_ai.request.encoding_formats"] == (rec.request["encoding_formats"]
                                                            if False else rec.request["encoding_format"],)
        assert rate_points(client) == rates
        return
    assert a["gen_ai.response.id"] == body["id"] and a["gen_ai.response.model"] == body["model"]
    usage = body["usage"]
    if rec.api == "chat":
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
            usage["prompt_tokens"], usage["completion_tokens"])
        assert list(a["gen_ai.response.finish_reasons"]) == [c["finish_reason"] for c in body["choices"]]
        texts = [c["message"].get("content") or "" for c in body["choices"]]
    else:
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
            usage["input_tokens"], usage["output_tokens"])
        texts = [part["text"] for item in body["output"] for part in item["content"]]
    # the usage's token details, as the recording reports them (absent where it reports none)
    prompt = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    completion = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    assert a.get("gen_ai.usage.cache_read.input_tokens") == prompt.get("cached_tokens")
    assert a.get("gen_ai.usage.reasoning.output_tokens") == completion.get("reasoning_tokens")
    if any(texts):
        assert rate_points(client) == rates + 1
    else:  # tool calls and refusals: characters of their own, never a rate of 0
        assert rate_points(client) == rates + (1 if a["llm.client.output_characters"] else 0)
        assert a["llm.client.output_characters"] > 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_http_error_is_an_error_span(client: Any, replay: ReplayServer, mode: str) -> None:
    outcome = call(mode, replay.base_url("error_401"), load("error_401"))
    assert outcome[:2] == ("raised", "AuthenticationError")
    span = one_span(client)
    assert span.status.status_code == StatusCode.ERROR and span.attributes["error.type"] == "AuthenticationError"


def test_metrics_of_an_embeddings_call(client: Any, replay: ReplayServer) -> None:
    def count(metric: str) -> int:
        try:
            return sum(p.count for p in client.metric_points(metric)
                       if p.attributes.get("gen_ai.operation.name") == "embeddings")
        except KeyError:
            return 0
    before = count("gen_ai.client.operation.duration"), count("gen_ai.client.token.usage")
    call("async", replay.base_url("embeddings"), load("embeddings"))
    assert (count("gen_ai.client.operation.duration"), count("gen_ai.client.token.usage")) == (
        before[0] + 1, before[1] + 1)  # input tokens only


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", ["chat_text_stream", "responses_tool_calls_stream"])
def test_abandoned_replayed_stream_ends_once_at_its_last_chunk(client: Any, replay: ReplayServer, mode: str,
                                                              name: str) -> None:
    rec = load(name)
    c_kwargs = dict(base_url=replay.base_url(name), api_key="sk-test", max_retries=0)

    def sync_body() -> None:
        stream = getattr(openai.OpenAI(**c_kwargs), "chat").completions.create(**rec.request) if rec.api == "chat" \
            else openai.OpenAI(**c_kwargs).responses.create(**rec.request)
        for i, _ in enumerate(stream):
            if i == 6:
                break

    async def async_body() -> None:
        c = openai.AsyncOpenAI(**c_kwargs)
        res = c.chat.completions if rec.api == "chat" else c.responses
        stream = await res.create(**rec.request)
        i = 0
        async for _ in stream:
            i += 1
            if i == 7:
                break

    sync_body() if mode == "sync" else asyncio.run(async_body())
    span = one_span(client)
    a = span.attributes
    assert a["llm.client.stream.end"] == "abandoned" and span.status.status_code == StatusCode.UNSET
    payloads = rec.payloads()[:7]
    want = sum(1 for p in payloads if (p.get("choices") if rec.api == "chat" else p["type"].endswith(".delta")))
    assert a["llm.client.chunks"] == want
    assert a["llm.client.duration"] == pytest.approx((span.end_time - span.start_time) / 1e9, abs=1e-6)


def test_raw_stream_iterated_directly(client: Any, replay: ReplayServer) -> None:
    """``with_streaming_response`` read line by line: chunks counted per SSE event of output, span ends
    at the last line, not when the headers arrived."""
    rec = load("chat_tool_call_stream")
    c = openai.OpenAI(base_url=replay.base_url(rec.name), api_key="sk-test", max_retries=0)
    with c.chat.completions.with_streaming_response.create(**rec.request) as response:
        lines = list(response.iter_lines())
    assert any("[DONE]" in line for line in lines)
    a = one_span(client).attributes
    assert a["llm.client.stream.end"] == "complete"
    assert a["llm.client.chunks"] == expected(rec)["chunks"]
    legacy = c.chat.completions.with_raw_response.create(**rec.request)
    client.spans.clear()
    n = sum(1 for _ in legacy.http_response.iter_lines())
    assert n > 0
    a = one_span(client).attributes
    assert a["llm.client.stream.end"] == "complete" and a["llm.client.chunks"] == expected(rec)["chunks"]


def test_goodput_needs_a_first_chunk(client: Any, replay: ReplayServer) -> None:
    """A stream that ends before any output chunk is never good, whatever its SLO says."""
    rec = load("chat_text_stream")
    c = openai.OpenAI(base_url=replay.base_url(rec.name), api_key="sk-test", max_retries=0)
    stream = c.chat.completions.create(**rec.request)
    stream.close()  # before reading anything
    a = one_span(client).attributes
    assert a["llm.client.chunks"] == 0 and "gen_ai.response.time_to_first_chunk" not in a
    assert a["llm.client.slo.met"] is False


def capture(client: Any, replay: ReplayServer, name: str, **overrides: Any) -> tuple[list, list]:
    client.reinstrument(capture_content="true")
    try:
        call("sync", replay.base_url(name), load(name), **overrides)
    finally:
        client.reinstrument()
    a = one_span(client).attributes
    return json.loads(a.get("gen_ai.input.messages", "[]")), json.loads(a["gen_ai.output.messages"])


@pytest.mark.parametrize("name", ["chat_two_tool_calls", "chat_two_tool_calls_stream"])
def test_captured_tool_calls(client: Any, replay: ReplayServer, name: str) -> None:
    _, out = capture(client, replay, name)
    assert out == [{"role": "assistant", "finish_reason": "tool_calls", "parts": [
        {"type": "tool_call", "id": "call_fdNz3vOBKYgOIpMdWotB9MjY" if "stream" not in name else out[0]["parts"][0]["id"],
         "name": "GetWeatherArgs", "arguments": {"city": "Edinburgh", "country": "GB", "units": "c"}},
        {"type": "tool_call", "id": out[0]["parts"][1]["id"], "name": "get_stock_price",
         "arguments": {"ticker": "AAPL", "exchange": "NASDAQ"}}]}]
    assert all(p["id"].startswith("call_") for p in out[0]["parts"])


@pytest.mark.parametrize("name", ["chat_refusal", "chat_refusal_stream"])
def test_captured_refusal(client: Any, replay: ReplayServer, name: str) -> None:
    rec = load(name)
    text = rec.json["choices"][0]["message"]["refusal"] if not rec.stream else "".join(
        c["delta"].get("refusal") or "" for p in rec.payloads() for c in p.get("choices", []))
    _, out = capture(client, replay, name)
    assert text and out == [{"role": "assistant", "finish_reason": "stop",
                             "parts": [{"type": "refusal", "content": text}]}]


def test_captured_responses_tool_calls_stream(client: Any, replay: ReplayServer) -> None:
    rec = load("responses_tool_calls_stream")
    (final,) = [p for p in rec.payloads() if p["type"] == "response.completed"]
    _, out = capture(client, replay, rec.name)
    assert out == [{"role": "assistant", "finish_reason": "tool_calls", "parts": [
        {"type": "tool_call", "id": item["call_id"], "name": item["name"], "arguments": json.loads(item["arguments"])}
        for item in final["response"]["output"]]}]
    assert len(out[0]["parts"]) == 2


def test_captured_input_with_tool_calls_and_tool_results(client: Any, replay: ReplayServer) -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What's the weather like in Edinburgh?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "GetWeatherArgs",
                                                              "arguments": "{\"city\": \"Edinburgh\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy, 9 C"},
    ]
    inp, out = capture(client, replay, "chat_text", messages=history)
    assert inp == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What's the weather like in Edinburgh?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "GetWeatherArgs",
                                         "arguments": {"city": "Edinburgh"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "rainy, 9 C"}]},
    ]
    assert out[0]["parts"][0]["type"] == "text" and out[0]["finish_reason"] == "stop"


def test_captured_n3_stream_keeps_choices_apart(client: Any, replay: ReplayServer) -> None:
    rec = load("chat_n3_stream")
    _, out = capture(client, replay, rec.name)
    texts = {i: "" for i in range(3)}
    for p in rec.payloads():
        for c in p.get("choices", []):
            texts[c["index"]] += c["delta"].get("content") or ""
    assert [m["parts"] for m in out] == [[{"type": "text", "content": texts[i]}] for i in range(3)]
    assert [m["finish_reason"] for m in out] == ["stop"] * 3


@pytest.mark.parametrize("how", ["dropped", "closed"])
def test_raw_stream_never_parsed(client: Any, replay: ReplayServer, how: str) -> None:
    """A streamed raw response the caller drops or closes unread: one span, abandoned or closed, no chunk."""
    rec = load("chat_text_stream")
    c = openai.OpenAI(base_url=replay.base_url(rec.name), api_key="sk-test", max_retries=0)
    if how == "closed":
        with c.chat.completions.with_streaming_response.create(**rec.request) as response:
            assert response.status_code == 200
    else:
        raw = c.chat.completions.with_raw_response.create(**rec.request)
        assert raw.status_code == 200
        del raw
    span = one_span(client)
    a = span.attributes
    assert a["llm.client.stream.end"] == {"dropped": "abandoned", "closed": "closed"}[how]
    assert a["llm.client.chunks"] == 0 and a["llm.client.slo.met"] is False


def test_raw_parse_twice_is_one_stream(client: Any, replay: ReplayServer) -> None:
    rec = load("chat_text_stream")
    c = openai.OpenAI(base_url=replay.base_url(rec.name), api_key="sk-test", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(**rec.request)
    stream = raw.parse()
    assert raw.parse() is stream
    assert len(list(stream)) == len(rec.payloads())
    a = one_span(client).attributes
    assert a["llm.client.stream.end"] == "complete" and a["llm.client.chunks"] == expected(rec)["chunks"]


# -- openai's helpers: ``.parse()`` (wrapped: it posts directly) and ``.stream()`` (timed through ``create``) --

# what a span says about the exchange, whatever helper made the call
FACTS = ("gen_ai.operation.name", "gen_ai.request.model", "server.address", "server.port", "gen_ai.response.id",
         "gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
         "gen_ai.response.finish_reasons", "llm.client.output_characters", "llm.client.output.kinds",
         "llm.client.chunks", "llm.client.stream.end", "gen_ai.request.stream")
HELPER_CASES = [(n, h) for n in all_names() for h in HELPERS if helper_applies(load(n), h)
                and not (h != "stream" and "tools" in load(n).request)]  # openai refuses non-strict tools


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name,helper", HELPER_CASES)
def test_helpers_measured_as_create(client: Any, replay: ReplayServer, name: str, helper: str, mode: str) -> None:
    """The span of ``.parse()`` / ``with_raw_response.parse()`` / ``.stream()`` says what the span of the
    plain ``create`` on the same exchange says (the same facts, one duration record each); where the
    helper itself raises on a response the API did return (``.parse()``'s finish-reason errors), the span
    is an error of that type and still carries the response's facts."""
    rec = load(name)
    call(mode, replay.base_url(name), rec, "plain")
    base = one_span(client)
    client.spans.clear()
    count = duration_count(client)
    outcome = helper_call(mode, replay.base_url(name), rec, helper)
    span = one_span(client)
    a, b = span.attributes, base.attributes
    assert duration_count(client) == count + 1
    assert span.name == base.name and span.kind == SpanKind.CLIENT
    assert {k: a.get(k) for k in FACTS} == {k: b.get(k) for k in FACTS}
    assert ("gen_ai.response.time_to_first_chunk" in a) == ("gen_ai.response.time_to_first_chunk" in b)
    if helper != "stream" and outcome[0] == "raised":
        assert span.status.status_code == StatusCode.ERROR and a["error.type"] == outcome[1]
    else:  # ``.stream()``'s own raise after a complete stream (finish-reason errors) is not the call's
        assert (span.status.status_code, a.get("error.type")) == (base.status.status_code, b.get("error.type"))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", ["chat_text_stream", "responses_text_stream"])
def test_stream_helper_left_early_ends_closed_once(client: Any, replay: ReplayServer, name: str, mode: str) -> None:
    """Leaving the ``with`` block of ``.stream()`` mid-stream closes the HTTP response behind our proxy's back;
    the wrapped helper ``close()`` ends the span there, as ``closed`` (not later, as ``abandoned``)."""
    rec = load(name)
    kwargs = {k: v for k, v in rec.request.items() if k != "stream"}

    def sync_body() -> Any:
        c = openai.OpenAI(base_url=replay.base_url(name), api_key="sk-test", max_retries=0)
        res = c.chat.completions if rec.api == "chat" else c.responses
        with res.stream(**kwargs) as stream:
            for i, _ in enumerate(stream):
                if i == 5:
                    break
            spans = client.finished()  # still open inside the block
        return stream, spans

    async def async_body() -> Any:
        c = openai.AsyncOpenAI(base_url=replay.base_url(name), api_key="sk-test", max_retries=0)
        res = c.chat.completions if rec.api == "chat" else c.responses
        async with res.stream(**kwargs) as stream:
            i = 0
            async for _ in stream:
                i += 1
                if i == 6:
                    break
            spans = client.finished()
        await c.close()
        return stream, spans

    stream, inside = sync_body() if mode == "sync" else asyncio.run(async_body())
    assert inside == []
    (span,) = client.finished()  # ended at the block's exit, while the helper is still referenced
    a = span.attributes
    assert a["llm.client.stream.end"] == "closed" and span.status.status_code == StatusCode.UNSET
    assert 0 < a["llm.client.chunks"] < expected(rec)["chunks"]
    del stream
    assert one_span(client) is not None  # collected: the proxy's finalizer does not end it a second time


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", ["chat_content_filter", "chat_content_filter_stream", "responses_content_filter"])
def test_content_filter_is_a_finish_reason_not_an_error(client: Any, replay: ReplayServer, name: str,
                                                        mode: str) -> None:
    """Output cut by the content filter (composed recordings, the documented shapes): the call succeeded, the
    span is not an error, its finish reason is ``content_filter`` (Responses: ``incomplete_details.reason``)."""
    rec = load(name)
    outcome = call(mode, replay.base_url(name), rec)
    assert outcome[0] == "ok"
    span = one_span(client)
    a = span.attributes
    assert span.status.status_code == StatusCode.UNSET and "error.type" not in a
    assert a["gen_ai.response.finish_reasons"] == ("content_filter",)
    assert a["llm.client.output_characters"] > 0 and a["llm.client.slo.met"] in (True, False)
    if rec.stream:
        assert a["llm.client.stream.end"] == "complete" and a["llm.client.chunks"] == expected(rec)["chunks"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_parse_of_a_filtered_response_is_an_error_with_the_responses_facts(client: Any, replay: ReplayServer,
                                                                           mode: str) -> None:
    """``.parse()`` raises ``ContentFilterFinishReasonError`` for a filtered response: an error span of that type
    that still says which response it was (id, usage, the ``content_filter`` finish reason)."""
    rec = load("chat_content_filter")
    outcome = helper_call(mode, replay.base_url(rec.name), rec, "parse")
    assert outcome[:2] == ("raised", "ContentFilterFinishReasonError")
    span = one_span(client)
    a = span.attributes
    assert span.status.status_code == StatusCode.ERROR and a["error.type"] == "ContentFilterFinishReasonError"
    assert a["gen_ai.response.finish_reasons"] == ("content_filter",) and a["gen_ai.response.id"] == rec.json["id"]
    assert a["gen_ai.usage.output_tokens"] == rec.json["usage"]["completion_tokens"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_stream_proxy_is_transparent(client: Any, replay: ReplayServer, mode: str) -> None:
    """The stream the caller gets is a light proxy, not the ``openai.Stream`` itself, but it passes for it:
    ``isinstance``, ``.response``, attribute writes, ``next()`` mixed with ``for``, ``with``."""
    rec = load("chat_text_stream")
    n = len(rec.payloads())

    def sync_body() -> tuple[Any, ...]:
        c = openai.OpenAI(base_url=replay.base_url(rec.name), api_key="sk-test", max_retries=0)
        stream = c.chat.completions.create(**rec.request)
        stream.caller_note = "kept"
        with stream as same:
            first = next(same)
            rest = [chunk for chunk in same]
        return (isinstance(stream, openai.Stream), type(stream) is openai.Stream, stream.response.status_code,
                stream.__wrapped__.caller_note, same is stream, [first, *rest])

    async def async_body() -> tuple[Any, ...]:
        c = openai.AsyncOpenAI(base_url=replay.base_url(rec.name), api_key="sk-test", max_retries=0)
        stream = await c.chat.completions.create(**rec.request)
        stream.caller_note = "kept"
        async with stream as same:
            first = await same.__anext__()
            rest = [chunk async for chunk in same]
        await c.close()
        return (isinstance(stream, openai.AsyncStream), type(stream) is openai.AsyncStream,
                stream.response.status_code, stream.__wrapped__.caller_note, same is stream, [first, *rest])

    is_stream, exact, status, note, same, chunks = sync_body() if mode == "sync" else asyncio.run(async_body())
    assert (is_stream, exact, status, note, same) == (True, False, 200, "kept", True)
    assert [c.model_dump(exclude_unset=True) for c in chunks] == rec.payloads()
    a = one_span(client).attributes
    assert a["llm.client.stream.end"] == "complete" and a["llm.client.chunks"] == expected(rec)["chunks"]
