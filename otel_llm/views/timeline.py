"""The lanes the report draws, built once from spans and shared by the HTML page and the Chrome trace.

The slowest requests (by ``llm.latency.e2e``), each as a lane of its queue / prefill / decode spans
with their prefill chunks, preemptions (requeue, re-prefill) and decode stalls; below them the engine
steps those requests shared (found through the steps' span links, or a chunk's or decode step's
``llm.engine.step.id``), coloured by the step's phase. Only names from the trace contract are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import semconv as sc
from .traces import Span, index

# A decode step is a stall when its gap is this many times the request's median gap (and at least STALL_MIN_S):
# relative to the request itself, so a slow model is not all stalls and a fast one still shows its hiccups.
STALL_FACTOR = 3.0
STALL_MIN_S = 0.001
# Runs of uneventful decode steps coalesced into one span (the span budget); a window's tokens count
# towards the median at its mean gap.
SPAN_DECODE_WINDOW, WINDOW_TOKENS = sc.SPAN_DECODE_WINDOW, sc.WINDOW_TOKENS
# a decode step's copy of its engine step's facts (the step facts): shown with the stall
STEP_FACTS_PREFIX = sc.ENGINE_STEP_ID.rsplit(".", 1)[0] + "."

PHASES = {sc.SPAN_QUEUE: "queue", sc.SPAN_PREFILL: "prefill", sc.SPAN_DECODE: "decode"}
PREEMPTION_SPANS = {sc.SPAN_REQUEUE: "requeue", sc.SPAN_REPREFILL: "reprefill"}


@dataclass(frozen=True)
class Segment:
    """One drawn interval. ``kind`` picks its colour: queue, prefill, chunk, decode, stall, requeue,
    reprefill, or step-<phase> on the engine lane."""

    kind: str
    label: str
    start_ns: int
    end_ns: int
    args: dict[str, Any] = field(default_factory=dict)
    step_id: int | None = None  # the engine step it ran in, when the trace says


@dataclass
class Lane:
    key: str  # the request's span id, or "engine:<service>/<engine>"
    title: str
    subtitle: str
    segments: list[Segment]
    step_ids: set[int] = field(default_factory=set)  # engine steps this request was served by


@dataclass
class Timeline:
    start_ns: int
    end_ns: int
    requests: list[Lane]
    engines: list[Lane]
    total_requests: int
    total_spans: int

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def is_request(span: Span) -> bool:
    return sc.LATENCY_E2E in span.attributes


def build(spans: list[Span], top: int = 8) -> Timeline:
    """The ``top`` slowest request spans as lanes, and the engine steps they shared."""
    index(spans)
    requests = sorted((s for s in spans if is_request(s)), key=lambda s: -_e2e(s))[:max(top, 0)]
    lanes = [_request_lane(r) for r in requests]
    wanted = {r.span_id for r in requests}
    step_ids = set().union(*(lane.step_ids for lane in lanes)) if lanes else set()
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP
             and (any(link.span_id in wanted for link in s.links) or s.attributes.get(sc.ENGINE_STEP_ID) in step_ids)]
    for st in steps:  # a step linked to a request is one of its steps even when no child names it
        for lane in lanes:
            if any(link.span_id == lane.key for link in st.links) and sc.ENGINE_STEP_ID in st.attributes:
                lane.step_ids.add(st.attributes[sc.ENGINE_STEP_ID])
    engines = _engine_lanes(steps)
    everything = [seg for lane in lanes + engines for seg in lane.segments]
    start = min((seg.start_ns for seg in everything), default=0)
    end = max((seg.end_ns for seg in everything), default=start)
    return Timeline(start, max(end, start + 1), lanes, engines, sum(1 for s in spans if is_request(s)), len(spans))


def _e2e(span: Span) -> float:
    value = span.attributes.get(sc.LATENCY_E2E)
    return float(value) if isinstance(value, (int, float)) else span.duration_s


def _request_lane(r: Span) -> Lane:
    a = r.attributes
    segments: list[Segment] = []
    steps: set[int] = set()
    for child in r.children:
        kind = PHASES.get(child.name)
        if kind is None:
            continue
        segments.append(Segment(kind, kind, child.start_ns, child.end_ns, {"duration_ms": _ms(child)}))
        for part in child.children:
            step = part.attributes.get(sc.ENGINE_STEP_ID)
            if isinstance(step, int):
                steps.add(step)
            if part.name == sc.SPAN_PREFILL_CHUNK:
                tokens = part.attributes.get(sc.CHUNK_TOKENS)
                segments.append(Segment("chunk", f"chunk {part.attributes.get(sc.CHUNK_INDEX, '')}",
                                        part.start_ns, part.end_ns,
                                        {"tokens": tokens, "duration_ms": _ms(part)}, step))
            elif part.name in PREEMPTION_SPANS:
                segments.append(Segment(PREEMPTION_SPANS[part.name], PREEMPTION_SPANS[part.name],
                                        part.start_ns, part.end_ns, {"duration_ms": _ms(part)}))
        if kind == "decode":
            segments.extend(_stalls(child))
    reason = a.get(sc.SAMPLING_REASON, "")
    cause = a.get(sc.SLOW_CAUSE)
    title = str(a.get(sc.RESPONSE_ID) or r.name)
    subtitle = (f"e2e {1000 * _e2e(r):.0f} ms, in {a.get(sc.USAGE_INPUT_TOKENS, '?')} / out "
                f"{a.get(sc.USAGE_OUTPUT_TOKENS, '?')} tokens, preemptions {a.get(sc.NUM_PREEMPTIONS, 0)}"
                + (f", kept for {reason}" if reason else "") + (f", slow because: {cause}" if cause else ""))
    return Lane(r.span_id, title, subtitle, segments, steps)


def median_gap_ns(decode: Span) -> float | None:
    """The request's median gap per output token: each decode-step span one gap, each decode window
    its token count of gaps at its mean (a token-weighted median)."""
    gaps: list[tuple[float, int]] = []
    for c in decode.children:
        if c.name == sc.SPAN_DECODE_STEP:
            gaps.append((c.end_ns - c.start_ns, 1))
        elif c.name == SPAN_DECODE_WINDOW:
            tokens = c.attributes.get(WINDOW_TOKENS)
            if isinstance(tokens, int) and tokens > 0:
                gaps.append(((c.end_ns - c.start_ns) / tokens, tokens))
    if not gaps:
        return None
    gaps.sort()
    half, seen = sum(w for _, w in gaps) / 2, 0
    for gap, weight in gaps:
        seen += weight
        if seen >= half:
            return gap
    return gaps[-1][0]


def _stalls(decode: Span) -> list[Segment]:
    """Decode steps whose gap stands out from the request's own median gap."""
    tokens = [c for c in decode.children if c.name == sc.SPAN_DECODE_STEP]
    median = median_gap_ns(decode)
    if not tokens or median is None:
        return []
    bar = max(STALL_FACTOR * median, STALL_MIN_S * 1e9)
    out = []
    for c in tokens:
        gap = c.end_ns - c.start_ns
        if gap > bar:
            step = c.attributes.get(sc.ENGINE_STEP_ID)
            facts = {k[len(STEP_FACTS_PREFIX):]: v for k, v in c.attributes.items()
                     if k.startswith(STEP_FACTS_PREFIX) and k != sc.ENGINE_STEP_ID}
            out.append(Segment("stall", f"stall {gap / 1e6:.0f} ms", c.start_ns, c.end_ns,
                               {"token": c.attributes.get(sc.STEP_INDEX), "gap_ms": round(gap / 1e6, 3),
                                "median_gap_ms": round(median / 1e6, 3), **facts},
                               step if isinstance(step, int) else None))
    return out


def _engine_lanes(steps: list[Span]) -> list[Lane]:
    by_engine: dict[str, list[Span]] = {}
    for st in steps:
        by_engine.setdefault(f"{st.service}/{st.attributes.get(sc.ENGINE, '')}", []).append(st)
    lanes = []
    for key, group in sorted(by_engine.items()):
        group.sort(key=lambda s: s.start_ns)
        segments = []
        for st in group:
            a = st.attributes
            phase = str(a.get(sc.STEP_PHASE, "unknown"))
            segments.append(Segment(
                f"step-{phase}", f"{phase} step", st.start_ns, st.end_ns,
                {"duration_ms": _ms(st), "batch_size": a.get(sc.STEP_BATCH_SIZE),
                 "prefill_tokens": a.get(sc.STEP_NUM_PREFILL_TOKENS), "decode_tokens": a.get(sc.STEP_NUM_DECODE_TOKENS),
                 "kv_cache_usage": a.get(sc.STEP_KV_CACHE_USAGE), "links": len(st.links)},
                a.get(sc.ENGINE_STEP_ID) if isinstance(a.get(sc.ENGINE_STEP_ID), int) else None))
        lanes.append(Lane(f"engine:{key}", "engine steps", f"{key.strip('/')}: {len(group)} steps", segments))
    return lanes


def _ms(span: Span) -> float:
    return round((span.end_ns - span.start_ns) / 1e6, 3)
