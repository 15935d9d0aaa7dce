"""The same lanes as Chrome Trace Event Format JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Format: "Trace Event Format", Duca et al., Google (the JSON Object Format: ``traceEvents`` plus
``displayTimeUnit``): https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
Complete events (``ph: "X"``, ``ts``/``dur`` in microseconds) nest by time on one thread, so a request's
thread shows its phases with chunks and stalls beneath; metadata events (``ph: "M"``) name the
processes and threads. Timestamps are microseconds since the Unix epoch, as the spans carry them, so
a torch profiler trace of the same run (``torch.profiler`` exports the same format) can be loaded beside it.
"""

from __future__ import annotations

import json
from typing import Any

from .timeline import Segment, Timeline

REQUESTS_PID, ENGINE_PID = 1, 2


def events(t: Timeline) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [_meta("process_name", REQUESTS_PID, 0, "slowest requests"),
                                 _meta("process_sort_index", REQUESTS_PID, 0, sort_index=0),
                                 _meta("process_name", ENGINE_PID, 0, "engine steps"),
                                 _meta("process_sort_index", ENGINE_PID, 0, sort_index=1)]
    for tid, lane in enumerate(t.requests, 1):
        about = "; ".join(x for x in (lane.subtitle, lane.features) if x)
        out.append(_meta("thread_name", REQUESTS_PID, tid, f"{lane.title} ({about})"))
        out.append(_meta("thread_sort_index", REQUESTS_PID, tid, sort_index=tid))
        # parents before children at equal start: longer first (the format nests X events by containment)
        for seg in sorted(lane.segments, key=lambda s: (s.start_ns, -(s.end_ns - s.start_ns))):
            out.append(_complete(seg, REQUESTS_PID, tid, "request"))
    steps: dict[int, tuple[int, Segment]] = {}
    for tid, lane in enumerate(t.engines, 1):
        out.append(_meta("thread_name", ENGINE_PID, tid, lane.subtitle))
        for seg in lane.segments:
            out.append(_complete(seg, ENGINE_PID, tid, "engine_step"))
            if seg.step_id is not None:
                steps[seg.step_id] = (tid, seg)
    out.extend(_flows(t, steps))
    return out


def _flows(t: Timeline, steps: dict[int, tuple[int, Segment]]) -> list[dict[str, Any]]:
    """An arrow from each prefill chunk or stall to the engine step that ran it (flow events: "s" binds to
    the slice enclosing its ts on the request's thread, "f" with bp "e" to the step's slice)."""
    out: list[dict[str, Any]] = []
    flow = 0
    for tid, lane in enumerate(t.requests, 1):
        for seg in lane.segments:
            if seg.kind not in ("chunk", "stall") or seg.step_id not in steps:
                continue
            engine_tid, step = steps[seg.step_id]
            flow += 1
            inside = (seg.start_ns + seg.end_ns) // 2
            out.append({"name": "engine step", "cat": "step_link", "ph": "s", "id": flow, "ts": _us(inside),
                        "pid": REQUESTS_PID, "tid": tid})
            out.append({"name": "engine step", "cat": "step_link", "ph": "f", "bp": "e", "id": flow,
                        "ts": _us((step.start_ns + step.end_ns) // 2), "pid": ENGINE_PID, "tid": engine_tid})
    return out


def dumps(t: Timeline) -> str:
    return json.dumps({"traceEvents": events(t), "displayTimeUnit": "ms",
                       "otherData": {"producer": "otel-llm report"}}, separators=(",", ":"))


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _complete(seg: Segment, pid: int, tid: int, cat: str) -> dict[str, Any]:
    args = {k: v for k, v in seg.args.items() if v is not None}
    if seg.step_id is not None:
        args["engine_step_id"] = seg.step_id
    return {"name": seg.label, "cat": f"{cat},{seg.kind}", "ph": "X", "ts": _us(seg.start_ns),
            "dur": _us(seg.end_ns - seg.start_ns), "pid": pid, "tid": tid, "args": args}


def _meta(name: str, pid: int, tid: int, value: str | None = None, sort_index: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"name": value} if value is not None else {"sort_index": sort_index}
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
