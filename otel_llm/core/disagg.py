"""A disaggregated user request from its two halves: the prefill instance's request and the decode instance's.

Engine-agnostic. Each instance sees only its half (``RequestSummary.disagg_role``: ``prefill``, ``decode``); the
collector's gateway sees both in one trace and judges the user's request here: its SLO, and which half (and
which of that half's causes) a breach is owed to. The durations add up on one timeline whatever the two hosts'
clocks say (each half's figures are measured on its own host), so a skew between the hosts changes nothing here.

The joined request is a lower bound of what the user waited: the router's hops (HTTP, the proxy's own time)
are not in either half. The client's span (``gen_ai.response.time_to_first_chunk``) and the router's
(``llm.disagg.time_to_first_token``) have the whole of it.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .. import semconv as sc
from .diagnosis.causes import NAMES as CAUSE_NAMES
from .summary import RequestSummary

USER = "user"  # disagg_role of the request joined from its halves
HALVES = frozenset((sc.DISAGG_ROLE_PREFILL, sc.DISAGG_ROLE_DECODE))
_QUEUE_CAUSES = frozenset(c for c in CAUSE_NAMES if c.startswith("queue_"))  # waiting in the engine's queue
_BEFORE_FIRST_TOKEN = frozenset(("ttft", "e2e"))  # objectives that measure time before the user's first token


class UserVerdict(NamedTuple):
    """Why the user's request breached: the half the cause lay on (``prefill``, ``decode``; None: unknown) and
    the cause (one of ``semconv.SLOW_CAUSES``), from the halves' own verdicts."""

    side: str | None
    cause: str


def pair(summaries: Sequence[RequestSummary]) -> tuple[RequestSummary, RequestSummary] | None:
    """The (prefill, decode) halves among a trace's request summaries, if it holds exactly one of each."""
    prefill = decode = None
    for s in summaries:
        role = s.disagg_role
        if role == sc.DISAGG_ROLE_PREFILL:
            if prefill is not None:
                return None
            prefill = s
        elif role == sc.DISAGG_ROLE_DECODE:
            if decode is not None:
                return None
            decode = s
    return (prefill, decode) if prefill is not None and decode is not None else None


def join(prefill: RequestSummary, decode: RequestSummary) -> RequestSummary:
    """The user's request as its halves add up: the router waited for P's whole request, then for D's.

    TTFT: P's e2e plus D's TTFT (P's one token is thrown away); e2e: both e2e; TPOT and the decode phase are
    D's (decoding happens only there); queue: both queues; prefill: P's. Tokens and the model are D's (D
    served the whole request: same prompt, every output token). Failed when either half failed. The tenant is
    P's (the router's first hop, which saw the user's request first), else D's: the user's SLO scope
    (``SLOTable.for_request``) and tenant label follow it."""
    def add(a: float | None, b: float | None) -> float | None:
        return a + b if a is not None and b is not None else None

    user = RequestSummary(
        model=decode.model or prefill.model, operation=decode.operation, provider=decode.provider or prefill.provider,
        ttft=add(prefill.e2e, decode.ttft), tpot=decode.tpot, e2e=add(prefill.e2e, decode.e2e),
        queue=add(prefill.queue, decode.queue), prefill=prefill.prefill, decode=decode.decode,
        input_tokens=decode.input_tokens, output_tokens=decode.output_tokens,
        output_characters=decode.output_characters, num_preemptions=prefill.num_preemptions + decode.num_preemptions,
        prefix_cache_hit_tokens=prefill.prefix_cache_hit_tokens, finish_reason=decode.finish_reason,
        error_type=prefill.error_type or decode.error_type, max_gap=decode.max_gap, gaps=decode.gaps,
        lora=decode.lora, disagg_role=USER, tenant=prefill.tenant or decode.tenant)
    return user


def verdict(prefill: RequestSummary, decode: RequestSummary, breached: Sequence[str]) -> UserVerdict:
    """Which half a user request's breach is owed to, and for what.

    Each half's own verdict (``slow_cause``, made on its instance against that instance's steps: P judges every
    half it exports, D its breaches) is a candidate when it names a cause. A candidate is weighed by the time
    its cause can have cost the user within the breached objectives: a queue cause at most that half's queue
    time, another cause at most the half's part of the measured time (for the time to first token: P's whole
    request, D's TTFT; after it, D's decode). The heavier candidate is the verdict; with none, ``unknown``."""
    before = not breached or any(o in _BEFORE_FIRST_TOKEN for o in breached)
    after = not breached or any(o != "ttft" for o in breached)
    candidates: list[tuple[float, str, str]] = []
    p_cause = _named(prefill.slow_cause)
    if p_cause is not None and before:  # all of P's request lies before the user's first token
        reach = prefill.queue if p_cause in _QUEUE_CAUSES else prefill.e2e
        candidates.append((reach or 0.0, sc.DISAGG_ROLE_PREFILL, p_cause))
    d_cause = _named(decode.slow_cause)
    if d_cause is not None:
        if d_cause in _QUEUE_CAUSES:
            reach = decode.queue if before else None
        elif d_cause == sc.SLOW_KV_TRANSFER:  # the load lies inside D's time to first token
            reach = decode.ttft if before else None
        else:
            reach = ((decode.ttft or 0.0) if before else 0.0) + ((decode.decode or 0.0) if after else 0.0)
        if reach is not None:
            candidates.append((reach, sc.DISAGG_ROLE_DECODE, d_cause))
    if not candidates:
        return UserVerdict(None, sc.SLOW_UNKNOWN)
    _, side, cause = max(candidates, key=lambda c: c[0])  # ties: the first (P's, which came first)
    return UserVerdict(side, cause)


def _named(cause: str | None) -> str | None:
    return cause if cause is not None and cause != sc.SLOW_UNKNOWN and cause in sc.SLOW_CAUSES else None


def user_requests(summaries: Sequence[RequestSummary]) -> Sequence[RequestSummary]:
    """A trace's request summaries as the user's requests: a prefill and decode pair becomes the one request
    joined from them (its ``slow_cause`` the user's verdict on what it breached); anything else as it is.
    Returns ``summaries`` itself when no summary is a half (the common case costs a loop, nothing more)."""
    for s in summaries:
        if s.disagg_role in HALVES:
            break
    else:
        return summaries
    halves = pair(summaries)
    if halves is None:
        return summaries
    prefill, decode = halves
    user = join(prefill, decode)
    return [user, *(s for s in summaries if s is not prefill and s is not decode)]
