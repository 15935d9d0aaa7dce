"""A step's production-feature facts, read in the EngineCore where the scheduler holds them exactly.

* Speculative decoding: per share that verified drafts, the draft tokens scheduled and the drafts accepted,
  counted as vLLM's ``Scheduler.update_from_output`` counts them for its ``SpecDecodingStats`` and its
  per-request ``RequestSpecDecodeMetrics``: ``len(scheduled_spec_decode_tokens[req])`` less the drafts a
  grammar invalidated (``num_invalid_spec_tokens``), and ``len(sampled tokens) - num_sampled_tokens_per_step``.
  Read from the step's own scheduler output and model output, so it needs neither vLLM's statistics
  (``log_stats``) nor its per-request option. Work: one pass over the step's ids, and only in a step that
  scheduled drafts.
* LoRA: the integer ids of the adapters the step ran (vLLM's ``scheduled_loras``: the adapters of the
  scheduled requests), read right after ``schedule()``, while every scheduled request is still in
  ``Scheduler.requests``. Work: one pass over the step's ids, only where the engine serves LoRA adapters.
* The model runner's facts (worker_facts.py): the LoRA adapters it loaded or evicted in the step, with the
  load time, and the drafter's time; hung on the step's ``ModelRunnerOutput`` where the model runner runs in
  a worker process, taken from this process's own ``WorkerFacts`` where it runs here. Work in a step without
  them: one attribute read and one flag test.

Every vLLM symbol read here is a contract entry (contract.py); the step hooks ask the contract once, where
they are installed, whether these features' symbols are there (``StepHooks.spec_on``, ``lora_on``) and
hand the fallback-aware readers in (``SpecReaders``): nothing is looked up per step.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, NamedTuple, Sequence

from .worker_facts import WORKER_FACTS_ATTR, WorkerFacts, read_plain


def common_counts(drafts: dict, sampled: Any, index: dict, scheduled: Any
                  ) -> tuple[list[str], list[int], list[int]] | None:
    """The common verify step's (ids, drafted, accepted), counted with C-level maps (a third of the loop's time
    at batch 64, benchmarks/engine_step_hooks.py): every drafting request scheduled, known to the model runner,
    with drafts and sampled tokens. None for any other step (the loop counts it). ``_hooks_fast.spec_counts``
    counts the same in C, where built (tests/core/test_production_features.py holds them equal)."""
    ids = list(drafts)
    at = list(map(index.get, ids))
    if None not in at and all(map(scheduled.__contains__, ids)):
        drafted = list(map(len, drafts.values()))
        generated = list(map(len, map(sampled.__getitem__, at)))
        if 0 not in drafted and 0 not in generated:
            return ids, drafted, [g - 1 for g in generated]
    return None


class SpecReaders(NamedTuple):
    """The contract's readers for the draft counts' symbols with a fallback (contract._FALLBACKS), and the
    count of the common step: ``common_counts``, or its C twin (``_hooks_fast.spec_counts``) where built."""
    invalid: Callable[[Any], Any]  # SchedulerOutput.num_invalid_spec_tokens (None: no grammar invalidated any)
    per_step: Callable[[Any], int]  # Scheduler.num_sampled_tokens_per_step (1 where vLLM lacks it)
    counts: Callable[..., Any] = common_counts  # the C twin takes exact dicts only: spec_counts checks


_PRESENT = SpecReaders(operator.attrgetter("num_invalid_spec_tokens"), operator.attrgetter("num_sampled_tokens_per_step"))


def spec_counts(scheduler: Any, scheduler_output: Any, model_output: Any, scheduled: Any,
                readers: SpecReaders = _PRESENT) -> tuple[list[str], list[int], list[int]] | None:
    """(request ids, drafted, accepted) of the requests that verified drafts in this step, or None. Called
    before ``update_from_output``: vLLM trims a stopped request's sampled tokens in place there, after
    counting them (drafts accepted past ``max_tokens`` count, as in its own statistics). ``scheduled``:
    the step's ``num_scheduled_tokens`` (a request vLLM did not schedule is left out).

    The common step (none invalidated, one token sampled a step) is counted by ``readers.counts``; any other
    step takes the loop (``_spec_counts_loop``), the same result."""
    drafts = scheduler_output.scheduled_spec_decode_tokens
    if not drafts or model_output is None:
        return None
    sampled = model_output.sampled_token_ids
    index = model_output.req_id_to_index
    if index is None:
        return None
    invalid = readers.invalid(scheduler_output)
    per_step = readers.per_step(scheduler)
    if sampled and not invalid and per_step == 1:
        counts = readers.counts
        if not (drafts.__class__ is index.__class__ is scheduled.__class__ is dict):
            counts = common_counts  # a dict subclass may iterate otherwise than the C twin reads it
        counted = counts(drafts, sampled, index, scheduled)
        if counted is not None:
            return counted
    return _spec_counts_loop(drafts, sampled, index, invalid or {}, per_step, scheduled)


def _spec_counts_loop(drafts: dict, sampled: Any, index: dict, invalid: dict, per_step: int,
                      scheduled: Any) -> tuple[list[str], list[int], list[int]] | None:
    ids: list[str] = []
    drafted: list[int] = []
    accepted: list[int] = []
    for rid, tokens in drafts.items():
        j = index.get(rid)
        if not tokens or j is None or rid not in scheduled:
            continue
        generated = sampled[j] if sampled else ()
        if not len(generated) and per_step != 0:  # nothing sampled for it (vLLM skips it too)
            continue
        ids.append(rid)
        drafted.append(len(tokens) - invalid.get(rid, 0))
        accepted.append(max(len(generated) - per_step, 0))
    return (ids, drafted, accepted) if ids else None


def share_positions(spec: tuple[list[str], list[int], list[int]],
                    ids: Sequence[str]) -> tuple[list[int], list[int], list[int]] | None:
    """The counts of ``spec_counts`` keyed by share index in the step's record (``ids``, its shares). A verify
    batch whose drafting requests are the step's shares in their order (vLLM lists both in its running order)
    needs no lookup."""
    if spec[0] == ids:  # the same str objects, in order: pointer compares
        return list(range(len(ids))), spec[1], spec[2]
    position = {rid: i for i, rid in enumerate(ids)}
    at: list[int] = []
    drafted: list[int] = []
    accepted: list[int] = []
    for rid, d, a in zip(*spec):
        i = position.get(rid)
        if i is not None:
            at.append(i)
            drafted.append(d)
            accepted.append(a)
    return (at, drafted, accepted) if at else None


def active_loras(scheduler: Any, ids: Sequence[str]) -> tuple[int, ...] | None:
    """The LoRA adapter ids the step's scheduled requests use (ascending), None where there are none. Called
    only where the contract has ``Scheduler.lora_config``, ``Request.lora_request`` and
    ``LoRARequest.lora_int_id`` (``StepHooks.lora_on``)."""
    if scheduler.lora_config is None:
        return None
    requests = scheduler.requests
    found = set()
    for rid in ids:
        r = requests.get(rid)
        lora = r.lora_request if r is not None else None
        if lora is not None and lora.lora_int_id > 0:
            found.add(lora.lora_int_id)
    return tuple(sorted(found)) if found else None


def worker_facts(model_output: Any, local: WorkerFacts) -> tuple | None:
    """(LoRA events as tuples, drafter seconds or None) of the step, or None: from the model runner's output
    (a worker process hung them there: model_timing.ModelTimer; read by name, ``worker_facts.read_plain``),
    else from ``local``, this process's own. Facts of another form are counted on ``local``'s guard and left
    out: the step keeps its record."""
    facts = getattr(model_output, WORKER_FACTS_ATTR, None)
    if facts is not None:
        try:
            return read_plain(facts)
        except ValueError as exc:
            local.guard.failed("worker facts", exc)
            return None
    if local.pending:
        taken = local.take()
        if taken is not None:
            return tuple(map(tuple, taken.lora_events)), taken.draft_s
    return None
