"""vLLM's scheduler hooks: each engine step as the scheduler composed it, as one record for a sink.

Our ``vllm.general_plugins`` entry point (plugin.py) installs them in a spawned EngineCore, the
instrumentor in a process that runs its engine in-process: ``Scheduler.schedule`` (batch composition,
captured at schedule time, as vLLM's maintainers advise for async scheduling) and
``Scheduler.update_from_output`` (the step's end: the same stamp vLLM gives its outputs). The sink is
the frontend's pipeline in-process, a ``step_transport.SocketSink`` in a spawned EngineCore.
"""

from __future__ import annotations

import itertools
import os
import time
from time import perf_counter
from typing import Any, Callable, NamedTuple, Sequence

from ...core.lora import LoRAEvent
from ...core.spec_decode import SpecStep
from ...guard import Guard
from ...core.timeline import (BLOCKED_KV_CACHE, BLOCKED_MAX_SEQS, BLOCKED_NONE, BLOCKED_OTHER,
                               BLOCKED_STRUCTURED_OUTPUT, BLOCKED_TOKEN_BUDGET, StepGrammar, StepRecord,
                               StepWorkerFacts)
from ..wraps import Target, WrapTable
from . import contract, step_wire
from .grammar import GrammarCache
from .step_extras import SpecReaders, active_loras, common_counts, share_positions, spec_counts, worker_facts
from .step_wire import Extras, Shares, StepPayload
from .model_timing import MODEL_TIME_ATTR, ModelTimer
from .worker_facts import WORKER_FACTS_ATTR


# Step anatomy from four stamps the EngineCore thread takes anyway: scheduler entered (t0) and left
# (t1), update_from_output entered (u0), the outputs' own timestamp (end, else u1 = left). Then
#   schedule = t1 - t0, execute = u0 - t1, output = end - u0: they sum to end - t0, the step.
#   idle gap = t0 - the previous step's u1, when no other step was in flight (else 0: with vLLM's
#   batch queue the next batch is scheduled while one runs, and the device was not starved).
# model_s: forward + sampling timed around the model runner where it runs (model_timing.py).

_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
_STRUCTURED_MODULE = "vllm.v1.structured_output"


class Pending(NamedTuple):
    """What ``schedule()`` keeps of a step until its ``update_from_output`` (``StepHooks.pending``): the one
    declaration of that entry. Kept as the plain tuple of these fields, in this order (a literal costs a
    fraction of the NamedTuple's construction on the EngineCore's loop); the C hooks (_hooks_fast.c) index it
    by an enum of these names (``P_`` and the name in capitals), which tests/vllm/test_c_layout.py checks."""

    start: float  # schedule() entered
    left: float  # schedule() left
    idle_s: float | None  # before the step: no step in flight since the previous one ended (None: no step before)
    running: int
    waiting: int
    preempted: int
    kv_cache_usage: float
    shares: Shares
    queue_blocked: int  # timeline.BLOCKED_*
    loras: Sequence[int] | None  # the LoRA adapters it runs (None: LoRA off)


_SHARES = Pending._fields.index("shares")
# a pending entry's items: the fields above, or one more with the step's grammar facts [seconds, requests,
# hit_at, miss_at] (such an entry is the Python path's: the C method takes entries of the fields only)
_ENTRY = _GRAMMAR = len(Pending._fields)
_SCHEDULE, _UPDATE = 0, 1  # the two kinds of _hooks_fast.HookMethod
_IDS = Shares._fields.index("ids")
_NONE: tuple = ()  # no share without output / with a prompt entry (a steady decode batch): nothing allocated


class StepHooks:
    """The scheduler hooks of one owner, with the state they keep between calls, and the model timer
    of the same process (model_timing.py).

    The owner arms them: ``VLLMInstrumentor`` for an engine in its own process (the sink hands the
    record to its pipeline), ``plugin()`` in a spawned EngineCore (a ``SocketSink``). The bound
    methods are the wrapt wrappers: the hot path reads this object's attributes, nothing module-wide."""

    # the C methods (_hooks_fast.c) where built: off, the Python methods alone (the same records; benchmarks)
    FAST = True

    __slots__ = ("sink", "pending", "model", "timer", "counter", "prefix", "last_end", "clock", "recompute",
                 "_table", "contract", "prompt_len", "prefill_token_ids", "preempted_ids", "max_active", "spec_on",
                 "spec_readers", "lora_on", "on_error", "guard", "grammars", "on_idle")

    def __init__(self, fence: contract.Contract | None = None, guard: Guard | None = None) -> None:
        # the owner's (the instrumentor's, or the plugin's EngineSide): the hooks' errors are counted there
        self.guard = guard = guard if guard is not None else Guard()
        # vLLM's symbols, read through the contract where a release may lack them (contract.py): the
        # readers are picked at the first schedule(), once vLLM's scheduler output module is imported
        self.contract = fence or contract.Contract(guard=guard)
        self.prompt_len: Callable[[Any], int] | None = None
        self.prefill_token_ids: Callable[[Any], Any] | None = None
        self.preempted_ids: Callable[[Any], Any] | None = None
        self.max_active: Callable[[Any], int] | None = None
        # features whose symbols have no fallback: on only where the contract has every one of them
        self.spec_on = False
        self.spec_readers: SpecReaders | None = None
        self.lora_on = False
        # told after an error was caught (a spawned EngineCore's plugin: engine_errors.ErrorReporter.changed)
        self.on_error: Callable[[], None] | None = None
        self.sink: Callable[[StepPayload], None] | None = None
        # told when a step leaves the scheduler with no request (the engine goes idle): a spawned EngineCore's
        # sink sends what a full datagram socket held back (step_transport.SocketSink.idle); None: nothing
        self.on_idle: Callable[[], None] | None = None
        # id(scheduler_output) -> what schedule() saw (a ``Pending``'s fields), unpacked whole by update_from_output
        self.pending: dict[int, tuple] = {}
        self.timer = ModelTimer(guard)
        self.model = self.timer.model  # the timer's times by step (the same dict: read once a step)
        self.counter = itertools.count(1)
        self.prefix = 0
        self.last_end: float | None = None  # u1 of the last step that carried work
        self.clock: Callable[[], float] = time.monotonic
        self.recompute: dict[str, int] = {}  # request id -> prompt length, while it recomputes after a preemption
        self.grammars = GrammarCache()  # each request's grammar compiled anew or reused (grammar.py)
        self._table = WrapTable(self.targets(_SCHEDULER_MODULE) + [
            Target(_SCHEDULER_MODULE, "Scheduler.get_grammar_bitmask", self.grammar_bitmask, plain=True),
            Target(_STRUCTURED_MODULE, "StructuredOutputManager._create_grammar", self.compile_grammar, plain=True)],
            guard)

    def targets(self, module: str) -> list[Target]:
        """The two scheduler methods of ``module``'s ``Scheduler`` (vLLM's, or a benchmark's stand-in): plain,
        because they are called on every step in the EngineCore's loop and wrapt's call costs more
        (wraps.Target); the C methods where built and ``FAST`` is on."""
        return [Target(module, "Scheduler.schedule", self.schedule, plain=True, method=self._fast(_SCHEDULE)),
                Target(module, "Scheduler.update_from_output", self.update_from_output, plain=True,
                       method=self._fast(_UPDATE))]

    def _fast(self, kind: int) -> Callable[[Callable, WrapTable], Any]:
        def make(original: Callable, table: WrapTable) -> Any:
            fast = fast_methods() if self.FAST else None
            return fast.HookMethod(kind, original, self, table) if fast is not None else None
        return make

    def arm(self, sink: Callable[[StepPayload], None]) -> None:
        """Report every step to ``sink`` (and time the model runner, where it runs in this process)."""
        self.sink = sink
        self.prefix = os.getpid() << 32  # step ids stay unique when several engines report to one frontend
        self.last_end = None
        self._table.wrap()
        self.timer.enable(in_engine=True)

    def disarm(self) -> None:
        self.sink = None
        self._table.unwrap()
        self.timer.disable()
        self.pending.clear()
        self.recompute.clear()
        self.grammars.clear()

    def schedule(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if self.sink is None:
            return wrapped(*args, **kwargs)
        clock = self.clock
        start = clock()
        out = wrapped(*args, **kwargs)
        self.scheduled(instance, out, start, clock())
        return out

    def scheduled(self, instance: Any, out: Any, start: float, left: float) -> None:
        """What ``schedule()`` keeps of a step until its ``update_from_output``, in ``pending``. (The C method
        (_hooks_fast.c) keeps a steady step itself, the same entry, and hands any other step here.)"""
        try:
            if self.prompt_len is None:
                self._pick_readers()
            shares = self._shares(instance, out)
            preempted = self.preempted_ids(out)
            kv = instance.kv_cache_manager.usage
            pending = self.pending
            if len(pending) > 64:  # update_from_output never came (engine error): don't grow
                pending.clear()
                self.model.clear()
            running, waiting, n_preempted = len(instance.running), len(instance.waiting), len(preempted) if preempted else 0
            last_end = self.last_end
            # idle only when nothing was in flight: under the batch queue a batch runs meanwhile
            idle = None if last_end is None else (start - last_end if not pending else 0.0)
            entry = (start, left, idle, running, waiting, n_preempted, float(kv), shares,
                     _queue_blocked(instance, out, running, waiting, n_preempted, self.max_active)
                     if waiting else BLOCKED_NONE,
                     active_loras(instance, shares[_IDS]) if self.lora_on and instance.lora_config is not None else None)
            if self.grammars.pending and out.scheduled_new_reqs:  # grammars compiled since: hit or miss, per request
                entry = self._grammar_facts(entry, out.scheduled_new_reqs, len(shares[_IDS]))
            pending[id(out)] = entry
        except Exception as exc:
            self.failed("scheduler.schedule hook", exc)

    def _grammar_facts(self, entry: tuple, new: list, n: int) -> tuple:
        """The entry with the grammar facts of the step's new requests (the last ``len(new)`` shares)."""
        hits: list[int] = []
        misses: list[int] = []
        take = self.grammars.take
        for i, r in enumerate(new, n - len(new)):
            hit = take(r.req_id)
            if hit is not None:
                (hits if hit else misses).append(i)
        return entry + ([None, 0, hits, misses],) if hits or misses else entry

    def grammar_bitmask(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """``Scheduler.get_grammar_bitmask(scheduler_output)``, which vLLM's EngineCore calls once a step
        (while the model runs, with the multiprocess executor): timed where it returns a mask, i.e. where
        the step has structured requests to sample, and kept with the step's pending entry."""
        if self.sink is None:
            return wrapped(*args, **kwargs)
        start = perf_counter()
        result = wrapped(*args, **kwargs)
        if result is None:  # no structured request to mask: the step stays a plain one
            return result
        took = perf_counter() - start
        try:
            key = id(args[0] if args else kwargs["scheduler_output"])
            entry = self.pending.get(key)
            if entry is not None:
                requests = len(result.structured_output_request_ids)
                if len(entry) > _GRAMMAR:
                    entry[_GRAMMAR][0], entry[_GRAMMAR][1] = took, requests
                else:
                    self.pending[key] = entry + ([took, requests, (), ()],)
        except Exception as exc:
            self.failed("scheduler.get_grammar_bitmask hook", exc)
        return result

    def compile_grammar(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """``StructuredOutputManager._create_grammar(request)``: whether the request's grammar was a cache hit."""
        if self.sink is None:
            return wrapped(*args, **kwargs)
        return self.grammars.compile(wrapped, instance, args, kwargs)

    def failed(self, where: str, exc: BaseException) -> None:
        """A hook's error, counted where the user looks (even though this step sends no record)."""
        self.guard.failed(where, exc)
        if self.on_error is not None:
            self.on_error()

    def _pick_readers(self) -> None:
        """vLLM's symbols through the contract, once (the scheduler's modules are imported by now)."""
        fence = self.contract
        self.prefill_token_ids = fence.reader("NewRequestData.prefill_token_ids")
        self.preempted_ids = fence.reader("SchedulerOutput.preempted_req_ids")
        self.max_active = fence.reader("Scheduler.max_num_active_reqs")
        fast = fast_methods() if self.FAST else None
        self.spec_readers = SpecReaders(fence.reader("SchedulerOutput.num_invalid_spec_tokens"),
                                        fence.reader("Scheduler.num_sampled_tokens_per_step"),
                                        fast.spec_counts if fast is not None else common_counts)
        self.spec_on = fence.present("SchedulerOutput.scheduled_spec_decode_tokens",
                                     "ModelRunnerOutput.sampled_token_ids", "ModelRunnerOutput.req_id_to_index")
        self.lora_on = fence.present("Scheduler.lora_config", "Scheduler.requests", "Request.lora_request",
                                     "LoRARequest.lora_int_id")
        self.prompt_len = fence.reader("NewRequestData.prompt_len")  # last: its being set means all are

    def _shares(self, scheduler: Any, out: Any) -> Shares:
        """The step's shares as vLLM's scheduler output lists them (step_wire.Shares' fields, a plain tuple: see
        update_from_output), with no Python
        loop over the batch: the frontend derives each share's prefill flag and context from them
        (step_wire.derive_prefill). Python loops run only over this step's new requests, the requests
        recomputing after a preemption and, in a step with a prefill chunk, the output counts: none of
        them in a steady decode batch."""
        cached = out.scheduled_cached_reqs
        ids, computed, outputs = cached.req_ids, cached.num_computed_tokens, cached.num_output_tokens
        recompute = self.recompute
        resumed = cached.resumed_req_ids
        new = out.scheduled_new_reqs
        # no output yet (placeholders count): a prefill chunk. all(): a C-level truth test per count,
        # cheaper than count(0)'s rich comparisons on every step; the loop only when there are some
        no_output_at = _NONE if all(outputs) else [i for i, o in enumerate(outputs) if not o]
        if not (resumed or recompute or new):  # no share has a prompt entry (a steady batch): nothing allocated
            if out.total_num_scheduled_tokens == len(ids):
                return ids, None, computed, no_output_at, _NONE, _NONE, _NONE  # one token each
            return ids, self._tokens(out.num_scheduled_tokens, ids), computed, no_output_at, _NONE, _NONE, _NONE
        scheduled = out.num_scheduled_tokens
        prompt_at: list[int] = []
        prompt_len: list[int] = []
        prompt_outputs: list[int] = []
        if resumed:  # back from a preemption: recomputes (a prefill) until all but its last token are computed
            requests = scheduler.requests
            for rid in resumed:
                recompute[rid] = requests[rid].num_prompt_tokens
        if recompute:
            for rid in out.finished_req_ids:
                recompute.pop(rid, None)
            for rid, p in list(recompute.items()):
                try:
                    i = ids.index(rid)
                except ValueError:
                    continue  # not scheduled in this step
                o = outputs[i]
                prompt_at.append(i)
                prompt_len.append(p)
                prompt_outputs.append(o)
                if computed[i] + scheduled[rid] >= p + o - 1:
                    del recompute[rid]  # from the next step on it decodes
            if len(recompute) > 4096:  # bounded (requests that vanished unseen): these shares read as decodes
                recompute.clear()
        if new:
            ids, computed = list(ids), list(computed)
            for r in new:
                i = len(ids)
                ids.append(r.req_id)
                computed.append(r.num_computed_tokens)
                p = self.prompt_len(r)  # a property from vLLM 0.29 on: len(prompt_token_ids) before
                total = self.prefill_token_ids(r)  # vLLM's v2 model runner: every token, a resumed request's outputs too
                o = len(total) - p if total is not None else 0
                prompt_at.append(i)
                prompt_len.append(p)
                prompt_outputs.append(o)
                if o:
                    recompute[r.req_id] = p
        # one token each (every scheduled request has at least one): a plain decode batch
        tokens = None if out.total_num_scheduled_tokens == len(ids) else self._tokens(scheduled, ids)
        return ids, tokens, computed, no_output_at, prompt_at, prompt_len, prompt_outputs

    @staticmethod
    def _tokens(scheduled: dict, ids: list) -> list[int]:
        if list(scheduled) == ids:  # vLLM's dict in the lists' order (no new or resumed request in between)
            return list(scheduled.values())
        return list(map(scheduled.__getitem__, ids))

    def update_from_output(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        sink = self.sink
        if sink is None:
            return wrapped(*args, **kwargs)
        clock = self.clock
        spec = scheduler_output = model_output = None
        try:
            if len(args) == 2:  # as vLLM's EngineCore calls it
                scheduler_output, model_output = args
            else:
                scheduler_output = kwargs.get("scheduler_output", args[0] if args else None)
                model_output = kwargs.get("model_runner_output", args[1] if len(args) > 1 else None)
            # speculative drafts (a dict that is empty unless the step verified some), counted before vLLM
            # trims a stopped request's sampled tokens in place (its own counts are taken before that too)
            if self.spec_on and scheduler_output.scheduled_spec_decode_tokens:
                spec = spec_counts(instance, scheduler_output, model_output, scheduler_output.num_scheduled_tokens,
                                   self.spec_readers)
        except Exception as exc:
            self.guard.failed("scheduler.update_from_output hook (drafts)", exc)
        entered = clock()
        result = wrapped(*args, **kwargs)
        self.updated(scheduler_output, model_output, result, entered, clock(), spec)
        on_idle = self.on_idle
        if on_idle is not None and not instance.requests:  # no next step sends what the sink holds
            try:
                on_idle()
            except Exception as exc:
                self.failed("scheduler.update_from_output hook (idle)", exc)
        return result

    def updated(self, scheduler_output: Any, model_output: Any, result: Any, entered: float, left: float,
                spec: tuple | None) -> None:
        """The step's record, from what ``schedule()`` kept and ``update_from_output``'s outputs, to the sink.
        (The C method sends a steady step's itself, the same record, and hands any other step here.)"""
        sink = self.sink
        if sink is None:
            return
        try:
            key = id(scheduler_output)
            pending = self.pending.pop(key, None)
            model = getattr(model_output, MODEL_TIME_ATTR, None)
            if model is None and self.model:
                model = self.model.pop(key, None)
            if pending is not None and pending[_SHARES][_IDS]:
                if len(pending) == _ENTRY:  # (no slice for the usual entry: a tuple fewer a step)
                    grammar = None
                    start, scheduled, idle, running, waiting, preempted, kv, shares, blocked, loras = pending
                else:
                    grammar = pending[_GRAMMAR]
                    start, scheduled, idle, running, waiting, preempted, kv, shares, blocked, loras = pending[:_ENTRY]
                end = None
                for o in result.values() if result else ():  # the outputs' stamp: any client's, the same
                    end = o.timestamp
                    break
                if not end or end < entered:
                    end = left
                self.last_end = left
                if model is not None and model.__class__ is not float:
                    model = self.timer.cuda_seconds(model)
                # a StepPayload's fields as a plain tuple: building the NamedTuple itself (tuple.__new__) costs
                # several times the literal, a tenth of the hooks' cost per step; every reader takes either
                payload = (self.prefix | next(self.counter), start, end, running, waiting, preempted, kv, shares,
                           blocked, scheduled - start, entered - scheduled, end - entered, idle, model)
                # speculative drafts and LoRA adapters: StepPayload.extras, a 15th field only in steps that have
                # them (the C encoder takes the 14-field rest; step_wire.encode_py these)
                if spec is not None:
                    spec = share_positions(spec, shares[_IDS])
                worker = worker_facts(model_output, self.timer.facts)  # LoRA loads, drafter time
                if spec is not None or loras is not None or worker is not None:
                    payload += (Extras(*(spec or _NO_SPEC), loras or (), *(worker or _NO_WORKER)),)
                if grammar is not None:  # the 16th item (after the extras, or None): step_wire.StepPayload
                    if len(payload) == 14:
                        payload += (None,)
                    payload += (StepGrammar(grammar[0], grammar[1], tuple(grammar[2]), tuple(grammar[3])),)
                sink(payload)
        except Exception as exc:
            self.failed("scheduler.update_from_output hook", exc)

    # -- model execution, timed where it runs ---------------------------------------------------


def fast_methods() -> Any | None:
    """The C module of the scheduler hooks' steady step (``_hooks_fast.c``, built by setup.py where there is a
    compiler), configured on first use; None where it is not importable (``FAST_REASON`` says why): the Python
    methods then take every step, with the same records (tests/vllm/test_hooks_fast.py)."""
    global _fast_module, FAST_REASON
    if _fast_module is None:
        try:
            from . import _hooks_fast
            _hooks_fast.setup(_queue_blocked, StepHooks._tokens, BLOCKED_NONE, _NONE, MODEL_TIME_ATTR,
                              WORKER_FACTS_ATTR)
            _fast_module, FAST_REASON = _hooks_fast, None
        except (ImportError, TypeError) as exc:
            _fast_module, FAST_REASON = False, f"the C hook methods are not importable ({exc}): the Python hooks"
    return _fast_module or None


_fast_module: Any = None  # the configured _hooks_fast, False where it is not importable, None before the first use
FAST_REASON: str | None = None  # why the Python hooks take every step, or None


_NO_SPEC = ((), (), ())
_NO_WORKER = ((), None)


_MAX_ACTIVE = contract._FALLBACKS["Scheduler.max_num_active_reqs"](False)


def _queue_blocked(scheduler: Any, out: Any, running: int, waiting: int, preempted: int,
                   max_active: Callable[[Any], int] | None = None) -> int:
    """Why requests stayed waiting after this ``schedule()``: the first limit its admission loop hits
    (vLLM 0.32 ``Scheduler.schedule``), read from the scheduler's state right after it ran. ``max_active``:
    the contract's reader of ``Scheduler.max_num_active_reqs`` (its fallback where the release lacks it)."""
    if preempted:
        return BLOCKED_KV_CACHE  # a step that preempts admits nobody: the running requests outgrew the KV cache
    if running >= (max_active or _MAX_ACTIVE)(scheduler):
        return BLOCKED_MAX_SEQS
    if out.total_num_scheduled_tokens >= scheduler.max_num_scheduled_tokens:
        return BLOCKED_TOKEN_BUDGET
    try:
        head = scheduler.waiting.peek_request()
        # admission needs the head's whole remaining sequence in free blocks (scheduler_reserve_full_isl)
        need = -(-(head.num_tokens - head.num_computed_tokens) // scheduler.block_size)
        if need > scheduler.kv_cache_manager.block_pool.get_num_free_blocks():
            return BLOCKED_KV_CACHE
    except (AttributeError, IndexError):  # another vLLM's internals: the step record is worth more than this
        pass
    if _grammar_waits(scheduler):
        return BLOCKED_STRUCTURED_OUTPUT
    return BLOCKED_OTHER  # a limit we do not model (LoRA slots, remote KV, encoder budget)


_GRAMMAR_WAIT = "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR"  # vLLM's RequestStatus member, by name


_HELD_BACK = contract._FALLBACKS["Scheduler.deferred_waiting"](True)  # vLLM 0.28: Scheduler.skipped_waiting


def _grammar_waits(scheduler: Any) -> bool:
    """Whether requests stayed waiting for their structured-output grammar in a step no limit stopped: the
    admission loop then checked every waiting request, and one still in the grammar status had no grammar
    yet. vLLM keeps the requests held back for such reasons (grammar, remote KV, streaming input) in
    ``Scheduler.deferred_waiting`` (0.28: ``skipped_waiting``; contract.py), usually a handful: reading
    them costs nothing on a step without."""
    try:
        try:
            deferred = scheduler.deferred_waiting
        except AttributeError:
            deferred = _HELD_BACK(scheduler)
        if not deferred:
            return False
        for request in tuple(deferred):
            if request.status.name == _GRAMMAR_WAIT:
                return True
    except (AttributeError, TypeError):  # another vLLM's internals: the step record is worth more than this
        pass
    return False



def decode(payload: StepPayload) -> StepRecord:
    """A step record from the hook's payload, in-process (across processes see step_wire): the shares kept
    as vLLM's lists (``StepRecord.of_lists``: no tuple per share), prefill flags and contexts derived as the
    wire's decoder derives them. (A ``StepPayload``, or the plain tuple of its fields the hooks hand over.)"""
    extras = payload[14] if len(payload) > 14 else None
    grammar = payload[15] if len(payload) > 15 else None
    (step_id, start, end, running, waiting, preempted, kv, shares, blocked,
     schedule_s, execute_s, output_s, idle, model) = payload[:14]
    ids, tokens, computed, no_output_at, prompt_at, prompt_len, prompt_outputs = shares
    contexts = list(computed)
    step = StepRecord.of_lists(step_id, start, end, list(ids), list(tokens) if tokens is not None else None,
                               step_wire.derive_prefill(len(ids), contexts, no_output_at, prompt_at, prompt_len,
                                                        prompt_outputs),
                               running, waiting, preempted, kv, queue_blocked=blocked)
    step.contexts = contexts
    step.schedule_s, step.execute_s, step.output_s = schedule_s, execute_s, output_s
    step.idle_s, step.model_s = idle, model
    if extras is not None:  # speculative drafts, LoRA adapters (step_wire.Extras)
        spec_at, drafted, accepted, loras, events, draft = extras
        if spec_at:
            step.spec = SpecStep(list(spec_at), list(drafted), list(accepted))
        step.loras = tuple(loras) if loras else None
        if events or draft is not None:
            step.worker = StepWorkerFacts(tuple(map(LoRAEvent._make, events)), draft)
    if grammar is not None:
        step.grammar = StepGrammar(*grammar)
    return step
