"""TensorRT-LLM's per-request perf metrics -> the core's timeline and summary (pure functions).

What TensorRT-LLM reports per finished request (release 1.2.1, see ``contract``):

* ``GenerationResultBase.record_stats(output, stats)`` receives ``stats``: a dict keyed by
  ``RequestEventTiming`` (``arrival_time``, ``first_scheduled_time``, ``first_token_time``,
  ``last_token_time``), in seconds on the engine's steady clock. On Linux C++'s ``steady_clock``
  is ``CLOCK_MONOTONIC``, the clock of Python's ``time.monotonic()``, so the core's one
  monotonic-to-wall conversion applies unchanged.
* ``CompletionOutput.request_perf_metrics``: the bound ``RequestPerfMetrics`` (KV-cache block
  reuse, speculative-decoding acceptance, the first and last engine iteration of the request).

The formulas are TensorRT-LLM's own (result.py ``_process_req_perf_metrics``): TTFT = first token
- arrival, e2e = last token - arrival, queue = first scheduled - arrival, TPOT = (last token -
first token) / (output tokens - 1); prefill and decode split TTFT's remainder and e2e the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ... import semconv as sc
from ...guard import Guard
from ...core.summary import RequestSummary
from ...core.timeline import QUEUED, SCHEDULED, RequestTimeline


ARRIVAL, FIRST_SCHEDULED, FIRST_TOKEN, LAST_TOKEN = ("arrival_time", "first_scheduled_time", "first_token_time",
                                                      "last_token_time")
_ERRORS = {"cancelled": "aborted"}


@dataclass(slots=True)
class EngineTimes:
    """One request's engine stamps, steady-clock seconds (``None``: not reported)."""

    arrival: float | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None

    @classmethod
    def from_stats(cls, stats: Mapping[Any, Any] | None) -> "EngineTimes | None":
        """From ``record_stats``' dict, whose keys are ``RequestEventTiming`` members (their ``.value``
        is the name), or from plain-string keys."""
        if not stats:
            return None
        by_name = {getattr(k, "value", k): v for k, v in stats.items()}
        times = cls(*(_seconds(by_name.get(k)) for k in (ARRIVAL, FIRST_SCHEDULED, FIRST_TOKEN, LAST_TOKEN)))
        return times if times.arrival else None

    @classmethod
    def from_perf_metrics(cls, perf: Any) -> "EngineTimes | None":
        """From ``RequestPerfMetrics.timing_metrics`` (``datetime.timedelta`` values)."""
        tm = getattr(perf, "timing_metrics", None)
        if tm is None:
            return None
        times = cls(*(_seconds(getattr(tm, k, None)) for k in (ARRIVAL, FIRST_SCHEDULED, FIRST_TOKEN, LAST_TOKEN)))
        return times if times.arrival else None


def _seconds(v: Any) -> float | None:
    if v is None:
        return None
    if hasattr(v, "total_seconds"):
        v = v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        return None  # TensorRT-LLM leaves unset stamps at 0
    return float(v)


def _diff(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None or later < earlier:
        return None
    return later - earlier


def finalize(t: RequestTimeline, times: EngineTimes | None, perf: Any, output_tokens: int, streamed: bool,
             now_mono: float, now_wall: float, guard: Guard) -> RequestSummary:
    """Settle ``t`` with the engine's stamps and build its summary.

    ``t.token_ts`` holds, on the hot path, when this process received each streamed update (and how
    many tokens it carried). TensorRT-LLM ships no per-token engine stamps: the first and last are
    replaced by the engine's ``first_token_time`` and ``last_token_time``, the ones between are kept
    (clamped into that interval). Without streaming there is one update, at the end: the first token's
    stamp only (the iteration ledger adds one per decode iteration once it has the request's iteration
    stats: ``iterations.decode_stamps``). ``guard``: the instrumentor's, which says a missing one once.
    """
    s = RequestSummary(model=t.model, operation=t.operation, provider=t.provider, input_tokens=t.input_tokens,
                       output_tokens=output_tokens, finish_reason=t.finish_reason)
    s.error_type = t.error_type or _ERRORS.get(t.finish_reason or "")
    offset = now_wall - now_mono
    if times is not None:
        t.arrival = times.arrival + offset
        t.events = [(QUEUED, times.arrival)]
        if times.first_scheduled is not None:
            t.events.append((SCHEDULED, times.first_scheduled))
        s.ttft = _diff(times.first_token, times.arrival)
        s.e2e = _diff(times.last_token, times.arrival)
        s.queue = _diff(times.first_scheduled, times.arrival)
        s.prefill = _diff(times.first_token, times.first_scheduled)
        s.decode = _diff(times.last_token, times.first_token)
        _engine_token_stamps(t, times, streamed)
        if s.e2e is None:  # aborted before its last token: until now
            s.e2e = max(0.0, now_mono - times.arrival)
    else:
        if s.error_type is None:  # an aborted or failed request may end before the engine reported
            _warn_no_perf_metrics(guard)
        # our own stamps: TTFT and decode as this process saw them
        s.e2e = max(0.0, now_wall - t.arrival)
        if t.token_ts:
            s.ttft = max(0.0, t.token_ts[0] + offset - t.arrival)
            s.decode = t.token_ts[-1] - t.token_ts[0]
        if not streamed and len(t.token_ts) == 1:
            t.multi_token_steps = None  # one update: the first token's stamp, no decode steps
    s.tpot = RequestSummary.mean_tpot(s.decode, output_tokens)
    t.request_attributes.update(perf_attributes(perf))
    return s


def _engine_token_stamps(t: RequestTimeline, times: EngineTimes, streamed: bool) -> None:
    first, last = times.first_token, times.last_token
    if first is None:
        t.token_ts, t.multi_token_steps = [], None
        return
    if not streamed or not t.token_ts:
        t.token_ts, t.multi_token_steps = [first], None
        return
    ts = t.token_ts
    end = last if last is not None and last >= first else first
    ts[0] = first
    prev = first
    for i in range(1, len(ts)):
        prev = ts[i] = min(max(ts[i], prev), end)
    if len(ts) > 1:
        ts[-1] = end


def perf_attributes(perf: Any) -> dict[str, Any]:
    """KV-cache reuse, speculative decoding and the iteration range from ``RequestPerfMetrics``."""
    if perf is None:
        return {}
    out: dict[str, Any] = {}
    kv = getattr(perf, "kv_cache_metrics", None)
    if kv is not None:
        for key, name in ((sc.KV_CACHE_REUSED_BLOCKS, "num_reused_blocks"),
                          (sc.KV_CACHE_MISSED_BLOCKS, "num_missed_blocks"),
                          (sc.KV_CACHE_ALLOCATED_BLOCKS, "num_total_allocated_blocks")):
            v = getattr(kv, name, None)
            if isinstance(v, int):
                out[key] = v
        rate = getattr(kv, "kv_cache_hit_rate", None)
        if isinstance(rate, (int, float)) and out.get(sc.KV_CACHE_REUSED_BLOCKS, 0) + out.get(
                sc.KV_CACHE_MISSED_BLOCKS, 0) > 0:
            out[sc.KV_CACHE_HIT_RATE] = float(rate)
    spec = getattr(perf, "speculative_decoding", None)
    drafted = getattr(spec, "total_draft_tokens", 0) if spec is not None else 0
    if isinstance(drafted, int) and drafted > 0:  # as trtllm-serve's /perf_metrics: only when drafting ran
        out[sc.SPEC_DRAFT_TOKENS] = drafted
        out[sc.SPEC_ACCEPTED_TOKENS] = int(getattr(spec, "total_accepted_draft_tokens", 0))
        out[sc.SPEC_ACCEPTANCE_RATE] = float(getattr(spec, "acceptance_rate", 0.0))
    for key, name in ((sc.FIRST_ITER, "first_iter"), (sc.LAST_ITER, "last_iter")):
        v = getattr(perf, name, None)
        if isinstance(v, int):
            out[key] = v
    return out


def iteration_range(perf: Any) -> tuple[int, int] | None:
    first, last = getattr(perf, "first_iter", None), getattr(perf, "last_iter", None)
    if isinstance(first, int) and isinstance(last, int) and 0 <= first <= last:
        return first, last
    return None


def _warn_no_perf_metrics(guard: Guard) -> None:
    guard.warn_once("tensorrt_llm no perf metrics",
                    "otel-llm: a TensorRT-LLM request finished without per-request perf metrics "
                    "(return_perf_metrics): its span has TTFT, decode and e2e as this process saw them, "
                    "no queue/prefill phases. Call otel_llm.instrument() before building the LLM.")
