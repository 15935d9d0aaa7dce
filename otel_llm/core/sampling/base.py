"""The sampling interface: what a policy reads (``TraceView``), what it answers (``Decision``), how votes combine.

The SDK evaluates one finished request (a ``TraceView`` holding its summary); the collector
evaluates a buffered trace (a ``TraceView`` holding every request summary found in it). The same
policy classes decide in both places.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..summary import RequestSummary


class Verdict(enum.Enum):
    SAMPLED = "sampled"
    NOT_SAMPLED = "not_sampled"
    DROPPED = "dropped"  # an explicit drop; wins over every other vote


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str = ""

    @property
    def sampled(self) -> bool:
        return self.verdict is Verdict.SAMPLED


NOT_SAMPLED = Decision(Verdict.NOT_SAMPLED)


@dataclass(slots=True)
class TraceView:
    """What a policy may look at: the trace id, its request summaries, and trace-wide facts."""

    trace_id: int
    summaries: Sequence[RequestSummary] = ()
    has_error: bool = False
    span_count: int = 1
    duration: float | None = None  # trace-wide, seconds; None when unknown
    recorded_reasons: Sequence[str] = field(default_factory=tuple)  # llm.sampling.reason set by the SDK
    # attribute key -> every value seen for it on the trace's spans and their resources (in arrival order);
    # filled only for the keys some policy names in its ``attribute_keys`` (the collector reads nothing else)
    attributes: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    size_bytes: int = 0  # the trace's spans as encoded OTLP (what bytes_limiting charges); 0 when unknown


class Policy(Protocol):
    name: str

    def evaluate(self, trace: TraceView) -> Decision: ...


class OptionError(ValueError):
    """A policy's constructor refusing one of its arguments; ``option`` names it, so the registry can say
    which config key was wrong (``policy 'x': numeric_attribute.min_value must be ...``)."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"{option} {problem}")
        self.option = option
        self.problem = problem


def attribute_keys(policies: Sequence[Policy]) -> frozenset[str]:
    """Every attribute key the given policies (and their sub-policies) read from ``TraceView.attributes``.

    The collector collects values only for these keys, so a policy that reads attributes must
    declare them. Composites declare the union of their children; a wrapper that does not
    declare ``attribute_keys`` is looked into through its ``policies`` / ``policy``, so a
    hand-written composite still gets its children's keys collected.
    """
    keys: set[str] = set()
    for p in policies:
        declared = getattr(p, "attribute_keys", None)
        if declared is not None:
            keys.update(declared)
            continue
        children = list(getattr(p, "policies", ()) or ())
        child = getattr(p, "policy", None)
        if child is not None:
            children.append(child)
        if children:
            keys.update(attribute_keys(children))
    return frozenset(keys)


OnError = Callable[[Policy, BaseException], None]


def first_match(policies: Sequence[Policy], trace: TraceView, on_error: OnError | None = None) -> Decision:
    """Run policies in order; an explicit drop wins, else the first SAMPLED vote.

    A policy that raises is "no vote" (reported through ``on_error``), never a crash.
    """
    chosen = NOT_SAMPLED
    sampled, dropped = Verdict.SAMPLED, Verdict.DROPPED
    for policy in policies:
        try:
            decision = policy.evaluate(trace)
        except Exception as exc:  # a broken policy must not break the pipeline
            if on_error is not None:
                on_error(policy, exc)
            continue
        if decision is NOT_SAMPLED:  # the shared "no": most votes
            continue
        verdict = decision.verdict
        if verdict is dropped:
            return decision
        if verdict is sampled and chosen is NOT_SAMPLED:
            chosen = decision
    return chosen
