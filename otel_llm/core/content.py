"""Prompts and completions in the GenAI conventions' message shape (only when content capture is on).

``gen_ai.input.messages`` / ``gen_ai.output.messages`` are lists of ``{"role", "parts": [...]}``
(plus ``finish_reason`` on outputs), JSON-encoded into one span attribute. One shape for the
server adapters and the client adapters.
"""

from __future__ import annotations

import json
from typing import Any


def input_messages(items: list[tuple[str, Any]]) -> str:
    """``gen_ai.input.messages`` in the GenAI conventions' shape (role + parts), JSON-encoded."""
    out = []
    for role, content in items:
        if isinstance(content, str):
            parts = [{"type": "text", "content": content}]
        elif isinstance(content, list):  # content parts: keep text parts, name the others
            parts = [{"type": "text", "content": p.get("text", "")} if isinstance(p, dict) and "text" in p
                     else {"type": str(p.get("type", "unknown")) if isinstance(p, dict) else "unknown"}
                     for p in content]
        else:
            parts = []
        out.append({"role": str(role), "parts": parts})
    return json.dumps(out, ensure_ascii=False)


def output_messages(texts: dict[int, list[str]], finish_reasons: list[str]) -> str:
    """``gen_ai.output.messages`` in the GenAI conventions' shape, JSON-encoded for a span attribute."""
    out = []
    for i in sorted(texts) or [0]:
        msg: dict[str, Any] = {"role": "assistant",
                               "parts": [{"type": "text", "content": "".join(texts.get(i, ()))}]}
        if i < len(finish_reasons):
            msg["finish_reason"] = finish_reasons[i]
        out.append(msg)
    return json.dumps(out, ensure_ascii=False)
