"""What each wrapped operation reads: request attributes, a streamed chunk, a whole response.

One small class per API (chat completions, completions, responses), all with the same four
methods; the wrappers and stream proxies are shared. ``chunk`` is on the hot path: attribute
reads on the chunk and a few appends, returning the length of the output text it carried.
"""

from __future__ import annotations

import json
from typing import Any

from ...core import semconv as sc
from ...core.content import input_messages
from .record import CallRecord

_OMIT_TYPES = ("Omit", "NotGiven")
_REQUEST_PARAMS = (
    ("max_tokens", sc.REQUEST_MAX_TOKENS), ("max_completion_tokens", sc.REQUEST_MAX_TOKENS),
    ("max_output_tokens", sc.REQUEST_MAX_TOKENS), ("temperature", sc.REQUEST_TEMPERATURE),
    ("top_p", sc.REQUEST_TOP_P), ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"), ("seed", "gen_ai.request.seed"),
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
    if given(stop):
        a["gen_ai.request.stop_sequences"] = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
    n = kwargs.get("n")
    if given(n) and n != 1:
        a["gen_ai.request.choice.count"] = n
    return a


class _Choices:
    """Chat and text completions differ only in where a choice keeps its text."""

    operation = ""

    @staticmethod
    def delta_text(choice: Any) -> str | None:
        raise NotImplementedError

    @staticmethod
    def message_text(choice: Any) -> str | None:
        raise NotImplementedError

    @classmethod
    def chunk(cls, rec: CallRecord, chunk: Any) -> int:
        n = 0
        for c in chunk.choices:
            text = cls.delta_text(c)
            if text:
                n += len(text)
                if rec.texts is not None:
                    rec.add_text(c.index, text)
            if c.finish_reason:
                rec.finish_reasons.append(c.finish_reason)
        usage = chunk.usage
        if usage is not None:
            rec.input_tokens = usage.prompt_tokens
            rec.output_tokens = usage.completion_tokens
        if rec.response_id is None:
            rec.response_id = chunk.id
            rec.response_model = chunk.model
        return n

    @classmethod
    def response(cls, rec: CallRecord, r: Any) -> None:
        rec.response_id, rec.response_model = r.id, r.model
        for c in r.choices:
            if c.finish_reason:
                rec.finish_reasons.append(c.finish_reason)
            text = cls.message_text(c)
            if text:
                rec.chars += len(text)
                rec.add_text(c.index, text)
        _usage(rec, r.usage, "prompt_tokens", "completion_tokens")


class Chat(_Choices):
    operation = "chat"

    @staticmethod
    def capture_input(rec: CallRecord, kwargs: dict[str, Any]) -> None:
        messages = kwargs.get("messages")
        if given(messages):
            items = [(m.get("role", "user"), m.get("content")) for m in messages if isinstance(m, dict)]
            rec.input_messages = input_messages(items)

    @staticmethod
    def delta_text(choice: Any) -> str | None:
        return choice.delta.content

    @staticmethod
    def message_text(choice: Any) -> str | None:
        return choice.message.content


class TextCompletion(_Choices):
    operation = "text_completion"

    @staticmethod
    def capture_input(rec: CallRecord, kwargs: dict[str, Any]) -> None:
        prompt = kwargs.get("prompt")
        if isinstance(prompt, str):
            rec.input_messages = input_messages([("user", prompt)])
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            rec.input_messages = input_messages([("user", p) for p in prompt])

    @staticmethod
    def delta_text(choice: Any) -> str | None:
        return choice.text

    @staticmethod
    def message_text(choice: Any) -> str | None:
        return choice.text


class Responses:
    operation = "chat"
    _DONE = ("response.completed", "response.incomplete", "response.failed")

    @staticmethod
    def capture_input(rec: CallRecord, kwargs: dict[str, Any]) -> None:
        value = kwargs.get("input")
        if isinstance(value, str):
            rec.input_messages = input_messages([("user", value)])
        elif isinstance(value, list):
            rec.input_messages = input_messages([(m.get("role", "user"), m.get("content")) for m in value
                                                 if isinstance(m, dict)])
        instructions = kwargs.get("instructions")
        if isinstance(instructions, str):
            rec.system_instructions = json.dumps([{"type": "text", "content": instructions}], ensure_ascii=False)

    @staticmethod
    def chunk(rec: CallRecord, event: Any) -> int:
        kind = event.type
        if kind == "response.output_text.delta":
            text = event.delta
            if text and rec.texts is not None:
                rec.add_text(event.output_index, text)
            return len(text) if text else 0
        if kind in Responses._DONE or kind == "response.created":
            Responses._facts(rec, event.response, final=kind != "response.created")
        return 0

    @staticmethod
    def response(rec: CallRecord, r: Any) -> None:
        Responses._facts(rec, r, final=True)
        text = r.output_text
        if text:
            rec.chars += len(text)
            rec.add_text(0, text)

    @staticmethod
    def _facts(rec: CallRecord, r: Any, final: bool) -> None:
        rec.response_id, rec.response_model = r.id, r.model
        if final:
            details = getattr(r, "incomplete_details", None)
            reason = getattr(details, "reason", None) if details is not None else None
            if r.status:
                rec.finish_reasons.append(reason or r.status)
            _usage(rec, r.usage, "input_tokens", "output_tokens")


def _usage(rec: CallRecord, usage: Any, input_name: str, output_name: str) -> None:
    if usage is not None:
        rec.input_tokens = getattr(usage, input_name, None)
        rec.output_tokens = getattr(usage, output_name, None)
