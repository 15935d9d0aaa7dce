"""Speculative decoding as the scheduler counts it: per engine step, per request, and their derived rates.

A verify step computes, for a request with ``d`` draft tokens scheduled, ``1 + d`` positions; it yields
``1 + a`` tokens, ``a`` of them accepted drafts (``0 <= a <= d``) and one sampled by the target model
(the "bonus" token). vLLM's scheduler counts exactly that in ``update_from_output``:
``num_draft_tokens = len(scheduled_spec_decode_tokens[req])`` (less the drafts a grammar invalidated) and
``num_accepted = len(generated) - 1``. The adapter ships, per step, the shares that verified drafts with
their (drafted, accepted) counts (``SpecStep``); everything here derives from those, so the per-request
totals, the per-step totals and the per-position counts are one set of numbers:

* acceptance rate = accepted / drafted (vLLM's ``draft_acceptance_rate``: draft tokens only);
* mean acceptance length = 1 + accepted / verify steps (vLLM's ``mean_acceptance_length``: the bonus
  token included);
* accepted at draft position ``i`` (0-based): verify steps that accepted more than ``i`` drafts (vLLM's
  ``num_accepted_tokens_per_pos``); drafted at position ``i``: verify steps that drafted more than ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MAX_POSITIONS = 64  # draft positions counted per step: more than any drafter proposes (EAGLE trees are wider, not deeper)


@dataclass(slots=True)
class SpecStep:
    """One engine step's verification: the share indices (into ``StepRecord.ids``) that had drafts, and per
    such share the draft tokens scheduled and the drafts the target model accepted. Parallel lists."""

    at: list[int]
    drafted: list[int]
    accepted: list[int]

    @property
    def drafts(self) -> int:
        """Requests that verified drafts in this step (vLLM's ``num_drafts``)."""
        return len(self.at)

    @property
    def draft_tokens(self) -> int:
        return sum(self.drafted)

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted)

    def per_position(self) -> tuple[list[int], list[int]]:
        """(drafted, accepted) per draft position: how many of the step's drafts reached each position and
        how many were accepted there (vLLM's ``num_draft_tokens_per_pos`` / ``num_accepted_tokens_per_pos``)."""
        width = min(MAX_POSITIONS, max(self.drafted, default=0))
        drafted = [0] * width
        accepted = [0] * width
        for d, a in zip(self.drafted, self.accepted):
            for i in range(min(d, width)):
                drafted[i] += 1
            for i in range(min(a, width)):
                accepted[i] += 1
        return drafted, accepted

    def check(self, n: int) -> None:
        """``ValueError`` unless the lists line up with a step of ``n`` shares (what a decoder refuses)."""
        if not (len(self.at) == len(self.drafted) == len(self.accepted)):
            raise ValueError("speculative step lists of unequal lengths")
        if any(i >= n for i in self.at):
            raise ValueError(f"speculative share index beyond the step's {n} shares")
        # (accepted may exceed drafted where a grammar invalidated drafts: vLLM counts them so too)


def acceptance_rate(drafted: int | None, accepted: int | None) -> float | None:
    """Accepted draft tokens over drafted ones; ``None`` without drafts."""
    if not drafted or accepted is None:
        return None
    return accepted / drafted


def acceptance_length(verify_steps: int | None, accepted: int | None) -> float | None:
    """Tokens a verify step yields on average, the target model's own token included; ``None`` without one."""
    if not verify_steps or accepted is None:
        return None
    return 1.0 + accepted / verify_steps


def share_drafts(spec: SpecStep | None, index: int) -> tuple[int, int] | None:
    """(drafted, accepted) of the share at ``index`` in a step, ``None`` when it verified no drafts."""
    if spec is None:
        return None
    try:
        k = spec.at.index(index)
    except ValueError:
        return None
    return spec.drafted[k], spec.accepted[k]


def add_to_requests(spec: SpecStep, ids: Sequence[str], requests: dict) -> None:
    """Add a step's counts to the requests' running totals (``RequestTimeline.spec``: [verify steps,
    drafted, accepted]); requests not tracked here are skipped. O(shares with drafts)."""
    get = requests.get
    for i, d, a in zip(spec.at, spec.drafted, spec.accepted):
        t = get(ids[i])
        if t is None:
            continue
        totals = t.spec
        if totals is None:
            t.spec = [1, d, a]
        else:
            totals[0] += 1
            totals[1] += d
            totals[2] += a
