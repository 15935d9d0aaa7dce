"""Policies made of policies (upstream ``and``, ``not``, ``drop``, ``composite``; our ``first_match``)."""

from __future__ import annotations

from typing import Sequence

from .base import NOT_SAMPLED, Decision, OptionError, Policy, TraceView, Verdict, attribute_keys, first_match
from .limits import Clock, SecondBudget


class AndPolicy:
    """Keep only if every sub-policy votes SAMPLED (upstream ``and``); evaluation stops at the first no."""

    def __init__(self, policies: Sequence[Policy], name: str = "and") -> None:
        if not policies:
            raise OptionError("policies", "must be a non-empty list: and needs at least one sub-policy")
        self.name = name
        self.policies = tuple(policies)
        self.attribute_keys = attribute_keys(self.policies)

    def evaluate(self, trace: TraceView) -> Decision:
        for p in self.policies:
            d = p.evaluate(trace)
            if not d.sampled:
                return NOT_SAMPLED
        return Decision(Verdict.SAMPLED, self.name)


class NotPolicy:
    """Invert one sub-policy (upstream ``not``): SAMPLED becomes NOT_SAMPLED and back; a drop stays a drop."""

    def __init__(self, policy: Policy, name: str = "not") -> None:
        self.name = name
        self.policy = policy
        self.attribute_keys = attribute_keys([policy])

    def evaluate(self, trace: TraceView) -> Decision:
        d = self.policy.evaluate(trace)
        if d.verdict is Verdict.DROPPED:
            return d
        return NOT_SAMPLED if d.sampled else Decision(Verdict.SAMPLED, self.name)


class DropPolicy:
    """Explicitly drop when every sub-policy votes SAMPLED (upstream ``drop``); a drop wins over any keep."""

    def __init__(self, policies: Sequence[Policy], name: str = "drop") -> None:
        self.name = name
        self.match = AndPolicy(policies, name)
        self.attribute_keys = self.match.attribute_keys

    def evaluate(self, trace: TraceView) -> Decision:
        if self.match.evaluate(trace).sampled:
            return Decision(Verdict.DROPPED, self.name)
        return NOT_SAMPLED


class FirstMatchPolicy:
    """Composite: run sub-policies in order, first SAMPLED wins, an explicit drop wins over all."""

    def __init__(self, policies: Sequence[Policy], name: str = "first_match") -> None:
        if not policies:
            raise OptionError("policies", "must be a non-empty list: first_match needs at least one sub-policy")
        self.name = name
        self.policies = tuple(policies)
        self.attribute_keys = attribute_keys(self.policies)

    def evaluate(self, trace: TraceView) -> Decision:
        return first_match(self.policies, trace)


class CompositePolicy:
    """Upstream ``composite``: sub-policies in order, each with a share of ``max_total_spans_per_second``.

    As upstream's ``composite.go``: the first sub-policy that votes SAMPLED decides; the trace is kept
    if that sub-policy's spans in the current second (a fixed one-second window) stay within its
    share, and not kept otherwise (a later sub-policy is not asked; a smaller trace may still fit).
    """

    @staticmethod
    def check(policies: Sequence[object], percents: Sequence[float]) -> None:
        """The arguments' rules (the registry checks a config with them too)."""
        if len(policies) != len(percents) or not policies:
            raise OptionError("rate_allocation", "needs one percent per sub-policy")
        if any(p < 0 for p in percents) or sum(percents) > 100:
            raise OptionError("rate_allocation", f"percents must be >= 0 and sum to <= 100, got {list(percents)}")

    def __init__(self, max_total_spans_per_second: int, policies: Sequence[Policy], percents: Sequence[float],
                 clock: Clock, name: str = "composite") -> None:
        self.check(policies, percents)
        self.name = name
        self.policies = tuple(policies)
        self.attribute_keys = attribute_keys(self.policies)
        self.limits = tuple(SecondBudget(max(1, int(max_total_spans_per_second * p / 100)), clock) for p in percents)

    def evaluate(self, trace: TraceView) -> Decision:
        for policy, limit in zip(self.policies, self.limits):
            d = policy.evaluate(trace)
            if d.verdict is Verdict.DROPPED:
                return d
            if d.sampled:
                return Decision(Verdict.SAMPLED, f"{self.name}:{d.reason}") if limit.take(trace.span_count) \
                    else NOT_SAMPLED
        return NOT_SAMPLED
