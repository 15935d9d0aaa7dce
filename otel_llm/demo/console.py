"""What the demo prints: latency quantiles from the metrics, goodput, the verdict table per phase, and
the slowest requests with the engine steps that stretched them."""

from __future__ import annotations

import collections
from collections import defaultdict
from typing import Any, Iterable

from .. import semconv as sc
from ..core.metrics import GOOD_REQUESTS, REQUESTS, SERVER_HISTOGRAMS, SLO_BREACHES
from .scenario import PhaseTally


def points_by_name(data: Any) -> dict[str, list[Any]]:
    """Every data point of ``MetricsData`` (or ``None``: nothing recorded yet), grouped by metric name."""
    out: dict[str, list[Any]] = defaultdict(list)
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name].extend(m.data.data_points)
    return out


def quantile_from_histogram(point: Any, q: float) -> tuple[float, bool]:
    """Prometheus' histogram_quantile (linear inside the bucket holding the rank), and whether the
    rank fell past the last finite bound: then the value is only known to be above it."""
    rank = q * point.count
    seen, lower = 0, 0.0
    for upper, count in zip(list(point.explicit_bounds) + [float("inf")], point.bucket_counts):
        if count and seen + count >= rank:
            if upper == float("inf"):
                return lower, True
            return lower + (upper - lower) * (rank - seen) / count, False
        seen += count
        lower = upper
    return lower, False


def format_quantile(value: float, above: bool) -> str:
    """``  12.3ms``, `` 51.20 s``, or ``  > 10 s`` when the quantile is past the histogram's top bucket."""
    if above:
        return f"> {value:g} s".rjust(9)
    if value >= 10:
        return f"{value:7.2f} s"
    return f"{1000 * value:7.1f}ms"


def latency_lines(got: dict[str, list[Any]]) -> list[str]:
    lines = [f"{'':22s} {'p50':>9s} {'p95':>9s} {'p99':>9s}   (from the metrics, as Prometheus computes them)"]
    by_field = {h.field: h.name for h in SERVER_HISTOGRAMS}
    for label, name in (("time to first token", by_field["ttft"]), ("time per output token", by_field["tpot"]),
                        ("end to end", by_field["e2e"])):
        points = got.get(name)
        if not points:
            continue
        lines.append(f"{label:22s} " + " ".join(format_quantile(*quantile_from_histogram(points[0], q))
                                                for q in (.5, .95, .99)))
    return lines


def goodput_lines(got: dict[str, list[Any]]) -> list[str]:
    total = sum(p.value for p in got.get(REQUESTS, ()))
    good = sum(p.value for p in got.get(GOOD_REQUESTS, ()))
    lines = [f"goodput: {good:.0f} of {total:.0f} requests met every SLO at once"
             + (f" ({100 * good / total:.0f}%)" if total else "")]
    breaches: collections.Counter = collections.Counter()
    for p in got.get(SLO_BREACHES, ()):
        breaches[(p.attributes[sc.SLO_OBJECTIVE], p.attributes[sc.SLOW_CAUSE])] += p.value
    for (objective, cause), n in sorted(breaches.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {objective} breaches caused by {cause}: {n:.0f}")
    return lines


def verdict_table(tallies: list[PhaseTally]) -> list[str]:
    """cause -> requests -> seconds lost -> the phase built to cause it, one row per phase and verdict.
    The rows count a phase's victim requests; its load requests' breaches (their own work) are a note."""
    lines = [f"{'verdict (llm.slow.cause)':26s} {'requests':>8s} {'seconds lost':>12s}   phase (built to cause)"]
    for t in tallies:
        expected = ", ".join(sorted(t.phase.causes)) or "nothing: the quiet baseline"
        head = f"{t.phase.name} ({expected})"
        if not t.breached:
            lines.append(f"{'-':26s} {0:8d} {'':>12s}   {head}: none of {t.requests} breached")
            if t.load_breached:
                lines.append(f"{'':26s} {'':8s} {'':12s}   (not counted: {t.load_breached} of its {t.load} load "
                             "requests breached, slowed by their own work)")
            continue
        for cause, n in sorted(t.causes.items(), key=lambda kv: -kv[1]):
            mark = "" if not t.phase.causes or cause in t.phase.causes else "   <- not the phase's cause"
            lines.append(f"{cause:26s} {n:8d} {t.seconds.get(cause, 0.0):11.2f}s   {head}{mark}")
        if t.phase.causes:
            lines.append(f"{'':26s} {'':8s} {'':12s}   -> {t.right} of {t.breached} breached requests "
                         f"({100 * (t.share_right or 0):.0f}%) carry the phase's cause")
        if t.load_breached:
            causes = ", ".join(f"{c} {n}" for c, n in sorted(t.load_causes.items(), key=lambda kv: -kv[1]))
            lines.append(f"{'':26s} {'':8s} {'':12s}   (not counted: {t.load_breached} of its {t.load} load "
                         f"requests breached too, slowed by their own work: {causes})")
    return lines


def slowest_lines(spans: list[Any], n: int = 5) -> list[str]:
    """The slowest kept requests: phases, verdict with its seconds per cause, and their worst engine steps."""
    requests = [s for s in spans if s.attributes and sc.LATENCY_E2E in s.attributes]
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    children = collections.defaultdict(list)
    for s in spans:
        if s.parent:
            children[s.parent.span_id].append(s)
    linked = collections.defaultdict(list)
    for st in steps:
        for link in st.links:
            linked[link.context.span_id].append(st)
    lines = ["slowest kept requests:"]
    for r in sorted(requests, key=lambda s: -s.attributes[sc.LATENCY_E2E])[:n]:
        a = r.attributes
        queue = [c for c in children[r.context.span_id] if c.name == sc.SPAN_QUEUE]
        queue_ms = (queue[0].end_time - queue[0].start_time) / 1e6 if queue else 0.0
        lines.append(
            f"  {a.get(sc.RESPONSE_ID, '?'):14s} e2e {1000 * a[sc.LATENCY_E2E]:7.1f}ms = queue+frontend {queue_ms:6.1f}"
            f" + prefill {1000 * a.get(sc.LATENCY_PREFILL, 0):6.1f} + decode {1000 * a.get(sc.LATENCY_DECODE, 0):7.1f}"
            f"   in {a.get(sc.USAGE_INPUT_TOKENS)} / out {a.get(sc.USAGE_OUTPUT_TOKENS)} tokens, preemptions "
            f"{a.get(sc.NUM_PREEMPTIONS, 0)}, kept for {a.get(sc.SAMPLING_REASON)}")
        if sc.SLOW_CAUSE in a:
            costs = ", ".join(f"{c} {1000 * a[sc.SLOW_SECONDS[c]]:.1f}ms" for c in sc.SLOW_CAUSES
                              if a.get(sc.SLOW_SECONDS[c]))
            breached = ",".join(a.get(sc.SLO_BREACHED, ()) or ())
            lines.append(f"      why: {a[sc.SLOW_CAUSE]}" + (f" ({costs})" if costs else "")
                         + (f"; breached {breached}" if breached else ""))
        for st in sorted(linked[r.context.span_id], key=lambda s: s.start_time - s.end_time)[:3]:
            sa = st.attributes
            lines.append(
                f"      engine step {(st.end_time - st.start_time) / 1e6:6.1f}ms {sa.get(sc.STEP_PHASE, '?'):7s} "
                f"batch {sa.get(sc.STEP_BATCH_SIZE, 0):2d}: prefill {sa.get(sc.STEP_NUM_PREFILL_TOKENS, 0):4d} tokens "
                f"({sa.get(sc.STEP_NUM_PREFILL_REQS, 0)} req), decode {sa.get(sc.STEP_NUM_DECODE_TOKENS, 0):2d} tokens, "
                f"KV cache {100 * sa.get(sc.STEP_KV_CACHE_USAGE, 0):.0f}%" + _anatomy(sa))
    return lines


def _anatomy(sa: Any) -> str:
    """Where the step's time went (what the engine measured) and, with device peaks known, its bound."""
    parts = [f"{label} {1000 * sa[key]:.1f}ms" for label, key in (
        ("schedule", sc.STEP_SCHEDULE_TIME), ("model", sc.STEP_MODEL_TIME), ("output", sc.STEP_OUTPUT_TIME),
        ("idle before", sc.STEP_IDLE_BEFORE)) if key in sa]
    if sc.STEP_BOUND in sa:
        parts.append(f"{sa[sc.STEP_BOUND]}-bound")
    return ("\n        " + ", ".join(parts)) if parts else ""


def request_attributes(spans: Iterable[Any]) -> list[dict[str, Any]]:
    """The attributes of each request span (those carrying an end-to-end latency)."""
    return [dict(s.attributes) for s in spans if s.attributes and sc.LATENCY_E2E in s.attributes]
