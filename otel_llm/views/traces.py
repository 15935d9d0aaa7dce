"""Spans read back from an OTLP/JSON trace file: what the demo's ``OTLPJsonFileExporter`` and the
collector's ``file`` exporter write (one ``ExportTraceServiceRequest`` per line; a whole file holding
one request is read the same way).

Parsing is ``otel_llm.otlp.json_codec``'s (hex ids, the protobuf JSON mapping); this module only flattens
the parsed requests into small records the views work on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from .. import semconv as sc
from ..otlp.json_codec import OtlpJsonError, parse_request


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str


@dataclass
class Span:
    """One span, ids as lowercase hex, times in nanoseconds since the epoch."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    service: str
    links: tuple[Link, ...] = ()
    events: tuple[tuple[str, int], ...] = ()  # (name, time ns)
    children: list["Span"] = field(default_factory=list, repr=False)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class TraceFileError(ValueError):
    """A trace file that cannot be read: says which line and why."""


def value(v: Any) -> Any:
    """A parsed ``AnyValue``'s value (arrays as lists, kvlists as dicts)."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def read_spans(path: str | os.PathLike[str]) -> list[Span]:
    """Every span in the file; raises ``TraceFileError`` naming the first bad line (nothing is skipped
    silently: a report from half a file would mislead)."""
    with open(path, "rb") as f:
        data = f.read()
    lines = [line for line in data.splitlines() if line.strip()]
    requests, first_error = [], None
    for number, line in enumerate(lines, 1):
        try:
            requests.append(parse_request(line))
        except OtlpJsonError as exc:
            first_error = f"{os.fspath(path)}:{number}: {exc}"
            break
    if first_error is not None:
        try:  # one pretty-printed request over many lines
            requests = [parse_request(data)]
        except OtlpJsonError:
            raise TraceFileError(first_error) from None
    return list(_flatten(requests))


def _flatten(requests: Iterable[Any]) -> Iterator[Span]:
    for request in requests:
        for rs in request.resource_spans:
            service = ""
            for kv in rs.resource.attributes:
                if kv.key == sc.SERVICE_NAME:
                    service = str(value(kv.value))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    yield Span(
                        trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(),
                        name=s.name, start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                        attributes={kv.key: value(kv.value) for kv in s.attributes}, service=service,
                        links=tuple(Link(link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        events=tuple((e.name, e.time_unix_nano) for e in s.events))


def index(spans: list[Span]) -> dict[str, Span]:
    """Spans by span id, each with its children attached (sorted by start)."""
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        s.children.clear()
    for s in spans:
        parent = by_id.get(s.parent_id) if s.parent_id else None
        if parent is not None:
            parent.children.append(s)
    for s in spans:
        s.children.sort(key=lambda c: c.start_ns)
    return by_id
