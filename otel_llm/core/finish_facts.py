"""A finished request's facts as the engine counted them, and the summary they make.

The frontend that hands its work to an agent process sends these, a flat record of numbers read off the
engine's own per-request statistics (vLLM's ``RequestStateStats``), in place of a ``RequestSummary`` it
would have to build: the formulas (vLLM's own, ``FinishedRequestStats``) run where the record is read.
The in-process adapter runs the same formulas (``summary_of``), so both paths report the same numbers.
"""

from __future__ import annotations

from typing import NamedTuple

from .step_tokens import TokenWindow
from .summary import RequestSummary
from .timeline import PREEMPTED, RequestTimeline

# an outcome's error type (``error.type``), by the finish reasons the adapters give aborted and failed requests
ERROR_TYPES = {"abort": "aborted", "error": "engine_error"}


class EngineStats(NamedTuple):
    """The engine's per-request statistics (vLLM's ``RequestStateStats``); 0 where a stamp was not taken."""

    arrival: float  # wall clock, seconds since the epoch
    queued: float  # engine monotonic stamps
    scheduled: float
    first_token: float
    last_token: float
    first_token_latency: float  # seconds, as the engine measured it
    generation_tokens: int
    preemptions: int | None  # None: the engine release does not count them


class FinishFacts(NamedTuple):
    """Everything the frontend knows of a request when the engine lets it go (one agent message)."""

    request_id: str
    reason: str
    end: float  # wall clock of the output batch that finished it
    events: list[tuple[int, float]]  # the engine's events (kind, monotonic stamp), as the frontend got them
    cache_sources: tuple[int, int] | None
    cached_tokens: int | None
    output_characters: int | None
    output_text: str | None
    # what the request's start said, for the metrics of a finish whose start never reached the reader
    model: str | None
    operation: str
    provider: str | None
    input_tokens: int | None
    arrival: float  # the frontend's arrival (wall), where the engine has none
    stats: EngineStats
    # when the Python frontend received its first and its last output (wall clock, vLLM's iteration_timestamp of
    # those output batches); 0.0 where no Python frontend did (an engine's own records: the Rust frontend)
    first_output: float = 0.0
    last_output: float = 0.0


def base_summary(t: RequestTimeline, e2e: float, cached_tokens: int | None) -> RequestSummary:
    """What every summary of ``t`` holds, whatever the engine counted: its identity and outcome, its
    end-to-end time, and its prompt's cached tokens, split by source where the split adds up."""
    s = RequestSummary(model=t.requested_model, operation=t.operation, provider=t.provider, input_tokens=t.input_tokens,
                       finish_reason=t.finish_reason)
    s.e2e = e2e
    s.prefix_cache_hit_tokens = cached_tokens
    if t.cache_sources is not None and cached_tokens == sum(t.cache_sources):
        # (vLLM replaces num_cached_tokens for a remote prefill: then the split would not add up, and is left out)
        s.cache_read_local, s.cache_read_external = t.cache_sources
    return s


def summary_of(t: RequestTimeline, stats: EngineStats, end: float, cached_tokens: int | None) -> RequestSummary:
    """The summary of ``t`` from the engine's statistics, with the engine's own formulas: queue from queued to
    scheduled, prefill from scheduled to the first token, decode from the first token to the last. Reads
    ``t``'s identity, finish reason, cache sources and events (preemptions where the engine counts none)."""
    s = base_summary(t, end - (stats.arrival or t.arrival), cached_tokens)
    if stats.queued and stats.scheduled:
        s.queue = stats.scheduled - stats.queued
    if stats.first_token:
        s.ttft = stats.first_token_latency
        if stats.scheduled:
            s.prefill = stats.first_token - stats.scheduled
        s.decode = stats.last_token - stats.first_token
    s.output_tokens = stats.generation_tokens
    s.num_preemptions = stats.preemptions or sum(1 for k, _ in t.events if k == PREEMPTED)
    s.tpot = RequestSummary.mean_tpot(s.decode, s.output_tokens)
    return s


def token_window(t: RequestTimeline, stats: EngineStats, cached_tokens: int | None) -> None:
    """What deriving ``t``'s token times from its steps needs (core/step_tokens.py): the engine's first and
    last token stamps and its count; and, where nothing split them, its cached prompt tokens as local (the
    prompt's cache reads have one source where token times come from steps: no KV connector)."""
    if stats.first_token:
        t.token_window = TokenWindow(stats.first_token, stats.last_token, stats.generation_tokens,
                                     t.input_tokens or 0)
    if t.cache_sources is None and isinstance(cached_tokens, int) and stats.generation_tokens:
        t.cache_sources = (cached_tokens, 0)


def settle(t: RequestTimeline | None, facts: FinishFacts) -> RequestSummary:
    """The summary of a finished request from its facts; fills ``t`` (its started timeline), or, where its
    start is unknown, a stand-in made of what the facts say of it (metrics only)."""
    if t is None:
        t = RequestTimeline(request_id=facts.request_id, arrival=facts.arrival, model=facts.model,
                            operation=facts.operation, provider=facts.provider, input_tokens=facts.input_tokens)
    t.finish_reason = facts.reason
    t.error_type = ERROR_TYPES.get(facts.reason)
    t.events = [tuple(e) for e in facts.events]  # type: ignore[misc]
    t.cache_sources = tuple(facts.cache_sources) if facts.cache_sources is not None else None  # type: ignore[assignment]
    t.output_text = facts.output_text
    t.first_output, t.last_output = facts.first_output or None, facts.last_output or None
    token_window(t, facts.stats, facts.cached_tokens)
    s = summary_of(t, facts.stats, facts.end, facts.cached_tokens)
    s.error_type = t.error_type
    s.output_characters = facts.output_characters
    return s
