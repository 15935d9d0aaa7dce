"""Compact per-request and per-engine-step records: the only thing the hot path touches.

Engine stamps stay on the engine's monotonic clock (``float`` seconds) until a request
finishes; ``clock.py`` converts them once. Appending a token stamp is one list append.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Sequence

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, SpanKind

from ..semconv import REQUEST_MODEL

QUEUED, SCHEDULED, PREEMPTED = 1, 2, 3  # vLLM's EngineCoreEventType values (fenced: tests/vllm/test_vllm_fences.py)

# Why the head of the engine's waiting queue was not admitted in a step (StepRecord.queue_blocked),
# decided by the adapter where the scheduler's state is exact (see diagnosis/verdict.py).
BLOCKED_NONE, BLOCKED_MAX_SEQS, BLOCKED_KV_CACHE, BLOCKED_TOKEN_BUDGET, BLOCKED_OTHER = 0, 1, 2, 3, 4
# STRUCTURED_OUTPUT: no limit stopped admission, and requests stayed waiting for their structured-output grammar
BLOCKED_STRUCTURED_OUTPUT = 5
BLOCKED_NAMES = ("none", "max_seqs", "kv_cache", "token_budget", "other",
                 "structured_output")  # llm.engine.step.queue_blocked


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
    # stamp-free frontend (token times from steps): the hot path stamps nothing; at finish the adapter sets what
    # vLLM counted (core/step_tokens.TokenWindow) and the pipeline fills token_ts from the steps that served it
    steps_give_tokens: bool = False
    token_window: Any = None
    # speculative decoding as the scheduler counted it: [verify steps, draft tokens, accepted drafts], added
    # by the pipeline from each step's SpecStep (core/spec_decode.py); None: no step verified drafts of it
    spec: list[int] | None = None
    lora_name: str | None = None  # the LoRA adapter that served it (vLLM's LoRARequest), None: the base model
    lora_id: int | None = None
    # cache-read prompt tokens by source, where the engine reports them: (local prefix cache, KV connector)
    cache_sources: tuple[int, int] | None = None
    # the engine steps that served it (ids, in order): filled at finish by the pipeline, for the requests
    # whose verdict needs them (core/pipeline.py: steps are linked lazily, not per token)
    steps: list[int] = field(default_factory=list)
    steps_from: int = 0  # the pipeline's step sequence number when it started: its steps come at or after
    steps_lost: bool = False  # a held step that served it was evicted (max_steps) before it finished
    # the held steps that served it, where its finish joined them already (an agent whose engine is its
    # requests' source: Pipeline.steps_of); the pipeline reads these, not the held steps again
    served: list[Any] | None = None
    chunks: list[PrefillChunk] = field(default_factory=list)
    # filled at finish
    handoff: Any = None  # its KV hand-off (core/handoff.KVHandoff), where a KV connector moved its cache
    # when a Python frontend received its first and its last output (wall clock: vLLM's iteration_timestamp of
    # those output batches, where its TTFT and e2e end); None where no Python frontend saw the outputs (the
    # Rust frontend, headless engines): the verdict then leaves the output side alone
    first_output: float | None = None
    last_output: float | None = None
    finish_reason: str | None = None
    error_type: str | None = None
    output_text: str | None = None
    prompt_text: str | None = None
    native: Any = None  # the engine's own per-request object, held until finish
    # parallel sampling (n > 1): the user request this sequence is one choice of, and its index there
    group: "RequestGroup | None" = None
    choice_index: int | None = None

    @property
    def served_model(self) -> str | None:
        """What served it (``gen_ai.response.model``): its LoRA adapter, else the served model name."""
        return self.lora_name or self.model

    @property
    def requested_model(self) -> str | None:
        """What the client asked for (``gen_ai.request.model``, the span name's and the metrics' model): the API
        request's ``model`` where the frontend read it (an alias, an adapter), else what served it."""
        asked = self.request_attributes.get(REQUEST_MODEL)
        return asked if isinstance(asked, str) and asked else self.served_model

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


_NO_LINKS: tuple = ()


class StepWorkerFacts(NamedTuple):
    """What the model runner's process saw in a step (instrumentation/vllm/worker_facts.py): the LoRA adapters
    loaded into and evicted from its cache (``core.lora.LoRAEvent``), and the drafter's time (None: not run)."""

    lora_events: tuple = ()
    draft_s: float | None = None


class StepGrammar(NamedTuple):
    """A step's structured-output facts (instrumentation/vllm/grammar.py): the seconds the engine spent computing
    the grammar bitmask of its structured requests (None: it computed none), how many requests that mask
    covered, and the shares first scheduled in this step whose grammar was reused from the backend's cache
    (``hit_at``) or compiled anew (``miss_at``), as indices into the step's shares."""

    seconds: float | None = None
    requests: int = 0
    hit_at: Sequence[int] = ()
    miss_at: Sequence[int] = ()


class StepRecord:
    """One engine step. The shares are kept as parallel lists, not a tuple per scheduled request: a step
    of a batch of 64 is a few objects for the collector to track instead of 64 more (the frontend holds
    thousands of steps), and the pipeline reads the ids as one list (core/pipeline.py links requests
    to their steps lazily, at finish, and only for the requests whose verdict or spans need them).

    ``ids``: the scheduled requests' ids; ``tokens``: tokens scheduled per share, ``None`` when each
    share is one token (a plain decode batch); ``prefill_at``: indices of the shares that compute prompt
    tokens (ascending). ``requests`` gives the (request_id, tokens, prefill) tuples, built on demand,
    and accepts them (adapters that build shares one by one, tests)."""

    __slots__ = ("step_id", "start", "end", "ids", "tokens", "prefill_at", "running", "waiting", "preempted",
                 "kv_cache_usage", "attributes", "queue_blocked", "seq", "links", "schedule_s", "execute_s",
                 "output_s", "idle_s", "model_s", "contexts", "members", "spec", "loras", "worker", "grammar")

    def __init__(self, step_id: int, start: float, end: float, requests: Iterable[tuple[str, int, bool]] = (),
                 running: int = 0, waiting: int = 0, preempted: int = 0, kv_cache_usage: float | None = None,
                 attributes: dict[str, Any] | None = None, queue_blocked: int = BLOCKED_NONE,
                 links: list[SpanContext] | None = None, schedule_s: float | None = None,
                 execute_s: float | None = None, output_s: float | None = None, idle_s: float | None = None,
                 model_s: float | None = None, contexts: list[int] | None = None) -> None:
        self.step_id = step_id
        self.start = start  # engine monotonic: the scheduler was entered
        self.end = end  # engine monotonic: the step's outputs were built
        self.requests = requests  # -> ids, tokens, prefill_at
        self.running = running
        self.waiting = waiting
        self.preempted = preempted
        self.kv_cache_usage = kv_cache_usage
        # engine-specific facts for the span (e.g. TensorRT-LLM's iteration latency), set once at record time
        self.attributes = attributes
        self.queue_blocked = queue_blocked  # why waiting requests stayed waiting (BLOCKED_*); NONE: nothing waited
        # settlement: the order the pipeline held it in, and the kept request spans to link to
        self.seq = 0
        # () until a kept span links to it (most steps never are: no list to allocate, hold and collect)
        self.links: list[SpanContext] | tuple = _NO_LINKS if links is None else links
        # anatomy (seconds; None where the engine did not say): see core/diagnosis/anatomy.py
        self.schedule_s = schedule_s  # inside the scheduler
        self.execute_s = execute_s  # scheduled -> outputs handed back (the executor: forward, sampling, IPC)
        self.output_s = output_s  # processing the model's output into the step's outputs
        self.idle_s = idle_s  # before the step: no step in flight since the previous one ended
        self.model_s = model_s  # forward + sampling measured in the worker (CUDA events on GPU)
        # composition for the roofline: tokens already in the KV cache before the step, per share
        # (parallel to ``ids``); a prefill chunk covers positions context .. context + tokens - 1
        self.contexts = contexts
        self.members: frozenset[str] | set[str] | None = None  # set(ids), built when a lookup needs it
        # speculative decoding: the shares that verified drafts, with their counts (core/spec_decode.py)
        self.spec: Any = None  # SpecStep | None
        # the LoRA adapters (integer ids) the step ran, where the engine serves adapters; None: none
        self.loras: tuple[int, ...] | None = None
        # what the model runner's process saw (LoRA adapter loads and evictions, the drafter's time):
        # instrumentation/vllm/worker_facts.StepWorkerFacts, None where nothing happened
        self.worker: Any = None
        # structured outputs: the grammar bitmask's time, grammars compiled or reused (StepGrammar); None: none
        self.grammar: StepGrammar | None = None

    @classmethod
    def of_lists(cls, step_id: int, start: float, end: float, ids: list[str], tokens: Sequence[int] | None,
                 prefill_at: Sequence[int], running: int = 0, waiting: int = 0, preempted: int = 0,
                 kv_cache_usage: float | None = None, queue_blocked: int = BLOCKED_NONE) -> "StepRecord":
        """A record from the parallel lists as they arrive (no tuple per share; once per step on the
        engine's output thread, so the slots are set here directly)."""
        step = cls.__new__(cls)
        step.step_id, step.start, step.end = step_id, start, end
        step.ids, step.tokens, step.prefill_at = ids, tokens, prefill_at
        step.running, step.waiting, step.preempted, step.kv_cache_usage = running, waiting, preempted, kv_cache_usage
        step.attributes, step.queue_blocked, step.seq, step.links = None, queue_blocked, 0, _NO_LINKS
        step.schedule_s = step.execute_s = step.output_s = step.idle_s = step.model_s = None
        step.contexts = step.members = step.spec = step.loras = step.worker = step.grammar = None
        return step

    @property
    def requests(self) -> list[tuple[str, int, bool]]:
        """(request_id, tokens, prefill) per share (RequestShare-shaped), built on each call."""
        n = len(self.ids)
        flags = [False] * n
        for i in self.prefill_at:
            flags[i] = True
        return list(zip(self.ids, self.tokens if self.tokens is not None else [1] * n, flags))

    @requests.setter
    def requests(self, shares: Iterable[tuple[str, int, bool]]) -> None:
        shares = list(shares)
        self.ids = [s[0] for s in shares]
        tokens = [s[1] for s in shares]
        self.tokens = None if all(n == 1 for n in tokens) else tokens
        self.prefill_at = [i for i, s in enumerate(shares) if s[2]]
        self.members = None

    @property
    def prefill_requests(self) -> int:
        return len(self.prefill_at)

    @property
    def prefill_tokens(self) -> int:
        if self.tokens is None:
            return len(self.prefill_at)
        return sum(map(self.tokens.__getitem__, self.prefill_at))

    @property
    def decode_requests(self) -> int:
        return len(self.ids) - len(self.prefill_at)

    @property
    def decode_tokens(self) -> int:
        total = len(self.ids) if self.tokens is None else sum(self.tokens)
        return total - self.prefill_tokens

    @property
    def phase(self) -> str:
        prefill = len(self.prefill_at)
        if prefill and prefill < len(self.ids):
            return "mixed"
        return "prefill" if prefill else "decode"

    def member_ids(self) -> frozenset[str] | set[str]:
        """The ids as a set (built once a step; the pipeline shares it between steps of one batch)."""
        found = self.members
        if found is None:
            found = self.members = set(self.ids)
        return found

    def __repr__(self) -> str:
        return f"StepRecord({self.step_id}, {self.start}, {self.end}, {self.requests!r})"
