"""The demo's epilogue: n-gram speculative decoding on an engine of its own, and what it accepted.

Speculation changes every decode step (each verifies drafts), so it cannot share the phases' engine
without changing what their quiet measurements measure; and it has no verdict cause (a verify step's
cost is the request's own work: docs/production-features.md), so this part shows acceptance, not a
cause. Greedy requests whose prompts repeat a short pattern: the drafter finds its n-grams in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .. import semconv as sc
from .scenario import ENGINE_ARGS, Arrival

DRAFT_TOKENS = 3
SPECULATIVE_CONFIG = {"method": "ngram", "num_speculative_tokens": DRAFT_TOKENS, "prompt_lookup_max": 3,
                      "prompt_lookup_min": 1}
ENGINE_ARGS_SPEC: dict[str, Any] = {**ENGINE_ARGS, "speculative_config": SPECULATIVE_CONFIG}
REQUESTS = 6
ARRIVALS = tuple(Arrival(0, f"spec-{i}", 48, 48, period=6) for i in range(REQUESTS))


@dataclass(frozen=True)
class Acceptance:
    requests: int  # requests that verified drafts
    drafted: int
    accepted: int
    verify_steps: int

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_step(self) -> float | None:  # 1 + accepted / verify steps: what a verify step yields
        return 1 + self.accepted / self.verify_steps if self.verify_steps else None

    def line(self) -> str:
        if not self.drafted:
            return "no drafts were verified"
        return (f"{self.requests} requests: {self.drafted} tokens drafted, {self.accepted} accepted "
                f"({100 * self.rate:.0f} %), {self.tokens_per_step:.2f} tokens per verify step "
                f"(at most {1 + DRAFT_TOKENS})")


def acceptance(requests: Iterable[Mapping[str, Any]]) -> Acceptance:
    """From request-span attributes (``llm.request.spec_decode.*``)."""
    n = drafted = accepted = steps = 0
    for a in requests:
        d = a.get(sc.SPEC_DRAFT_TOKENS)
        if not isinstance(d, int) or not d:
            continue
        n += 1
        drafted += d
        accepted += int(a.get(sc.SPEC_ACCEPTED_TOKENS, 0))
        steps += int(a.get(sc.SPEC_VERIFY_STEPS, 0))
    return Acceptance(n, drafted, accepted, steps)
