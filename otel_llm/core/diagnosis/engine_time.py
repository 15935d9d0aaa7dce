"""Engine time per request, and the delay a request's prompt caused others: pure functions over step records.

**Engine time** (``llm.request.engine_time``). Each engine step's time is split across the requests it served
by their share of the step's work, and a request's engine time is the sum over the steps that served it:

* a step's time is its *busy* time: from when it began, or when the engine's previous step ended if later,
  to when its outputs were built (``busy``; the pipeline keeps it beside each step it holds). Steps that overlap (asynchronous scheduling on a GPU schedules
  step N+1 while N runs) are so counted once: the busy times of an engine sum to the time it had a step in
  flight, never more than the wall-clock time;
* a request's share of a step is its predicted time over the step's (``work_shares``): with the model's shape
  and the device's peaks (the roofline, core/diagnosis/roofline.py), a share's time is
  ``max(FLOPs / peak FLOP/s, bytes / peak B/s)`` of its own tokens and KV reads, the step's weight reads
  split evenly among its requests (every request of a step needs the weights once); without them, its
  tokens scheduled in the step over the step's tokens.

So over every request that finished, engine times add up to the engines' busy time, and two requests that
ran in the same steps with the same work get the same engine time. Multiply by a device-hour price (the
devices one step spans, times the price, over 3600) for its cost in money: see docs/verdict.md.

**Interference caused** (``llm.request.interference_caused``). In a step that computed prompt tokens, every
decoding request lost what the slow-cause verdict charges it there: the step's duration minus the median
decode-only step of the same decode batch size (core/diagnosis/verdict.py, ``prefill_interference``). The
step's total, that loss times its decoding requests, is shared among the requests whose prefill ran in the
step by their prefill tokens; a request's interference caused is its part, summed over its prefill chunks.
"""

from __future__ import annotations

from typing import Any, Sequence

from .roofline import DevicePeaks, ModelShape, step_cost
from .verdict import CONTEXT_STEPS, StepWindow, _Baselines


def busy(start: float, end: float, previous_end: float | None) -> float:
    """A step's time not already counted for the engine's previous step (asynchronous overlap)."""
    begin = start if previous_end is None or previous_end < start else previous_end
    return end - begin if end > begin else 0.0


def work_shares(tokens: Sequence[int] | None, n: int, contexts: Sequence[int] | None = None,
                shape: ModelShape | None = None, peaks: DevicePeaks | None = None) -> list[float]:
    """Each of a step's ``n`` shares' part of its work, summing to 1 (``tokens``: per share, ``None``: one
    each; ``contexts``: tokens already in each share's KV cache, for the roofline)."""
    if n <= 0:
        return []
    counts = list(tokens) if tokens is not None else [1] * n
    if shape is not None and peaks is not None and contexts is not None and len(contexts) == n:
        weights = step_cost(shape, ()).bytes  # the weights (and LM head) a step reads once, whoever it serves
        times = []
        for k, c in zip(counts, contexts):
            cost = step_cost(shape, ((k, c),))
            own_bytes = max(0.0, cost.bytes - weights) + weights / n
            times.append(max(cost.flops / peaks.flops, own_bytes / peaks.bandwidth))
        total = sum(times)
        if total > 0:
            return [t / total for t in times]
    total_tokens = sum(counts)
    if total_tokens <= 0:
        return [1.0 / n] * n
    return [k / total_tokens for k in counts]


def engine_time(request_id: str, steps: Sequence[Any], busy_times: Sequence[float | None] | None = None,
                shape: ModelShape | None = None, peaks: DevicePeaks | None = None) -> float:
    """A request's engine seconds over ``steps`` (records that served it); ``busy_times``: each step's busy
    time where the pipeline saw its engine's previous step (``busy``), else (``None``) its whole duration."""
    total = 0.0
    for k, step in enumerate(steps):
        ids = step.ids
        try:
            i = ids.index(request_id)
        except ValueError:
            continue
        seconds = busy_times[k] if busy_times is not None else None
        if seconds is None:
            seconds = max(0.0, step.end - step.start)
        if len(ids) == 1:
            total += seconds
            continue
        total += seconds * work_shares(step.tokens, len(ids), step.contexts, shape, peaks)[i]
    return total


def interference_caused(chunks: Sequence[Any], window: StepWindow) -> float:
    """Seconds of prefill interference a request's prompt cost the requests decoding beside it: ``chunks``
    are its prefill chunks (``PrefillChunk``: step id and tokens), ``window`` the engine's recent steps."""
    if not chunks:
        return 0.0
    first, last = chunks[0].step_id, chunks[-1].step_id
    steps = window.around(first, last, float("inf"), CONTEXT_STEPS)
    by_id = {s.step_id: s for s in steps}
    base = None
    total = 0.0
    for chunk in chunks:
        s = by_id.get(chunk.step_id)
        if s is None or not s.decode_requests or not s.prefill_tokens:
            continue
        if base is None:
            base = _Baselines(steps)
        usual = base.decode(s.decode_requests)
        if usual is None:  # no decode-only step of that batch size to compare with: nothing to charge
            continue
        lost = (s.duration - usual) * s.decode_requests
        if lost > 0:
            total += lost * min(1.0, chunk.tokens / s.prefill_tokens)
    return total
