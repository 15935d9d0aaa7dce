"""Compact per-request and per-engine-step records: the only thing the hot path touches.

Engine stamps stay on the engine's monotonic clock (``float`` seconds) until a request
finishes; ``clock.py`` converts them once. Appending a token stamp is one list append.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, SpanKind

QUEUED, SCHEDULED, PREEMPTED = 1, 2, 3  # vLLM's EngineCoreEventType values (fenced: tests/test_vllm_fences.py)

# Why the head of the engine's waiting queue was not admitted in a step (StepRecord.queue_blocked),
# decided by the adapter where the scheduler's state is exact (see diagnosis/verdict.py).
BLOCKED_NONE, BLOCKED_MAX_SEQS, BLOCKED_KV_CACHE, BLOCKED_TOKEN_BUDGET, BLOCKED_OTHER = 0, 1, 2, 3, 4
BLOCKED_NAMES = ("none", "max_seqs", "kv_cache", "token_budget", "other")  # llm.engine.step.queue_blocked


@dataclass(slots=True)
class PrefillChunk:
    step_id: int
    start: float  # engine monotonic
    end: float
    tokens: int


@dataclass(slots=True)
class RequestTimeline:
    request_id: str
    arrival: float  # wall clock, seconds since the epoch
    model: str | None = None
    operation: str = "text_completion"
    provider: str | None = None
    kind: SpanKind = SpanKind.INTERNAL
    parent: Context | None = None
    response_id: str | None = None
    request_attributes: dict[str, Any] = field(default_factory=dict)
    input_tokens: int | None = None
    # hot path: engine monotonic stamps
    events: list[tuple[int, float]] = field(default_factory=list)
    token_ts: list[float] = field(default_factory=list)
    multi_token_steps: dict[int, int] | None = None  # index in token_ts -> tokens, only when > 1 (spec decode)
    steps: list[int] = field(default_factory=list)
    chunks: list[PrefillChunk] = field(default_factory=list)
    # filled at finish
    finish_reason: str | None = None
    error_type: str | None = None
    output_text: str | None = None
    prompt_text: str | None = None
    native: Any = None  # the engine's own per-request object, held until finish
    # parallel sampling (n > 1): the user request this sequence is one choice of, and its index there
    group: "RequestGroup | None" = None
    choice_index: int | None = None

    def add_tokens(self, ts: float, count: int) -> None:
        if count > 1:
            if self.multi_token_steps is None:
                self.multi_token_steps = {}
            self.multi_token_steps[len(self.token_ts)] = count
        self.token_ts.append(ts)

    def tokens_at(self, index: int) -> int:
        if self.multi_token_steps is None:
            return 1
        return self.multi_token_steps.get(index, 1)

    def first(self, kind: int) -> float | None:
        for k, ts in self.events:
            if k == kind:
                return ts
        return None

    def first_scheduled(self) -> float | None:
        """The engine's SCHEDULED event, else the start of the first step that computed its prompt."""
        ts = self.first(SCHEDULED)
        if ts is None and self.chunks:
            return self.chunks[0].start
        return ts

    def preemptions(self) -> list[tuple[float, float | None]]:
        """(preempted, rescheduled) pairs; rescheduled is None if it never came back."""
        out: list[tuple[float, float | None]] = []
        pending: float | None = None
        for k, ts in self.events:
            if k == PREEMPTED:
                if pending is not None:
                    out.append((pending, None))
                pending = ts
            elif k == SCHEDULED and pending is not None:
                out.append((pending, ts))
                pending = None
        if pending is not None:
            out.append((pending, None))
        return out


@dataclass(slots=True)
class RequestGroup:
    """The n sequences (choices) of one user request that asked for n > 1 (parallel sampling).

    The engine runs each sequence as a request of its own; the pipeline holds the finished ones
    here until the last one finished, then decides once for the user request and builds one trace
    (core/spans.py: a request span over one ``llm.choice`` span per sequence)."""

    group_id: str  # the engine's id of the user request (vLLM: the ParentRequest's internal id)
    choice_count: int  # n, as the user asked
    expected: int  # sequences the pipeline tracks (n, less those refused over max_requests)
    finished: list[tuple[RequestTimeline, Any]] = field(default_factory=list)  # (timeline, RequestSummary)

    @property
    def complete(self) -> bool:
        return len(self.finished) >= self.expected


class RequestShare(NamedTuple):
    """One request's part in an engine step (a plain tuple on the wire: no object per share)."""

    request_id: str
    tokens: int
    prefill: bool


@dataclass(slots=True)
class StepRecord:
    step_id: int
    start: float  # engine monotonic: the scheduler was entered
    end: float  # engine monotonic: the step's outputs were built
    requests: list[tuple[str, int, bool]]  # RequestShare-shaped: (request_id, tokens, prefill)
    running: int = 0
    waiting: int = 0
    preempted: int = 0
    kv_cache_usage: float | None = None
    # engine-specific facts for the span (e.g. TensorRT-LLM's iteration latency), set once at record time
    attributes: dict[str, Any] | None = None
    queue_blocked: int = BLOCKED_NONE  # why waiting requests stayed waiting (BLOCKED_*); NONE: nothing waited
    # settlement: requests still running, and the kept request spans to link to
    pending: int = 0
    links: list[SpanContext] = field(default_factory=list)
    # anatomy (seconds; None where the engine did not say): see core/diagnosis/anatomy.py
    schedule_s: float | None = None  # inside the scheduler
    execute_s: float | None = None  # scheduled -> outputs handed back (the executor: forward, sampling, IPC)
    output_s: float | None = None  # processing the model's output into the step's outputs
    idle_s: float | None = None  # before the step: no step in flight since the previous one ended
    model_s: float | None = None  # forward + sampling measured in the worker (CUDA events on GPU)
    # composition for the roofline: tokens already in the KV cache before the step, per share
    # (parallel to ``requests``); a prefill chunk covers positions context .. context + tokens - 1
    contexts: list[int] | None = None

    @property
    def prefill_requests(self) -> int:
        return sum(map(_prefill_of, self.requests))

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n, prefill in self.requests if prefill)

    @property
    def decode_requests(self) -> int:
        return len(self.requests) - self.prefill_requests

    @property
    def decode_tokens(self) -> int:
        return sum(n for _, n, prefill in self.requests if not prefill)

    @property
    def phase(self) -> str:
        # per step on the materializer thread (step metrics): the flags are read in C, not a generator
        flags = list(map(_prefill_of, self.requests))
        has_prefill = any(flags)
        has_decode = not all(flags)
        if has_prefill and has_decode:
            return "mixed"
        return "prefill" if has_prefill else "decode"


_prefill_of = itemgetter(2)  # a share's prefill flag
