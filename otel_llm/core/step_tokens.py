"""A request's token times from the engine steps that served it, instead of a stamp per token.

vLLM stamps each batch of outputs with the EngineCore's ``EngineCoreOutputs.timestamp``; its own
inter-token latency is the difference of those stamps (``engine_core_timestamp - last_token_ts``).
The step records carry that exact stamp as their ``end`` (step hooks: copied from the outputs) and
name every request a step served, so a request's token times are the ``end``s of the steps in which
its share produced an output:

* a decode share: one output (one token; speculative decoding, which can produce several, keeps the
  frontend's stamps: the adapter does not ask for this);
* a prefill share: an output only when its chunk completes what the request must compute, ``context
  + tokens >= prompt + outputs so far`` (a recompute after a preemption included: it recomputes the
  outputs it had too).

Only steps within vLLM's own first and last token stamps count (``RequestStateStats.first_token_ts``,
``last_token_ts``): steps scheduled after the frontend let the request go (a stop string the
detokenizer found, async scheduling's step in flight) produced no output it saw. The count must equal
vLLM's ``num_generation_tokens``; a request whose steps do not add up (a step record lost or
overwritten) gets no token times, and the caller counts it.

Where the engine process is the requests' source (agent/engine_requests.py) there are no frontend stamps to
bound them: ``output_times`` places the first ``outputs`` (the engine's count; async scheduling may schedule
one step past the finish) by the same rule, once, when the request finishes; its first and last are the
request's first and last token stamps, and the list its token times.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .timeline import StepRecord


class TokenWindow(NamedTuple):
    """What the adapter knows of a request at finish, for deriving its token times from steps."""

    first: float  # vLLM's first_token_ts (engine monotonic: the first output's batch stamp)
    last: float  # vLLM's last_token_ts
    tokens: int  # vLLM's num_generation_tokens (one a step: no speculative decoding)
    prompt: int  # prompt tokens


class OutputTimes(NamedTuple):
    """A request's outputs placed on the steps that served it (``output_times``)."""

    times: list[float]  # the end of each step in which its share produced an output (at most ``outputs``)
    cached: int | None  # the context of its first step's prefill share: the prompt tokens it did not compute


def output_times(rid: str, steps: Sequence[StepRecord], prompt: int, outputs: int) -> OutputTimes:
    """The ``end`` of each of ``steps`` (ascending, those that served ``rid``) in which its share produced an
    output, the first ``outputs`` of them; and the prompt tokens its first step found cached (None: the first
    step computed no prompt chunk of it, or the step says no contexts). Every step's end is taken at once
    (a request's steps are mostly decodes, an output each), then the steps with prompt chunks, fewer, are
    read, and those in which its own chunk left prompt (or recomputed outputs) to compute are taken out."""
    ends = [step.end for step in steps]
    cached = None
    skipped = 0
    for k in [k for k, step in enumerate(steps) if step.prefill_at]:  # the steps that computed prompt chunks
        n = k - skipped  # its outputs before this step
        if n >= outputs:
            break
        step = steps[k]
        ids = step.ids
        for i in step.prefill_at:
            if ids[i] == rid:  # ours: does it complete?
                contexts = step.contexts
                if contexts is not None:
                    if not k:
                        cached = contexts[i]
                    if contexts[i] + (step.tokens[i] if step.tokens is not None else 1) < prompt + n:
                        del ends[n]  # a chunk that leaves prompt (or recomputed outputs) to compute: no output
                        skipped += 1
                break
    del ends[outputs:]
    return OutputTimes(ends, cached)


def token_times(rid: str, steps: Sequence[StepRecord], window: TokenWindow) -> list[float] | None:
    """The ``end`` of each step of ``steps`` (ascending, those that served ``rid``) in which it produced
    an output; None when they do not add up to vLLM's count."""
    first, last, prompt = window.first, window.last, window.prompt
    out: list[float] = []
    append = out.append
    for step in steps:
        end = step.end
        if end < first:
            continue
        if end > last:
            break
        prefill_at = step.prefill_at
        if prefill_at:  # a step with prompt chunks (few): is ours one (its few shares read, not the batch's ids)?
            ids = step.ids
            chunk_only = False
            for i in prefill_at:
                if ids[i] == rid:  # ours: does it complete?
                    n = step.tokens[i] if step.tokens is not None else 1
                    contexts = step.contexts
                    # a chunk that leaves prompt (or recomputed outputs) to compute: no output
                    chunk_only = contexts is not None and contexts[i] + n < prompt + len(out)
                    break
            if chunk_only:
                continue
        append(end)
    if len(out) != window.tokens or not out or out[0] != first:
        return None
    return out
