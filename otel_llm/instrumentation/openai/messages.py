"""openai's message shapes in the GenAI conventions' message shape (content capture only, cold path).

Input: chat ``messages`` and Responses ``input`` items, with tool calls (``tool_call`` parts: id, name,
arguments), tool results (``tool_call_response`` parts with the ``tool_call_id``), refusals and text.
Output: ``Output`` collects a response's or a stream's pieces per choice (or per Responses output
item) and renders ``gen_ai.output.messages``. Parts use the conventions' types (``text``,
``tool_call``, ``tool_call_response``, ``reasoning``); a refusal is a ``refusal`` part (the
conventions' generic part: a type and its content).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

TEXT, TOOL_CALL, TOOL_CALL_RESPONSE, REFUSAL, REASONING = "text", "tool_call", "tool_call_response", "refusal", \
    "reasoning"


def arguments(raw: Any) -> Any:
    """Tool-call arguments as the object they encode where they are valid JSON, else as sent."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": TEXT, "content": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, (list, tuple)):
        for p in content:
            if not isinstance(p, Mapping):
                continue
            kind = str(p.get("type", "unknown"))
            if "text" in p and kind in ("text", "input_text", "output_text"):
                parts.append({"type": TEXT, "content": p.get("text")})
            elif kind == "refusal":
                parts.append({"type": REFUSAL, "content": p.get("refusal")})
            else:
                parts.append({"type": kind})  # images, audio, files: named, not copied
    return parts


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    return {"type": TOOL_CALL, "id": call.get("id"), "name": fn.get("name"), "arguments": arguments(fn.get("arguments"))}


def chat_input(messages: list | tuple) -> list[dict[str, Any]]:
    """Chat ``messages`` (dicts) in the conventions' shape: role + parts."""
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = str(m.get("role", "user"))
        parts = _content_parts(m.get("content"))
        if role == "tool":
            parts = [{"type": TOOL_CALL_RESPONSE, "id": m.get("tool_call_id"),
                      "response": m.get("content") if isinstance(m.get("content"), str) else parts}]
        if isinstance(m.get("refusal"), str):
            parts.append({"type": REFUSAL, "content": m["refusal"]})
        for call in m.get("tool_calls") or ():
            if isinstance(call, Mapping):
                parts.append(_tool_call(call))
        out.append({"role": role, "parts": parts})
    return out


def responses_input(items: list | tuple) -> list[dict[str, Any]]:
    """Responses ``input`` items: messages, function calls and their outputs."""
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "function_call":
            out.append({"role": "assistant", "parts": [{"type": TOOL_CALL, "id": item.get("call_id"),
                                                         "name": item.get("name"),
                                                         "arguments": arguments(item.get("arguments"))}]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "parts": [{"type": TOOL_CALL_RESPONSE, "id": item.get("call_id"),
                                                    "response": item.get("output")}]})
        elif "role" in item or kind == "message":
            out.append({"role": str(item.get("role", "user")), "parts": _content_parts(item.get("content"))})
    return out


def dumps(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, ensure_ascii=False, default=str)


class Output:
    """A response's output, piece by piece (per choice index or Responses output index), rendered once.

    ``text``/``refusal``/``reasoning`` pieces are joined; a tool call is keyed by its position in the
    choice (chat streams send its id and name once, then argument pieces under the same index)."""

    __slots__ = ("_msgs",)

    def __init__(self) -> None:
        self._msgs: dict[int, dict[str, Any]] = {}

    def _msg(self, index: int) -> dict[str, Any]:
        m = self._msgs.get(index)
        if m is None:
            m = self._msgs[index] = {"parts": [], "tools": {}, "finish_reason": None}
        return m

    def piece(self, index: int, kind: str, text: str) -> None:
        parts = self._msg(index)["parts"]
        if parts and parts[-1][0] == kind:
            parts[-1][1].append(text)
        else:
            parts.append((kind, [text]))

    def tool_call(self, index: int, tool_index: int, call_id: str | None, name: str | None, args: str | None) -> None:
        m = self._msg(index)
        call = m["tools"].get(tool_index)
        if call is None:
            call = m["tools"][tool_index] = [call_id, name, []]
            m["parts"].append((TOOL_CALL, call))
        if call_id:
            call[0] = call_id
        if name:
            call[1] = name
        if args:
            call[2].append(args)

    def finish(self, index: int, reason: str | None) -> None:
        if reason:
            self._msg(index)["finish_reason"] = reason

    def render(self, finish_reasons: list[str]) -> list[dict[str, Any]]:
        out = []
        for i in sorted(self._msgs) or [0]:
            m = self._msgs.get(i) or {"parts": [], "finish_reason": None}
            parts = []
            for kind, value in m["parts"]:
                if kind == TOOL_CALL:
                    parts.append({"type": TOOL_CALL, "id": value[0], "name": value[1],
                                  "arguments": arguments("".join(value[2]))})
                else:
                    parts.append({"type": kind, "content": "".join(value)})
            msg: dict[str, Any] = {"role": "assistant", "parts": parts}
            reason = m["finish_reason"] or (finish_reasons[i] if i < len(finish_reasons) else None)
            if reason:
                msg["finish_reason"] = reason
            out.append(msg)
        return out
