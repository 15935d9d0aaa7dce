"""What the model runner's process knows of a step and the scheduler does not: LoRA adapters loaded into and
evicted from the worker's adapter cache (with the load time), and the drafter's time.

Where it happens (vLLM 0.32, read in its source): the model runner's ``execute_model`` prepares the step's
inputs and, where the engine serves LoRA, calls ``set_active_loras`` -> ``LRUCacheWorkerLoRAManager
.set_active_adapters`` -> ``add_adapter`` for each adapter of the batch. ``add_adapter`` reads an adapter
that is not in the worker's cache from disk (``_load_adapter``), evicts the least recently used one when the
cache (``max_cpu_loras``) is full, and copies it into a slot. So a load is an ``add_adapter`` call in which
``_load_adapter`` ran; its time is that whole call (read, cache insert, slot copy); an eviction is an adapter
that was cached before the load and is not after it, or one ``remove_adapter`` dropped (``LLM.remove_lora``).
The warm-up's dummy adapters are added without ``_load_adapter`` and are not counted.

The drafter runs in ``sample_tokens``, in ``GPUModelRunner.propose_draft_token_ids`` (EAGLE, MTP, a draft
model: their forward passes; n-gram: its lookup on the CPU); its time is that call's (CUDA events on a GPU,
wall time on CPU). It proposes the drafts the next step verifies.

The facts wait here until the step's ``ModelRunnerOutput`` leaves the model runner: model_timing.ModelTimer
hangs them on it (``WORKER_FACTS_ATTR``: ``plain``, the facts by name with a version, built-in values only:
they travel inside vLLM's output to the EngineCore, which reads them back with ``read_plain``), or,
where the model runner runs in the EngineCore's own thread, the step hooks take them directly. Work in a
step without a load: one clock read around each ``add_adapter`` call (one per adapter of the batch).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ...core.lora import LORA_EVICTED, LORA_LOADED, LoRAEvent
from ...core.timeline import StepWorkerFacts
from ...guard import Guard
from ..wraps import Target, WrapTable

WORKER_FACTS_ATTR = "_otel_llm_worker_facts"
VERSION = 1  # of ``plain``: bumped when a field's meaning changes or a field goes (a reader refuses newer ones)
_EVENT_FIELDS = LoRAEvent._fields
_EVENT_TYPES = (int, int, (int, float), (int, float))  # LoRAEvent's fields, in its order
MAX_EVENTS = 256  # held between two outputs at most (loads outside steps that no step takes: bounded)

_LORA_MODULE = "vllm.lora.worker_manager"
_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"


class WorkerFacts:
    """The worker-side hooks of one owner (its ``ModelTimer``) and the facts they keep until ``take``."""

    __slots__ = ("pending", "events", "draft_s", "draft_events", "clock", "_before", "_table", "guard")

    def __init__(self, guard: Guard | None = None) -> None:
        self.guard = guard if guard is not None else Guard()  # its owner's (alone, as in tests: its own)
        self.pending = False  # something to take (read once per output by the model timer)
        self.events: list[LoRAEvent] = []
        self.draft_s: float | None = None
        self.draft_events: list[Any] = []  # CUDA (begin, end) pairs of this step's proposals
        self.clock: Callable[[], float] = time.monotonic
        self._before: set[int] | None = None  # the cached adapters when a load began
        self._table = WrapTable([
            # plain: add_adapter runs for each adapter of every LoRA batch (wraps.Target)
            Target(_LORA_MODULE, "LRUCacheWorkerLoRAManager.add_adapter", self.add_adapter, plain=True),
            Target(_LORA_MODULE, "WorkerLoRAManager._load_adapter", self.load_adapter, plain=True),
            Target(_LORA_MODULE, "WorkerLoRAManager.remove_adapter", self.remove_adapter, plain=True),
            Target(_RUNNER_MODULE, "GPUModelRunner.propose_draft_token_ids", self.propose, plain=True),
        ], self.guard)

    def arm(self) -> None:
        self._table.wrap()

    def disarm(self) -> None:
        self._table.unwrap()
        self.take()

    def take(self) -> StepWorkerFacts | None:
        """The facts gathered since the last take (None: nothing happened)."""
        if not self.pending:
            return None
        self.pending = False
        events, self.events = self.events, []
        draft, self.draft_s = self.draft_s, None
        if self.draft_events:
            draft = _cuda_seconds(self.draft_events)
            self.draft_events = []
        return StepWorkerFacts(tuple(events), draft)

    def take_plain(self) -> dict[str, Any] | None:
        """``take`` as ``plain``, for the output that travels to the EngineCore."""
        facts = self.take()
        return plain(facts) if facts is not None else None

    # -- LoRA adapters -------------------------------------------------------------------------

    def add_adapter(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        self._before = None
        clock = self.clock
        start = clock()
        out = wrapped(*args, **kwargs)
        before = self._before
        if before is not None:  # _load_adapter ran in this call: a load
            self._before = None
            try:
                spent = clock() - start
                request = args[0] if args else kwargs.get("lora_request")
                after = instance.list_adapters()
                for gone in sorted(before - after):
                    self._event(LORA_EVICTED, gone, start, 0.0)
                self._event(LORA_LOADED, request.lora_int_id, start, spent)
            except Exception as exc:
                self.guard.failed("lora adapter load hook", exc)
        return out

    def load_adapter(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        try:
            self._before = set(instance.list_adapters())  # what a load may evict from
        except Exception as exc:
            self.guard.failed("lora adapter load hook", exc)
        return wrapped(*args, **kwargs)

    def remove_adapter(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        start = self.clock()
        out = wrapped(*args, **kwargs)
        try:
            if out:
                self._event(LORA_EVICTED, int(args[0] if args else kwargs.get("adapter_id")), start, 0.0)
        except Exception as exc:
            self.guard.failed("lora adapter remove hook", exc)
        return out

    def _event(self, kind: int, lora_id: int, at: float, seconds: float) -> None:
        if len(self.events) >= MAX_EVENTS:
            del self.events[:MAX_EVENTS // 2]
        self.events.append(LoRAEvent(kind, lora_id, at, seconds))
        self.pending = True

    # -- the drafter ----------------------------------------------------------------------------

    def propose(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        device = getattr(instance, "device", None)
        if getattr(device, "type", None) == "cuda":
            return self._propose_cuda(wrapped, args, kwargs)
        clock = self.clock
        start = clock()
        try:
            return wrapped(*args, **kwargs)
        finally:
            spent = clock() - start
            self.draft_s = spent + (self.draft_s or 0.0)
            self.pending = True

    def _propose_cuda(self, wrapped: Any, args: tuple, kwargs: dict) -> Any:
        """Events on the current stream around the proposal: its device time, read when the facts are taken
        (after the step's sampled tokens reached the host), never waited for."""
        try:
            import torch
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
        except Exception as exc:
            self.guard.failed("drafter timer", exc)
            return wrapped(*args, **kwargs)
        try:
            return wrapped(*args, **kwargs)
        finally:
            try:
                finish = torch.cuda.Event(enable_timing=True)
                finish.record()
                self.draft_events.append((begin, finish))
                self.pending = True
            except Exception as exc:
                self.guard.failed("drafter timer", exc)


def _cuda_seconds(pairs: list) -> float | None:
    total = 0.0
    for begin, finish in pairs:
        if not finish.query():  # not done yet: report nothing rather than wait
            return None
        total += begin.elapsed_time(finish) / 1e3
    return total


def plain(facts: StepWorkerFacts) -> dict[str, Any]:
    """The facts by ``StepWorkerFacts``' field names (each LoRA event by ``LoRAEvent``'s), with ``VERSION``:
    built-in values only, read back by name (``read_plain``)."""
    return {"version": VERSION, "lora_events": [dict(zip(_EVENT_FIELDS, e)) for e in facts.lora_events],
            "draft_s": facts.draft_s}


def read_plain(value: Any) -> tuple[tuple, float | None]:
    """``plain``'s value as the step record's (LoRA events as ``LoRAEvent``-shaped tuples, drafter seconds or
    None); ValueError for anything else (another version, a missing field, a value of another type). Fields
    this reader does not know are ignored."""
    if type(value) is not dict:
        raise ValueError(f"worker facts of type {type(value).__name__}")
    version = value.get("version")
    if type(version) is not int or not 1 <= version <= VERSION:
        raise ValueError(f"worker facts version {version!r}, this reader knows up to {VERSION}")
    draft = value.get("draft_s")
    if draft is not None and type(draft) not in (int, float):
        raise ValueError(f"worker facts draft_s: {type(draft).__name__}")
    events = value.get("lora_events", ())
    if type(events) not in (list, tuple) or len(events) > MAX_EVENTS:
        raise ValueError("worker facts lora_events: not a list of at most MAX_EVENTS")
    out = []
    for event in events:
        if type(event) is not dict:
            raise ValueError(f"worker facts LoRA event of type {type(event).__name__}")
        fields = tuple(event.get(name) for name in _EVENT_FIELDS)
        for name, item, accepted in zip(_EVENT_FIELDS, fields, _EVENT_TYPES):
            if type(item) not in (accepted if type(accepted) is tuple else (accepted,)):
                raise ValueError(f"worker facts LoRA event {name}: {type(item).__name__}")
        out.append(fields)
    return tuple(out), draft
