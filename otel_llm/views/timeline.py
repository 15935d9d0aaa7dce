"""The lanes the report draws, built once from spans and shared by the HTML page and the Chrome trace.

The slowest requests (by ``llm.latency.e2e``), each as a lane of its queue / prefill / decode spans
with their prefill chunks, preemptions (requeue, re-prefill) and decode stalls; below them the engine
steps those requests shared (found through the steps' span links, or a chunk's or decode step's
``llm.engine.step.id``), coloured by the step's phase. Only names from the trace contract are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import semconv as sc
from ..core.diagnosis.causes import BY_NAME, NAMES as CAUSES
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
    verdict: str = ""  # why it was slow: the cause, its seconds per cause, the breached objectives
    cause: str | None = None
    features: str = ""  # its LoRA adapter and speculative decoding, where it had them (``features``)


@dataclass
class Timeline:
    start_ns: int
    end_ns: int
    requests: list[Lane]
    engines: list[Lane]
    total_requests: int
    total_spans: int
    selection: "Selection | None" = None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def is_request(span: Span) -> bool:
    return sc.LATENCY_E2E in span.attributes


@dataclass(frozen=True)
class Selection:
    """Which requests to draw: the ``top`` slowest of those with verdict ``cause`` (any when ``None``)
    that breached objective ``breached`` (ttft, tpot, e2e; any when ``None``)."""

    top: int = 8
    cause: str | None = None
    breached: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.top, int) or self.top < 1:
            raise ValueError(f"top must be a positive number of requests, not {self.top!r}")
        if self.cause is not None and self.cause not in BY_NAME:
            raise ValueError(f"unknown cause {self.cause!r}; one of {', '.join(CAUSES)}")
        if self.breached is not None and self.breached not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.breached!r}; one of {', '.join(OBJECTIVES)}")

    def admits(self, span: Span) -> bool:
        a = span.attributes
        if self.cause is not None and a.get(sc.SLOW_CAUSE) != self.cause:
            return False
        return self.breached is None or self.breached in (a.get(sc.SLO_BREACHED) or ())

    def describe(self) -> str:
        parts = ([f"verdict {self.cause}"] if self.cause else []) + (
            [f"breached {self.breached}"] if self.breached else [])
        return " and ".join(parts)


OBJECTIVES = {"ttft": sc.LATENCY_TTFT, "tpot": sc.LATENCY_TPOT, "e2e": sc.LATENCY_E2E}


def build(spans: list[Span], top: int = 8, select: Selection | None = None,
          slo: Mapping[str, float] | None = None) -> Timeline:
    """The ``top`` slowest request spans (of those ``select`` admits) as lanes, and the engine steps
    that ran while they did. ``slo``: objective -> seconds, shown beside a breached objective (a trace
    does not carry the SLO it was judged against)."""
    select = select if select is not None else Selection(top)
    index(spans)
    requests = sorted((s for s in spans if is_request(s) and select.admits(s)), key=lambda s: -_e2e(s))[:select.top]
    lanes = [_request_lane(r, slo or {}) for r in requests]
    wanted = {r.span_id for r in requests}
    step_ids = set().union(*(lane.step_ids for lane in lanes)) if lanes else set()
    all_steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    steps = [s for s in all_steps
             if any(link.span_id in wanted for link in s.links) or s.attributes.get(sc.ENGINE_STEP_ID) in step_ids]
    for st in steps:  # a step linked to a request is one of its steps even when no child names it
        for lane in lanes:
            if any(link.span_id == lane.key for link in st.links) and sc.ENGINE_STEP_ID in st.attributes:
                lane.step_ids.add(st.attributes[sc.ENGINE_STEP_ID])
    if requests:  # and the other recorded steps that ran meanwhile: the engine lane shows what it had
        lo = min(r.start_ns for r in requests)
        hi = max(r.end_ns for r in requests)
        served = {id(s) for s in steps}
        steps += [s for s in all_steps if id(s) not in served and s.end_ns > lo and s.start_ns < hi]
    engines = _engine_lanes(steps)
    everything = [seg for lane in lanes + engines for seg in lane.segments]
    start = min((seg.start_ns for seg in everything), default=0)
    end = max((seg.end_ns for seg in everything), default=start)
    return Timeline(start, max(end, start + 1), lanes, engines, sum(1 for s in spans if is_request(s)), len(spans),
                    select)


def _e2e(span: Span) -> float:
    value = span.attributes.get(sc.LATENCY_E2E)
    return float(value) if isinstance(value, (int, float)) else span.duration_s


def _request_lane(r: Span, slo: Mapping[str, float]) -> Lane:
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
                + (f", kept for {reason}" if reason else ""))
    return Lane(r.span_id, title, subtitle, segments, steps, verdict(a, slo), str(cause) if cause else None,
                features(a))


def features(a: Mapping[str, Any]) -> str:
    """``LoRA adapter-a; speculative: drafted 30, accepted 21 (70%)``: the request's adapter and its
    speculative decoding, from its span (empty where it had neither)."""
    parts = []
    adapter = a.get(sc.LORA_NAME)
    if adapter is not None:
        parts.append(f"LoRA {adapter}")
    drafted, accepted = a.get(sc.SPEC_DRAFT_TOKENS), a.get(sc.SPEC_ACCEPTED_TOKENS)
    if isinstance(drafted, int) and isinstance(accepted, int):
        rate = a.get(sc.SPEC_ACCEPTANCE_RATE)
        if not isinstance(rate, (int, float)) and drafted > 0:
            rate = accepted / drafted
        parts.append(f"speculative: drafted {drafted}, accepted {accepted}"
                     + (f" ({100 * rate:.0f}%)" if isinstance(rate, (int, float)) else ""))
    return "; ".join(parts)


def verdict(a: Mapping[str, Any], slo: Mapping[str, float]) -> str:
    """``why: prefill_interference (prefill_interference 0.41 s, queue_max_seqs 0.02 s); breached tpot
    61.2 ms > SLO 30 ms``: the verdict, the seconds each cause cost, each breached objective and the SLO
    it was judged against: the request span's own (``llm.slo.<objective>``), else ``slo``, the report's."""
    parts = []
    cause = a.get(sc.SLOW_CAUSE)
    if cause:
        costs = sorted(((float(a[BY_NAME[c].attribute]), c) for c in CAUSES
                        if isinstance(a.get(BY_NAME[c].attribute), (int, float)) and a[BY_NAME[c].attribute] > 0),
                       reverse=True)
        parts.append(f"why: {cause}" + (" (" + ", ".join(f"{c} {seconds(v)}" for v, c in costs) + ")" if costs else ""))
    breached = []
    for objective in a.get(sc.SLO_BREACHED) or ():
        value = a.get(OBJECTIVES.get(str(objective), ""))
        text = str(objective)
        if isinstance(value, (int, float)):
            text += f" {seconds(float(value))}"
            limit = a.get(sc.SLO_THRESHOLDS.get(str(objective), ""), slo.get(str(objective)))
            if isinstance(limit, (int, float)):
                text += f" > SLO {seconds(float(limit))}"
        breached.append(text)
    if breached:
        parts.append("breached " + ", ".join(breached))
    return "; ".join(parts)


def seconds(value: float) -> str:
    """A duration a person reads: ``412 ms``, ``3.1 ms``, ``1.42 s``."""
    if value >= 1:
        return f"{value:.2f} s"
    ms = 1000 * value
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


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
        lanes.append(Lane(f"engine:{key}", "engine steps", f"{len(group)} steps that served kept requests ({key.strip('/')})",
                          segments, verdict="gaps: steps of unsampled requests, not idle time"))
    return lanes


def _ms(span: Span) -> float:
    return round((span.end_ns - span.start_ns) / 1e6, 3)
