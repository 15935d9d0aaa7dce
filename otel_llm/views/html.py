"""The timeline as one self-contained HTML page: inline CSS, inline SVG, a few lines of inline JS.

Nothing is fetched (no fonts, scripts or images from anywhere), so the page opens from a file, offline,
attached to a ticket. Hovering a request lane highlights the engine steps it was served by.
"""

from __future__ import annotations

import html
import json
import math

from . import curves as latency_curves
from ..core.diagnosis.causes import BY_NAME
from .timeline import Lane, Segment, Timeline

LABEL_W, PLOT_W, LANE_H, ENGINE_H, AXIS_H, GAP = 380, 980, 44, 44, 26, 8  # fits 1440 px wide
FEATURE_LINE = 13  # a request lane with an adapter or speculative decoding gets a line more for them
SUB_CHARS = 66  # what fits in LABEL_W at the subtitle's font size; the full text is in the lane's tooltip
COLOURS = {
    "queue": "#b0b7c3", "prefill": "#3b82f6", "chunk": "#1e40af", "decode": "#22c55e", "stall": "#dc2626",
    "requeue": "#f59e0b", "reprefill": "#a855f7",
    "step-prefill": "#3b82f6", "step-decode": "#22c55e", "step-mixed": "#f97316", "step-unknown": "#9ca3af",
}
LEGEND = (("queue", "queue"), ("prefill", "prefill"), ("chunk", "prefill chunk"), ("decode", "decode"),
          ("stall", "decode stall"), ("requeue", "preempted (requeue)"), ("step-prefill", "step: prefill"),
          ("step-decode", "step: decode"), ("step-mixed", "step: mixed"))

CSS = """
body{font:13px system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px;color:#111}
h1{font-size:18px;margin:0 0 4px} p.meta{color:#555;margin:0 0 12px}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:-2px;border-radius:2px}
svg text{font-size:11px;fill:#222} svg .sub{fill:#666;font-size:10px} svg .tick{fill:#666;font-size:10px}
svg .why{fill:#b91c1c;font-size:10px} svg .feat{fill:#4338ca;font-size:10px}
h2{font-size:15px;margin:22px 0 4px} .curves{display:flex;flex-wrap:wrap;gap:8px} figure.curve{margin:0}
svg .ctitle{font-size:12px;font-weight:600} p.cnote{color:#666;font-size:11px;margin:2px 0 0;max-width:420px}
svg .lane:hover .bg{fill:#eef2ff} svg .bg{fill:#fafafa}
svg rect.seg{stroke:#fff;stroke-width:.3} svg .step.hl{stroke:#111;stroke-width:1.5}
svg .step.dim{opacity:.25}
table{border-collapse:collapse;margin-top:14px}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left}
"""

JS = """
(function(){
  var steps=document.querySelectorAll('rect.step');
  document.querySelectorAll('g.lane.request').forEach(function(g){
    var mine=new Set(JSON.parse(g.getAttribute('data-steps')||'[]').map(String));
    g.addEventListener('mouseenter',function(){steps.forEach(function(s){
      var on=mine.has(s.getAttribute('data-step'));s.classList.toggle('hl',on);s.classList.toggle('dim',!on);});});
    g.addEventListener('mouseleave',function(){steps.forEach(function(s){s.classList.remove('hl','dim');});});
  });
  document.body.setAttribute('data-ready','1');
})();
"""


def render(t: Timeline, source: str, curves: list[latency_curves.Curve] | None = None) -> str:
    scale = PLOT_W / (t.end_ns - t.start_ns)
    y, parts = AXIS_H, []
    for lane in t.requests:
        h = LANE_H + FEATURE_LINE if lane.features else LANE_H
        parts.append(_lane(lane, y, h, scale, t.start_ns, "request"))
        y += h + GAP
    y += GAP
    for lane in t.engines:
        parts.append(_lane(lane, y, ENGINE_H, scale, t.start_ns, "engine"))
        y += ENGINE_H + GAP
    height = y + 4
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + PLOT_W + 10}" height="{height}" '
           f'id="timeline">{_axis(t, height)}{"".join(parts)}</svg>')
    legend = "".join(f'<span><i style="background:{COLOURS[k]}"></i>{html.escape(v)}</span>' for k, v in LEGEND)
    rows = "".join(f"<tr><td>{html.escape(lane.title)}</td>"
                   f"<td>{html.escape('; '.join(x for x in (lane.subtitle, lane.features) if x))}</td>"
                   f"<td>{html.escape(lane.verdict)}</td>"
                   f"<td>{sum(1 for s in lane.segments if s.kind == 'stall')}</td><td>{len(lane.step_ids)}</td></tr>"
                   for lane in t.requests)
    chosen = t.selection.describe() if t.selection is not None else ""
    if t.requests:
        empty = ""
    elif chosen:
        empty = f"<p><b>No request in this file matches</b> {html.escape(chosen)}.</p>"
    else:
        empty = "<p><b>No request spans in this file</b> (nothing carries llm.latency.e2e).</p>"
    which = f" with {html.escape(chosen)}" if chosen else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>otel-llm timeline: {html.escape(source)}</title>
<style>{CSS}</style></head><body>
<h1>Slowest requests and the engine steps they shared</h1>
<p class="meta">{html.escape(source)}: {t.total_spans} spans, {t.total_requests} request spans; the
{len(t.requests)} slowest{which} (end to end) over {1000 * t.duration_s:.0f} ms. A stall is a decode step whose gap is over
3&times; the request's median gap. Hover a request to see its engine steps.</p>
<div class="legend">{legend}</div>
{empty}{svg}
<table><thead><tr><th>request</th><th>summary</th><th>verdict</th><th>stalls</th><th>engine steps</th></tr></thead>
<tbody>{rows}</tbody></table>
{_causes(t)}
{latency_curves.section(curves) if curves else ""}
<script>{JS}</script>
</body></html>
"""


def _lane(lane: Lane, y: int, h: int, scale: float, t0: int, kind: str) -> str:
    steps = json.dumps(sorted(lane.step_ids))
    cause = f' data-cause="{html.escape(lane.cause)}"' if lane.cause else ""
    full = "\n".join(x for x in (lane.title, lane.subtitle, lane.features, lane.verdict) if x)
    out = [f'<g class="lane {kind}" data-key="{html.escape(lane.key)}" data-steps="{html.escape(steps)}"{cause}>',
           f'<rect class="bg" x="0" y="{y}" width="{LABEL_W + PLOT_W}" height="{h}"><title>{html.escape(full)}'
           '</title></rect>',
           f'<text x="4" y="{y + 12}">{html.escape(lane.title)}</text>',
           f'<text class="sub" x="4" y="{y + 24}">{html.escape(_clip(lane.subtitle, SUB_CHARS))}</text>']
    line = y + 37
    for cls, text in (("feat", lane.features), ("why", lane.verdict)):
        if text:
            out.append(f'<text class="{cls}" x="4" y="{line}">{html.escape(_clip(text, SUB_CHARS))}</text>')
            line += FEATURE_LINE
    for seg in lane.segments:
        out.append(_rect(seg, y, h, scale, t0))
    out.append("</g>")
    return "".join(out)


def _rect(seg: Segment, y: int, h: int, scale: float, t0: int) -> str:
    x = LABEL_W + (seg.start_ns - t0) * scale
    w = max((seg.end_ns - seg.start_ns) * scale, 0.75)
    top, height = y + 3, h - 6
    if seg.kind == "chunk":  # a thin band inside the prefill bar
        top, height = y + 3, (h - 6) / 3
    elif seg.kind in ("stall", "requeue", "reprefill"):
        top, height = y + 3 + (h - 6) / 3, (h - 6) * 2 / 3
    step = f' data-step="{seg.step_id}"' if seg.step_id is not None else ""
    cls = "seg step" if seg.kind.startswith("step-") else "seg"
    detail = ", ".join(_arg(k, v) for k, v in seg.args.items() if v is not None)
    return (f'<rect class="{cls} {seg.kind}" x="{x:.2f}" y="{top:.1f}" width="{w:.2f}" height="{height:.1f}" '
            f'fill="{COLOURS.get(seg.kind, "#999")}"{step}><title>{html.escape(seg.label)}: {html.escape(detail)}'
            f'</title></rect>')


UNITS = {"duration_ms": ("duration", "ms"), "gap_ms": ("gap", "ms"), "median_gap_ms": ("median gap", "ms"),
         "kv_cache_usage": ("KV cache", "%"), "prefill_tokens": ("prefill", "tokens"),
         "decode_tokens": ("decode", "tokens"), "tokens": ("", "tokens"), "batch_size": ("batch", "requests"),
         "links": ("serves", "kept requests")}


def _arg(key: str, value: object) -> str:
    """A tooltip entry with its unit and a precision a person reads (``duration 0.887 ms``, ``KV cache 42%``)."""
    label, unit = UNITS.get(key, (key.replace("_", " "), ""))
    if isinstance(value, float):
        if unit == "%":
            text = f"{100 * value:.0f}%"
            unit = ""
        else:
            text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    else:
        text = str(value)
    return " ".join(x for x in (label, text, unit) if x)


def _axis(t: Timeline, height: int) -> str:
    span_ms = 1000 * t.duration_s
    step = _nice(span_ms / 10)
    in_s = step >= 1000
    out = []
    for i in range(int(span_ms // step) + 1):
        ms = i * step
        x = LABEL_W + ms / span_ms * PLOT_W
        label = f"{ms / 1000:g} s" if in_s else f"{ms:g} ms"
        # the last label ends at the plot's edge instead of running past it
        anchor = ' text-anchor="end"' if x > LABEL_W + PLOT_W - 60 else ""
        tx = x - 2 if anchor else x + 2
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{AXIS_H - 6}" y2="{height}" stroke="#e5e7eb"/>'
                   f'<text class="tick"{anchor} x="{tx:.1f}" y="{AXIS_H - 10}">{label}</text>')
    return "".join(out)


def _nice(raw: float) -> float:
    if raw <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _causes(t: Timeline) -> str:
    """The legend of the verdicts shown: each cause among the drawn requests, with what it means."""
    shown = sorted({lane.cause for lane in t.requests if lane.cause in BY_NAME})
    if not shown:
        return ""
    items = "".join(f"<dt>{html.escape(c)}</dt><dd>{html.escape(BY_NAME[c].summary)}</dd>" for c in shown)
    return f'<dl class="causes">{items}</dl>'
