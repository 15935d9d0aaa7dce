"""What a decode-step or prefill-chunk span says about the engine step that produced it.

A slow token is explained on its own row: the step's id (to find its ``llm.engine.step``
span), how long the step took, how many requests it batched, and how many prompt tokens
of *other* requests it prefilled. Viewers treat span links unevenly (Phoenix drops them),
so these facts are copied onto the row rather than left behind a link.

``step_facts`` is the one place that decides these attributes: a field added to
``StepRecord`` (e.g. the step's anatomy or its roofline bound) is added here once and
appears on every decode-step and prefill-chunk span.
"""

from __future__ import annotations

from typing import Any

from .. import semconv as sc
from .timeline import StepRecord


def step_facts(step: StepRecord, own_prefill_tokens: int = 0) -> dict[str, Any]:
    """Attributes for a span of one request produced by ``step``; ``own_prefill_tokens`` is that
    request's own prefill share of the step (its chunk), which is not someone else's prefill."""
    facts: dict[str, Any] = {
        sc.ENGINE_STEP_ID: step.step_id,
        sc.STEP_DURATION: max(0.0, step.end - step.start),
        sc.STEP_BATCH_SIZE: len(step.ids),
        sc.STEP_OTHER_PREFILL_TOKENS: step.prefill_tokens - own_prefill_tokens,
    }
    # the step's anatomy where the engine measured it: was the token slow in the model, or around it?
    for key, value in ((sc.STEP_MODEL_TIME, step.model_s), (sc.STEP_EXECUTE_TIME, step.execute_s),
                       (sc.STEP_IDLE_BEFORE, step.idle_s)):
        if value is not None:
            facts[key] = value
    return facts


class FactsCache:
    """``step_facts`` per step, computed once: a step is shared by every request in its batch, and
    ``StepRecord``'s sums walk the batch. Bounded: cleared when full (it only saves work)."""

    def __init__(self, max_entries: int = 16384) -> None:
        self._max = max_entries
        self._facts: dict[int, dict[str, Any]] = {}

    def get(self, step: StepRecord, own_prefill_tokens: int = 0) -> dict[str, Any]:
        facts = self._entry(step)
        if own_prefill_tokens:
            facts = dict(facts)
            facts[sc.STEP_OTHER_PREFILL_TOKENS] -= own_prefill_tokens
        return facts

    def carried_prefill(self, by_token: dict[int, StepRecord], own: dict[int, int]) -> set[int]:
        """The tokens whose engine step prefilled someone else's prompt (``own``: the request's own
        prefill tokens per step id). One pass, per token of a kept request: kept tight."""
        cached, entry, key, mine = self._facts.get, self._entry, sc.STEP_OTHER_PREFILL_TOKENS, own.get
        out = set()
        # a step that prefilled nobody (no prefilling share: no prefill tokens) carried no one's prompt
        for i, st in [(i, st) for i, st in by_token.items() if st.prefill_at]:
            facts = cached(st.step_id) or entry(st)
            if facts[key] > mine(st.step_id, 0):
                out.add(i)
        return out

    def _entry(self, step: StepRecord) -> dict[str, Any]:
        hit = self._facts.get(step.step_id)
        if hit is None:
            if len(self._facts) >= self._max:
                self._facts.clear()
            hit = self._facts[step.step_id] = step_facts(step)
        return hit
