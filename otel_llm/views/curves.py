"""The latency curves performance engineers read, from the user's own recorded traffic.

* prefill: engine-step time against the step's prefill tokens (compute-bound: it grows with them);
* decode: decode-only step time against the decode batch size (memory-bound: flat until the knee),
  coloured by the batch's mean context;
* the roofline: each step's arithmetic intensity (FLOPs per byte) against its achieved FLOP/s, with the
  device's ridge point, where steps turn from memory- to compute-bound;
* TTFT against prompt length, per request.

Where the steps carry the roofline's prediction (``llm.engine.step.predicted_time``: device peaks
known), it is drawn beside the measured time. Rendered as inline SVG (no script, nothing fetched).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from .. import semconv as sc
from .traces import Span

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 420, 260, 58, 38, 22, 12


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    predicted: float | None = None  # the roofline's time for the same step, when known
    colour: float | None = None  # 0..1, a third quantity (decode: the batch's context)
    label: str = ""


@dataclass
class Curve:
    key: str  # prefill, decode, roofline, ttft
    title: str
    x_label: str
    y_label: str
    points: list[Point] = field(default_factory=list)
    log: bool = False  # log-log (the roofline)
    ridge: float | None = None  # x of the device's ridge point (FLOPs per byte)
    note: str = ""


def _num(a: dict, key: str) -> float | None:
    v = a.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def build(spans: list[Span]) -> list[Curve]:
    """The four curves from every engine-step and request span of a trace file."""
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    prefill = Curve("prefill", "Prefill: step time against prefill tokens", "prefill tokens in the step", "step ms")
    decode = Curve("decode", "Decode: step time against decode batch size", "decoding requests in the step",
                   "step ms", note="colour: the step's mean context (tokens), light = short, dark = long")
    roof = Curve("roofline", "Roofline: FLOP/s against FLOPs per byte", "FLOPs per byte (log)",
                 "FLOP/s (log)", log=True)
    contexts = []
    peak_flops, peak_bw = [], []
    for s in steps:
        a = s.attributes
        ms = (s.end_ns - s.start_ns) / 1e6
        predicted = _num(a, sc.STEP_PREDICTED_TIME)
        predicted_ms = 1000 * predicted if predicted is not None else None
        tokens = _num(a, sc.STEP_NUM_PREFILL_TOKENS) or 0.0
        decoding = _num(a, sc.STEP_NUM_DECODE_REQS)
        if decoding is None:
            decoding = _num(a, sc.STEP_NUM_DECODE_TOKENS)
        if tokens > 0:
            prefill.points.append(Point(tokens, ms, predicted_ms, label=f"{tokens:.0f} prefill tokens, {ms:.1f} ms"))
        elif decoding:
            batch = _num(a, sc.STEP_BATCH_SIZE)
            kv = _num(a, sc.STEP_KV_CACHE_USAGE)
            contexts.append(kv)
            decode.points.append(Point(decoding, ms, predicted_ms, kv,
                                       f"{decoding:.0f} decoding, {ms:.1f} ms" + (f", batch {batch:.0f}" if batch else "")))
        flops, intensity = _num(a, sc.STEP_FLOPS), _num(a, sc.STEP_INTENSITY)
        seconds = _num(a, sc.STEP_MODEL_TIME) or ms / 1000
        if flops and intensity and seconds > 0:
            roof.points.append(Point(intensity, flops / seconds, label=f"{intensity:.1f} FLOP/B, "
                                     f"{flops / seconds / 1e9:.2f} GFLOP/s, {a.get(sc.STEP_BOUND, '?')}-bound"))
            if predicted:
                bytes_ = _num(a, sc.STEP_BYTES)
                (peak_flops if a.get(sc.STEP_BOUND) == "compute" else peak_bw).append(
                    flops / predicted if a.get(sc.STEP_BOUND) == "compute" else (bytes_ or 0) / predicted)
    known = [c for c in contexts if c is not None]
    if known:  # colour by KV-cache usage, the context the batch holds, scaled to the run's range
        lo, hi = min(known), max(known)
        decode.points = [Point(p.x, p.y, p.predicted, None if p.colour is None else
                               (p.colour - lo) / (hi - lo) if hi > lo else 0.5, p.label) for p in decode.points]
        decode.note = "colour: the step's KV-cache usage (the batch's context), light = little, dark = much"
    if peak_flops and peak_bw:
        roof.ridge = max(peak_flops) / max(p for p in peak_bw if p) if any(peak_bw) else None
    if not roof.points:
        roof.note = ("no step carries FLOPs: device peaks unknown (set OTEL_LLM_DEVICE, or OTEL_LLM_PEAK_FLOPS and "
                     "OTEL_LLM_PEAK_MEMORY_BANDWIDTH on a CPU)")
    elif roof.ridge is None:
        roof.note = "ridge point: needs steps on both sides of it (memory- and compute-bound)"
    ttft = Curve("ttft", "TTFT against prompt length", "prompt tokens", "TTFT ms")
    for s in spans:
        a = s.attributes
        first, prompt = _num(a, sc.LATENCY_TTFT), _num(a, sc.USAGE_INPUT_TOKENS)
        if first is not None and prompt is not None:
            ttft.points.append(Point(prompt, 1000 * first, label=f"{a.get(sc.RESPONSE_ID, '')}: {prompt:.0f} tokens, "
                                     f"TTFT {1000 * first:.0f} ms"))
    return [prefill, decode, roof, ttft]


def _scale(values: list[float], log: bool) -> tuple[float, float]:
    vals = [math.log10(v) for v in values if v > 0] if log else values
    if not vals:
        return (0.0, 1.0)
    lo, hi = (min(vals), max(vals)) if log else (0.0, max(vals))
    return (lo, hi if hi > lo else lo + 1.0)


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0 ** e for e in range(math.floor(lo), math.ceil(hi) + 1)]
    raw = (hi - lo) / 4
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    return [lo + i * step for i in range(int((hi - lo) / step) + 1)]


def _fmt(v: float) -> str:
    if v >= 1e9:
        return f"{v / 1e9:g}G"
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def svg(c: Curve) -> str:
    """One curve as an SVG scatter plot: measured points (dots), the roofline's prediction (crosses)."""
    xs = [p.x for p in c.points]
    ys = [p.y for p in c.points] + [p.predicted for p in c.points if p.predicted is not None]
    (x0, x1), (y0, y1) = _scale(xs, c.log), _scale(ys, c.log)
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def sx(v: float) -> float:
        v = math.log10(v) if c.log else v
        return PAD_L + (v - x0) / (x1 - x0) * pw

    def sy(v: float) -> float:
        v = math.log10(v) if c.log else v
        return PAD_T + ph - (v - y0) / (y1 - y0) * ph

    out = [f'<svg class="curve" data-curve="{c.key}" width="{W}" height="{H}">',
           f'<text x="{PAD_L}" y="14" class="ctitle">{html.escape(c.title)}</text>',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ddd"/>']
    for t in _ticks(x0, x1, c.log):
        x = sx(t) if not c.log else PAD_L + (math.log10(t) - x0) / (x1 - x0) * pw
        if PAD_L - 1 <= x <= PAD_L + pw + 1:
            out.append(f'<text class="tick" x="{x:.1f}" y="{PAD_T + ph + 13}" text-anchor="middle">{_fmt(t)}</text>')
    for t in _ticks(y0, y1, c.log):
        y = sy(t) if not c.log else PAD_T + ph - (math.log10(t) - y0) / (y1 - y0) * ph
        if PAD_T - 1 <= y <= PAD_T + ph + 1:
            out.append(f'<text class="tick" x="{PAD_L - 4}" y="{y + 3:.1f}" text-anchor="end">{_fmt(t)}</text>'
                       f'<line x1="{PAD_L}" x2="{PAD_L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    out.append(f'<text class="tick" x="{PAD_L + pw / 2}" y="{H - 6}" text-anchor="middle">{html.escape(c.x_label)}</text>'
               f'<text class="tick" x="12" y="{PAD_T + ph / 2}" transform="rotate(-90 12 {PAD_T + ph / 2})" '
               f'text-anchor="middle">{html.escape(c.y_label)}</text>')
    if c.ridge is not None and c.log and c.ridge > 0:
        x = sx(c.ridge)
        if PAD_L <= x <= PAD_L + pw:
            out.append(f'<line class="ridge" x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T}" y2="{PAD_T + ph}" stroke="#dc2626" '
                       f'stroke-dasharray="4 3"><title>ridge point {c.ridge:.1f} FLOPs per byte</title></line>'
                       f'<text class="tick" x="{x + 3:.1f}" y="{PAD_T + 10}" fill="#dc2626">ridge {c.ridge:.1f}</text>')
    for p in c.points:
        if c.log and (p.x <= 0 or p.y <= 0):
            continue
        shade = "#2563eb" if p.colour is None else f"hsl(220, 80%, {75 - 50 * p.colour:.0f}%)"
        out.append(f'<circle class="pt" cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="2.4" fill="{shade}" fill-opacity=".7">'
                   f'<title>{html.escape(p.label)}</title></circle>')
        if p.predicted is not None and p.predicted > 0:
            px, py = sx(p.x), sy(p.predicted)
            out.append(f'<path class="predicted" d="M{px - 2:.1f},{py - 2:.1f}l4,4m0,-4l-4,4" stroke="#dc2626" '
                       f'stroke-width="1"><title>roofline: {p.predicted:.2f} ms</title></path>')
    if not c.points:
        out.append(f'<text class="sub" x="{PAD_L + 8}" y="{PAD_T + 20}">no steps of this kind in the trace</text>')
    out.append("</svg>")
    note = f'<p class="cnote">{html.escape(c.note)}</p>' if c.note else ""
    return f'<figure class="curve">{"".join(out)}{note}</figure>'


def section(curves: list[Curve]) -> str:
    legend = ('<span><i style="background:#2563eb"></i>measured</span>'
              '<span><i style="background:#dc2626"></i>roofline prediction (x) / ridge point (dashed)</span>')
    return (f'<h2 id="curves">Latency curves from this traffic</h2><p class="meta">Every engine step and request in '
            f'the file. Prefill is compute-bound: its step time grows with its tokens. Decode is memory-bound: '
            f'flat in the batch size until the knee. Points right of the ridge are compute-bound.</p>'
            f'<div class="legend">{legend}</div><div class="curves">{"".join(svg(c) for c in curves)}</div>')
