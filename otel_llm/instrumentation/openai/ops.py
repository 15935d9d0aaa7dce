"""What each wrapped operation reads: request attributes, a streamed chunk, a whole response.

One small class per API (chat completions, completions, responses, embeddings), all with the same
methods; the wrappers and stream proxies are shared. ``chunk(rec, chunk, now)`` is on the hot path:
attribute reads on the chunk and a few appends; it notes the chunk in the record
(``CallRecord.chunk``) with the characters of generated content it carried (text, tool-call names
and arguments, refusals, reasoning), 0 for a chunk without content, or ``NOT_A_CHUNK`` for what is
not an output chunk (the usage-only chunk, Responses lifecycle events), which is not timed.
"""

from __future__ import annotations

import json
from typing import Any

from ... import semconv as sc
from . import messages
from .record import NOT_A_CHUNK, OTHER, REASONING, REFUSAL, TEXT, TOOL_CALL, CallRecord

_OMIT_TYPES = ("Omit", "NotGiven")
_REQUEST_PARAMS = (
    ("max_tokens", sc.REQUEST_MAX_TOKENS), ("max_completion_tokens", sc.REQUEST_MAX_TOKENS),
    ("max_output_tokens", sc.REQUEST_MAX_TOKENS), ("temperature", sc.REQUEST_TEMPERATURE),
    ("top_p", sc.REQUEST_TOP_P), ("frequency_penalty", sc.REQUEST_FREQUENCY_PENALTY),
    ("presence_penalty", sc.REQUEST_PRESENCE_PENALTY), ("seed", sc.REQUEST_SEED),
)


def given(value: Any) -> bool:
    """The openai client's ``omit`` / ``NOT_GIVEN`` sentinels and ``None`` mean "not set"."""
    return value is not None and type(value).__name__ not in _OMIT_TYPES


def request_attributes(kwargs: dict[str, Any]) -> dict[str, Any]:
    a: dict[str, Any] = {}
    for arg, key in _REQUEST_PARAMS:
        value = kwargs.get(arg)
        if given(value) and isinstance(value, (int, float)) and key not in a:
            a[key] = value
    stop = kwargs.get("stop")
    if isinstance(stop, str):
        a[sc.REQUEST_STOP_SEQUENCES] = (stop,)
    elif isinstance(stop, (list, tuple)):
        a[sc.REQUEST_STOP_SEQUENCES] = tuple(str(s) for s in stop)
    n = kwargs.get("n")
    if given(n) and n != 1:
        a[sc.REQUEST_CHOICE_COUNT] = n
    return a


def _usage(rec: CallRecord, usage: Any, input_name: str, output_name: str | None) -> None:
    if usage is not None:
        rec.usage = usage  # its token details (cached, reasoning) are read once, when the call ends
        rec.input_tokens = getattr(usage, input_name, None)
        if output_name is not None:
            rec.output_tokens = getattr(usage, output_name, None)


_CONTENT_ONLY = frozenset(("content",))  # a chat delta's keys when it carries text and nothing else


class Chat:
    operation = sc.OPERATION_CHAT

    @staticmethod
    def attributes(kwargs: dict[str, Any]) -> dict[str, Any]:
        return request_attributes(kwargs)

    @staticmethod
    def capture_input(rec: CallRecord, kwargs: dict[str, Any]) -> None:
        msgs = kwargs.get("messages")
        if isinstance(msgs, (list, tuple)):  # never iterate a one-shot iterable the client has yet to send
            rec.input_messages = messages.dumps(messages.chat_input(msgs))

    @staticmethod
    def chunk(rec: CallRecord, chunk: Any, now: float) -> None:
        if rec.response_id is None:
            rec.response_id = chunk.id
            rec.response_model = chunk.model
        choices = chunk.choices
        if choices and len(choices) == 1 and rec.output is None:
            # The common chunk, inlined (``_read`` and ``CallRecord.chunk`` for one choice): a delta with
            # only ``content`` (the JSON had no other key: no tool call, no refusal) and no extras
            # (vLLM's reasoning), content capture off. ``usage`` rides on the usage-only chunk (no
            # choices) or, for some servers, on the chunk with the finish reason: read only there.
            c = choices[0]
            d = c.delta
            if d is not None and d.__pydantic_fields_set__ == _CONTENT_ONLY and not d.__pydantic_extra__:
                reason = c.finish_reason
                if reason:
                    rec.finish_reasons.append(reason)
                    Chat._usage(rec, chunk.usage)
                rec.stamps.append(now)
                text = d.content
                if text:
                    if not rec.chars:
                        rec.first_content = now
                    rec.chars += len(text)
                    rec.kinds |= TEXT
                return
        usage = chunk.usage
        if usage is not None:
            rec.usage = usage  # its token details (cached, reasoning) are read once, when the call ends
            rec.input_tokens = usage.prompt_tokens
            rec.output_tokens = usage.completion_tokens
        n = Chat._read(rec, choices)
        # ``CallRecord.chunk``, inlined: this runs once a streamed chunk, where a Python call of its own
        # would be a visible share of the adapter's cost (benchmarks/client_overhead.py, the hot path)
        if n >= 0:
            rec.stamps.append(now)
            if n:
                if not rec.chars:
                    rec.first_content = now
                rec.chars += n

    @staticmethod
    def _usage(rec: CallRecord, usage: Any) -> None:
        if usage is not None:
            rec.usage = usage  # its token details (cached, reasoning) are read once, when the call ends
            rec.input_tokens = usage.prompt_tokens
            rec.output_tokens = usage.completion_tokens

    @staticmethod
    def _read(rec: CallRecord, choices: Any) -> int:
        """Characters of generated content in the chunk's choices (any number, any kind)."""
        if not choices:
            return NOT_A_CHUNK
        n = kinds = 0
        out = rec.output
        for c in choices:
            d = c.delta
            if d is not None:
                text = d.content
                if text:
                    n += len(text)
                    kinds |= TEXT
                    if out is not None:
                        out.piece(c.index, messages.TEXT, text)
                calls = d.tool_calls
                if calls:
                    kinds |= TOOL_CALL
                    for t in calls:
                        fn = t.function
                        name = args = None
                        if fn is not None:
                            name, args = fn.name, fn.arguments
                            n += len(name or "") + len(args or "")
                        if out is not None:
                            out.tool_call(c.index, t.index, t.id, name, args)
                refusal = d.refusal
                if refusal:
                    n += len(refusal)
                    kinds |= REFUSAL
                    if out is not None:
                        out.piece(c.index, messages.REFUSAL, refusal)
                extra = d.__pydantic_extra__  # vLLM's reasoning fields ride as extras
                if extra:
                    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
                    if isinstance(reasoning, str) and reasoning:
                        n += len(reasoning)
                        kinds |= REASONING
                        if out is not None:
                            out.piece(c.index, messages.REASONING, reasoning)
            reason = c.finish_reason
            if reason:
                rec.finish_reasons.append(reason)
                if out is not None:
                    out.finish(c.index, reason)
        if kinds:
            rec.kinds |= kinds
        return n

    @staticmethod
    def response(rec: CallRecord, r: Any) -> None:
        rec.response_id, rec.response_model = r.id, r.model
        out = rec.output
        for c in r.choices:
            if c.finish_reason:
                rec.finish_reasons.append(c.finish_reason)
            m = c.message
            text, refusal = m.content, getattr(m, "refusal", None)
            if text:
                rec.chars += len(text)
                rec.kinds |= TEXT
                if out is not None:
                    out.piece(c.index, messages.TEXT, text)
            if refusal:
                rec.chars += len(refusal)
                rec.kinds |= REFUSAL
                if out is not None:
                    out.piece(c.index, messages.REFUSAL, refusal)
            for i, t in enumerate(m.tool_calls or ()):
                rec.kinds |= TOOL_CALL
                fn = getattr(t, "function", None)
                name, args = (fn.name, fn.arguments) if fn is not None else (None, None)
                rec.chars += len(name or "") + len(args or "")
                if out is not None:
                    out.tool_call(c.index, i, t.id, name, args)
            if out is not None:
                out.finish(c.index, c.finish_reason)
        _usage(rec, r.usage, "prompt_tokens", "completion_tokens")


class TextCompletion:
    operation = sc.OPERATION_TEXT_COMPLETION

    @staticmethod
    def attributes(kwargs: dict[str, Any]) -> dict[str, Any]:
        return request_attributes(kwargs)

    @staticmethod
    def capture_input(rec: CallRecord, kwargs: dict[str, Any]) -> None:
        prompt = kwargs.get("prompt")
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt, (list, tuple)) and all(isinstance(p, str) for p in prompt):
            rec.input_messages = messages.dumps([{"role": "user", "parts": [{"type": messages.TEXT, "content": p}]}
                                                 for p in prompt])

    @staticmethod
    def chunk(rec: CallRecord, chunk: Any, now: float) -> None:
        rec.chunk(now, TextCompletion._read(rec, chunk))

    @staticmethod
    def _read(rec: CallRecord, chunk: Any) -> int:
        if rec.response_id is None:
            rec.response_id = chunk.id
            rec.response_model = chunk.model
        usage = chunk.usage
        if usage is not None:
            rec.usage = usage  # its token details (cached, reasoning) are read once, when the call ends
            rec.input_tokens = usage.prompt_tokens
            rec.output_tokens = usage.completion_tokens
        choices = chunk.choices
        if not choices:
            return NOT_A_CHUNK
        n = 0
        out = rec.output
        for c in choices:
            text = c.text
            if text:
                n += len(text)
                rec.kinds |= TEXT
                if out is not None:
                    out.piece(c.index, messages.TEXT, text)
            if c.finish_reason:
                rec.finish_reasons.append(c.finish_reason)
                if out is not None:
                    out.finish(c.index, c.finish_reason)
        return n

    @staticmethod
    def response(rec: CallRecord, r: Any) -> None:
        rec.response_id, rec.response_model = r.id, r.model
        out = rec.output
        for c in r.choices:
            if c.finish_reason:
                rec.finish_reasons.append(c.finish_reason)
            if c.text:
                rec.chars += len(c.text)
                rec.kinds |= TEXT
                if out is not None:
                    out.piece(c.index, messages.TEXT, c.text)
            if out is not None:
                out.finish(c.index, c.finish_reason)
        _usage(rec, r.usage, "prompt_tokens", "completion_tokens")


# Responses stream: every ``*.delta`` event is an output chunk; its type says the kind of output.
_DELTA_KINDS: dict[str, tuple[int, str]] = {
    "response.output_text.delta": (TEXT, messages.TEXT),
    "response.refusal.delta": (REFUSAL, messages.REFUSAL),
    "response.function_call_arguments.delta": (TOOL_CALL, messages.TOOL_CALL),
    "response.custom_tool_call_input.delta": (TOOL_CALL, messages.TOOL_CALL),
    "response.mcp_call_arguments.delta": (TOOL_CALL, messages.TOOL_CALL),
    "response.reasoning_text.delta": (REASONING, messages.REASONING),
    "response.reasoning_summary_text.delta": (REASONING, messages.REASONING),
}
_FINAL = ("response.completed", "response.incomplete", "response.failed")
# Responses' ``incomplete_details.reason`` in the chat API's finish-reason vocabulary
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


class Responses:
    operation = sc.OPERATION_CHAT

    @staticmethod
    def attributes(kwargs: dict[str, Any]) -> dict[str, Any]:
        return request_attributes(kwargs)

    @staticmethod
    def capture_input(rec: CallRecord, kwargs: dict[str, Any]) -> None:
        value = kwargs.get("input")
        if isinstance(value, str):
            rec.input_messages = messages.dumps([{"role": "user", "parts": [{"type": messages.TEXT,
                                                                              "content": value}]}])
        elif isinstance(value, (list, tuple)):
            rec.input_messages = messages.dumps(messages.responses_input(value))
        instructions = kwargs.get("instructions")
        if isinstance(instructions, str):
            rec.system_instructions = json.dumps([{"type": "text", "content": instructions}], ensure_ascii=False)

    @staticmethod
    def chunk(rec: CallRecord, event: Any, now: float) -> None:
        rec.chunk(now, Responses._read(rec, event))

    @staticmethod
    def _read(rec: CallRecord, event: Any) -> int:
        kind = event.type
        found = _DELTA_KINDS.get(kind)
        if found is not None or kind[-6:] == ".delta":
            bit, part = found or (OTHER, "")
            rec.kinds |= bit
            delta = event.delta
            out = rec.output
            if out is not None and found is not None and isinstance(delta, str):
                if bit == TOOL_CALL:
                    out.tool_call(0, event.output_index, None, None, delta)
                else:
                    out.piece(0, part, delta)
            return len(delta) if isinstance(delta, str) else 0
        if kind in _FINAL or kind == "response.created":
            Responses._facts(rec, event.response, final=kind != "response.created")
        elif kind == "response.output_item.added":
            item = event.item
            if rec.output is not None and item.type == "function_call":
                rec.output.tool_call(0, event.output_index, item.call_id, item.name, None)
        elif kind == "error":
            rec.failure = str(getattr(event, "code", None) or "error")
        return NOT_A_CHUNK

    @staticmethod
    def response(rec: CallRecord, r: Any) -> None:
        Responses._facts(rec, r, final=True)
        out = rec.output
        for i, item in enumerate(r.output or ()):
            kind = item.type
            if kind == "message":
                for part in item.content or ():
                    text = getattr(part, "text", None) if part.type == "output_text" else getattr(part, "refusal", None)
                    if text:
                        bit = TEXT if part.type == "output_text" else REFUSAL
                        rec.chars += len(text)
                        rec.kinds |= bit
                        if out is not None:
                            out.piece(0, messages.TEXT if bit == TEXT else messages.REFUSAL, text)
            elif kind == "function_call":
                rec.kinds |= TOOL_CALL
                rec.chars += len(item.arguments or "")  # as its stream counts: argument deltas
                if out is not None:
                    out.tool_call(0, i, item.call_id, item.name, item.arguments)
            elif kind == "reasoning":
                for summary in getattr(item, "summary", None) or ():
                    text = getattr(summary, "text", None)
                    if text:
                        rec.chars += len(text)
                        rec.kinds |= REASONING
                        if out is not None:
                            out.piece(0, messages.REASONING, text)
            else:
                rec.kinds |= OTHER

    @staticmethod
    def _facts(rec: CallRecord, r: Any, final: bool) -> None:
        rec.response_id, rec.response_model = r.id, r.model
        if not final:
            return
        _usage(rec, r.usage, "input_tokens", "output_tokens")
        status = r.status
        if status == "completed":
            calls = any(getattr(item, "type", None) == "function_call" for item in r.output or ())
            reason = "tool_calls" if calls else "stop"
        elif status == "incomplete":
            details = getattr(r, "incomplete_details", None)
            raw = getattr(details, "reason", None) if details is not None else None
            reason = _INCOMPLETE.get(raw, raw or "length")
        elif status == "failed":
            reason = "error"
            error = getattr(r, "error", None)
            rec.failure = str(getattr(error, "code", None) or "response.failed")
        else:
            reason = status
        if reason:
            rec.finish_reasons.append(reason)
            if rec.output is not None:
                rec.output.finish(0, reason)


class Embeddings:
    operation = sc.OPERATION_EMBEDDINGS

    @staticmethod
    def attributes(kwargs: dict[str, Any]) -> dict[str, Any]:
        a: dict[str, Any] = {}
        fmt = kwargs.get("encoding_format")
        if isinstance(fmt, str):
            a[sc.REQUEST_ENCODING_FORMATS] = (fmt,)
        dims = kwargs.get("dimensions")
        if given(dims) and isinstance(dims, int):
            a[sc.EMBEDDINGS_DIMENSION_COUNT] = dims
        return a

    @staticmethod
    def capture_input(rec: CallRecord, kwargs: dict[str, Any]) -> None:
        value = kwargs.get("input")
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            rec.input_messages = messages.dumps([{"role": "user", "parts": [{"type": messages.TEXT, "content": v}]}
                                                 for v in value])

    @staticmethod
    def chunk(rec: CallRecord, chunk: Any, now: float) -> None:  # embeddings do not stream
        return None

    @staticmethod
    def response(rec: CallRecord, r: Any) -> None:
        rec.response_model = r.model
        data = r.data
        if data:
            vector = data[0].embedding
            if isinstance(vector, list):
                rec.dimensions = len(vector)
        _usage(rec, r.usage, "prompt_tokens", None)
