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
decode-only step of the same decode batch size before it (core/diagnosis/verdict.py, ``prefill_loss``, the
baseline of ``prefill_interference``), so what prompts caused equals what their victims were charged. The
step's total, that loss times its decoding requests, is shared among the requests whose prefill ran in the
step by their prefill tokens; a request's interference caused is its part, summed over its prefill chunks.
"""

from __future__ import annotations

import functools
from itertools import repeat
from operator import attrgetter
from typing import Any, Mapping, Sequence

from .roofline import DevicePeaks, ModelShape, step_cost
from .verdict import CONTEXT_STEPS, DECODE_REQUESTS_AT, PREFILL_TOKENS_AT, StepWindow, prefill_loss

_STEP_ID = attrgetter("step_id")


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
        times = _roofline_times(counts, contexts, shape, peaks)
        total = sum(times)
        if total > 0:
            return [t / total for t in times]
    total_tokens = sum(counts)
    if total_tokens <= 0:
        return [1.0 / n] * n
    return [k / total_tokens for k in counts]


def _roofline_times(counts: Sequence[int], contexts: Sequence[int], shape: ModelShape,
                    peaks: DevicePeaks) -> list[float]:
    """Each share's predicted time, ``max(FLOPs / peak FLOP/s, bytes / peak B/s)`` of its own tokens and KV
    reads, the step's weight reads split evenly among its shares. A share's FLOPs and bytes are affine in its
    context for a given token count (``step_cost``), so the roofline's own formula is asked twice per token
    count (``_line``, kept for the process: it depends on the shape and the count only), not once per share."""
    weights = _weights(shape)  # the weights (and LM head) a step reads once, whoever it serves
    shared = weights / len(counts)
    flop_s, byte_s = peaks.flops, peaks.bandwidth
    k = counts[0]
    if len(counts) > 2 and counts.count(k) == len(counts):  # shares of one size (a decode batch: most steps)
        f0, f1, b0, b1 = _line(shape, k)
        lo, hi = min(contexts), max(contexts)
        # bytes-bound at both ends of its contexts, by a margin rounding cannot cross: then at every context
        # between (the two times are affine in it), and each share's time is the loop's own bytes expression
        if b0 + b1 * lo > 0.0 and b0 + b1 * hi > 0.0 and all(
                ((b0 + b1 * c) + shared) / byte_s > (f0 + f1 * c) / flop_s * (1.0 + 1e-9) for c in (lo, hi)):
            return [((b0 + b1 * c) + shared) / byte_s for c in contexts]
    lines: dict[int, tuple[float, float, float, float]] = {}
    times = []
    for k, c in zip(counts, contexts):
        line = lines.get(k)
        if line is None:
            line = lines[k] = _line(shape, k)
        f0, f1, b0, b1 = line
        own_bytes = b0 + b1 * c
        own_bytes = (own_bytes if own_bytes > 0.0 else 0.0) + shared
        flops_time, bytes_time = (f0 + f1 * c) / flop_s, own_bytes / byte_s
        times.append(flops_time if flops_time > bytes_time else bytes_time)
    return times


# A model's step costs depend on its shape and a share's tokens only: worked out once for all steps (a
# process serves a model or a few; token counts are few: 1 for decode, the chunk sizes for prefill).
@functools.lru_cache(maxsize=8)
def _weights(shape: ModelShape) -> float:
    """The bytes a step reads once, whoever it serves (the weights and the LM head)."""
    return step_cost(shape, ()).bytes


@functools.lru_cache(maxsize=1024)
def _line(shape: ModelShape, k: int) -> tuple[float, float, float, float]:
    """A share of ``k`` tokens: its FLOPs at context 0 and per context token, its own bytes (the weights left
    out) the same."""
    at0, at1 = step_cost(shape, ((k, 0),)), step_cost(shape, ((k, 1),))
    return at0.flops, at1.flops - at0.flops, at0.bytes - _weights(shape), at1.bytes - at0.bytes


class StepTime:
    """A held step's busy time (``busy``); its shares' parts of the step's work by request id (``engine_time``)
    and its prefill interference (``interference_caused``) once a request it served asked: worked out once a
    step, not once for each request of its batch. ``shares``: its number of shares, given where each is one
    token (a plain decode batch, and only there): ``even`` is then a share's part of the busy time without
    the roofline (None elsewhere)."""

    __slots__ = ("busy", "parts", "loss", "even")

    def __init__(self, busy: float | None, shares: int | None = None) -> None:
        self.busy = busy
        self.parts: dict[str, float] | None = None
        # what its decoding requests lost to its prompt tokens, and those tokens (``interference_caused``)
        self.loss: tuple[float, int] | None = None
        self.even = busy / shares if busy is not None and shares else None


def engine_time(request_id: str, steps: Sequence[Any],
                busy_times: Sequence[StepTime | float | None] | Mapping[int, StepTime] | None = None,
                shape: ModelShape | None = None, peaks: DevicePeaks | None = None, served: bool = False) -> float:
    """A request's engine seconds over ``steps`` (records that served it); ``busy_times``: each step's busy
    time where the pipeline saw its engine's previous step (``busy``; a ``StepTime``, which also keeps the
    step's split for the other requests it served), else (``None``) its whole duration; in a list parallel
    to ``steps``, or the pipeline's ``StepTime`` by step id (a step it no longer holds: its duration).
    ``served``: every step of ``steps`` is known to have served ``request_id`` (the pipeline's own steps of a
    request): no membership test; otherwise a step it is not in adds nothing.

    Per step O(1) for this request: a plain decode batch without the roofline splits evenly (no lookup; its
    ``StepTime`` keeps the even part); any other step's split among its shares is worked out once and kept
    in its ``StepTime``."""
    total = 0.0
    even = shape is None or peaks is None  # no roofline: a step of one token a share splits evenly
    if isinstance(busy_times, Mapping):
        busy_times = list(map(busy_times.get, map(_STEP_ID, steps)))
    fast = even and served  # a StepTime's even part, where it has one, is then this request's part
    for step, held in zip(steps, busy_times if busy_times is not None else repeat(None)):
        if held.__class__ is StepTime:
            if fast:
                part = held.even
                if part is not None:  # a decode batch (most steps): its even part, worked out once
                    total += part
                    continue
            seconds = held.busy
        else:
            seconds, held = held, None
        if seconds is None:
            seconds = step.end - step.start
            if seconds < 0.0:
                seconds = 0.0
        if even and step.tokens is None:  # a decode batch: no lookup but membership
            if served:
                total += seconds / len(step.ids)
                continue
            members = step.members
            if request_id in (members if members is not None else step.member_ids()):
                total += seconds / len(step.ids)
            continue
        parts = held.parts if held is not None else None
        if parts is None:
            ids = step.ids
            parts = dict(zip(ids, work_shares(step.tokens, len(ids), step.contexts, shape, peaks)))
            if held is not None:
                held.parts = parts
        part = parts.get(request_id)
        if part is not None:
            total += seconds * part
    return total


def interference_caused(chunks: Sequence[Any], window: StepWindow,
                        held: Mapping[int, StepTime] | None = None) -> float:
    """Seconds of prefill interference a request's prompt cost the requests decoding beside it: ``chunks``
    are its prefill chunks (``PrefillChunk``: step id and tokens), ``window`` the engine's recent steps.
    ``held``: the pipeline's ``StepTime`` by step id: a prompt computed in one step (most are) reads the same
    steps as every other prompt of that step, so the step's loss is worked out once and kept there."""
    if not chunks:
        return 0.0
    first, last = chunks[0].step_id, chunks[-1].step_id
    kept = held.get(first) if held is not None and first == last else None
    if kept is not None:
        if kept.loss is None:
            kept.loss = _losses(window, first, last, (first,))[0]
        lost, prefill_tokens = kept.loss
        return lost * min(1.0, chunks[0].tokens / prefill_tokens) if lost > 0 else 0.0
    total = 0.0
    for chunk, (lost, prefill_tokens) in zip(chunks, _losses(window, first, last, [c.step_id for c in chunks])):
        if lost > 0:
            total += lost * min(1.0, chunk.tokens / prefill_tokens)
    return total


def _losses(window: StepWindow, first: int, last: int, step_ids: Sequence[int]) -> list[tuple[float, int]]:
    """Per step of ``step_ids`` (between ``first`` and ``last``), what its decoding requests lost to the prompt
    tokens computed in it, and those tokens: the verdict's ``prefill_interference`` charge per decoding request
    (``prefill_loss``) times its decode batch; (0.0, 0) where nothing is charged."""
    steps = window.around(first, last, float("inf"), CONTEXT_STEPS, facts=False)  # StepFacts' fields by position
    index = {s[0]: i for i, s in enumerate(steps)}
    out = []
    for step_id in step_ids:
        i = index.get(step_id)
        s = steps[i] if i is not None else None
        if s is None or not s[DECODE_REQUESTS_AT] or not s[PREFILL_TOKENS_AT]:
            out.append((0.0, 0))
            continue
        lost = prefill_loss(steps, i)
        if lost is None:  # no decode-only step of that batch size to compare with: nothing to charge
            out.append((0.0, 0))
            continue
        out.append((lost * s[DECODE_REQUESTS_AT], s[PREFILL_TOKENS_AT]))
    return out
