"""Reading finished spans back as trees (test helper)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from opentelemetry.sdk.trace import ReadableSpan

from otel_llm import semconv as sc

MS = 1_000_000  # ns


@dataclass
class RequestTree:
    span: ReadableSpan
    children: dict[str, list[ReadableSpan]] = field(default_factory=lambda: defaultdict(list))
    grandchildren: dict[str, list[ReadableSpan]] = field(default_factory=lambda: defaultdict(list))

    def one(self, name: str) -> ReadableSpan:
        found = self.children[name]
        assert len(found) == 1, f"expected one {name}, got {len(found)}"
        return found[0]

    @property
    def attributes(self) -> dict:
        return dict(self.span.attributes or {})

    def decode_rows(self) -> list[ReadableSpan]:
        """The decode span's children in time order: decode steps kept on their own, and windows."""
        rows = self.grandchildren[sc.SPAN_DECODE_STEP] + self.grandchildren[sc.SPAN_DECODE_WINDOW]
        return sorted(rows, key=lambda s: s.start_time)


def row_tokens(row: ReadableSpan) -> int:
    """Output tokens a decode row stands for."""
    a = row.attributes
    return a[sc.STEP_TOKENS] if row.name == sc.SPAN_DECODE_STEP else a[sc.WINDOW_TOKENS]


def request_trees(spans: list[ReadableSpan]) -> dict[str, RequestTree]:
    """Request spans by ``gen_ai.response.id``, with their children and grandchildren by name."""
    by_id = {s.context.span_id: s for s in spans}
    trees: dict[int, RequestTree] = {}
    for s in spans:
        # (an llm.choice span of a request with n > 1 has latencies too, but no response id: not a request)
        if s.attributes and sc.LATENCY_E2E in s.attributes and sc.RESPONSE_ID in s.attributes:
            trees[s.context.span_id] = RequestTree(s)
    for s in spans:
        parent = s.parent.span_id if s.parent else None
        if parent in trees:
            trees[parent].children[s.name].append(s)
        elif parent in by_id and by_id[parent].parent and by_id[parent].parent.span_id in trees:
            trees[by_id[parent].parent.span_id].grandchildren[s.name].append(s)
    return {str(t.span.attributes[sc.RESPONSE_ID]): t for t in trees.values()}


def engine_steps(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
