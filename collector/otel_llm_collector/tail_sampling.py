"""Processor ``tail_sampling``: buffer spans by trace id, decide per trace with the core's policies.

A trace is decided ``decision_wait_after_root_received`` after its request span (or root
span) arrived, so stragglers can join, and at the latest ``decision_wait`` after its first
span. Time comes from the injected ``clock``; ``tick()`` decides what is due, so tests
advance a fake clock and call it (the gateway's ticker thread calls it in production).

Memory is bounded by ``num_traces`` and ``max_buffer_bytes`` (encoded span bytes): past
either, the oldest traces are decided early with what has arrived (an error or a slow
request in them is still kept) and the eviction is counted. Decided trace ids go to a
decision cache, so late spans follow their trace's decision.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from otel_llm.core.policies import Decision, Policy, TraceView, Verdict, first_match
from otel_llm.core.summary import RequestSummary

from .config import TailSamplingConfig
from .decision_cache import DecisionCache
from .spans import SpanFacts
from .telemetry import SelfTelemetry

Clock = Callable[[], float]
Item = tuple  # (resource, scope, span), as build_request takes them
Emit = Callable[[list[Item]], None]


@dataclass(slots=True)
class PendingTrace:
    trace_id: bytes
    first_seen: float
    decide_at: float
    items: list[Item] = field(default_factory=list)
    nbytes: int = 0
    summaries: list[RequestSummary] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    has_error: bool = False
    request_seen: bool = False
    start_ns: int = 0
    end_ns: int = 0

    def view(self) -> TraceView:
        duration = (self.end_ns - self.start_ns) / 1e9 if self.end_ns > self.start_ns else None
        return TraceView(int.from_bytes(self.trace_id, "big"), tuple(self.summaries), self.has_error,
                         len(self.items), duration, tuple(self.reasons))


class TailSampler:
    def __init__(self, cfg: TailSamplingConfig, policies: Sequence[Policy], clock: Clock,
                 telemetry: SelfTelemetry, emit: Emit) -> None:
        self.cfg = cfg
        self.policies = tuple(policies)
        self._clock = clock
        self._t = telemetry
        self._emit = emit
        self._traces: OrderedDict[bytes, PendingTrace] = OrderedDict()  # insertion order = age, for eviction
        self._due: list[tuple[float, int, bytes]] = []  # heap of (decide_at, seq, trace id); stale entries skipped
        self._seq = itertools.count()
        self._bytes = 0
        self._sampled = DecisionCache(cfg.sampled_cache_size)
        self._not_sampled = DecisionCache(cfg.non_sampled_cache_size)
        self._lock = threading.Lock()

    # -- state, for telemetry and tests --------------------------------------------------------

    @property
    def traces_on_memory(self) -> int:
        return len(self._traces)

    @property
    def bytes_on_memory(self) -> int:
        return self._bytes

    # -- receive path --------------------------------------------------------------------------

    def add(self, facts: Sequence[SpanFacts]) -> None:
        out: list[Item] = []
        late = {"sampled": 0, "not_sampled": 0}
        with self._lock:
            now = self._clock()
            for f in facts:
                tid = f.span.trace_id
                trace = self._traces.get(tid)
                if trace is None:
                    if tid in self._sampled:
                        late["sampled"] += 1
                        out.append((f.resource, f.scope, f.span))
                        continue
                    if tid in self._not_sampled:
                        late["not_sampled"] += 1
                        continue
                    trace = PendingTrace(tid, now, now + self.cfg.decision_wait)
                    self._traces[tid] = trace
                    self._push(trace)
                self._append(trace, f, now)
            self._enforce_limits(out)
            self._gauges()
        for decision, n in late.items():
            if n:
                self._t.inc("sampling_late_spans", n, decision=decision)
        if out:
            self._emit(out)

    def _append(self, trace: PendingTrace, f: SpanFacts, now: float) -> None:
        span = f.span
        size = span.ByteSize()
        trace.items.append((f.resource, f.scope, span))
        trace.nbytes += size
        self._bytes += size
        if f.error:
            trace.has_error = True
        if f.summary is not None:
            trace.summaries.append(f.summary)
        if f.reason:
            trace.reasons.append(f.reason)
        start, end = span.start_time_unix_nano, span.end_time_unix_nano
        if start and (not trace.start_ns or start < trace.start_ns):
            trace.start_ns = start
        if end > trace.end_ns:
            trace.end_ns = end
        if (f.summary is not None or f.root) and not trace.request_seen:
            # the request (or root) span is in: wait a little for stragglers, then decide
            trace.request_seen = True
            soon = now + self.cfg.decision_wait_after_root_received
            if soon < trace.decide_at:
                trace.decide_at = soon
                self._push(trace)

    def _push(self, trace: PendingTrace) -> None:
        heapq.heappush(self._due, (trace.decide_at, next(self._seq), trace.trace_id))

    def _enforce_limits(self, out: list[Item]) -> None:
        while self._traces and (len(self._traces) > self.cfg.num_traces or self._bytes > self.cfg.max_buffer_bytes):
            reason = "num_traces" if len(self._traces) > self.cfg.num_traces else "max_buffer_bytes"
            _, oldest = self._traces.popitem(last=False)
            self._t.inc("sampling_evictions", reason=reason)
            self._decide(oldest, out)
        if len(self._due) > 4 * max(len(self._traces), 1024):  # drop stale heap entries left by evictions
            self._due = [e for e in self._due if e[2] in self._traces]
            heapq.heapify(self._due)

    # -- decisions -----------------------------------------------------------------------------

    def tick(self) -> int:
        """Decide every trace that is due; returns how many were decided."""
        out: list[Item] = []
        decided = 0
        with self._lock:
            now = self._clock()
            due = self._due
            while due and due[0][0] <= now:
                at, _, tid = heapq.heappop(due)
                trace = self._traces.get(tid)
                if trace is None or trace.decide_at != at:
                    continue  # already decided, or moved to an earlier entry
                del self._traces[tid]
                self._decide(trace, out)
                decided += 1
            self._gauges()
        if out:
            self._emit(out)
        return decided

    def decide_all(self) -> int:
        """Decide every buffered trace now (at shutdown)."""
        out: list[Item] = []
        with self._lock:
            traces = list(self._traces.values())
            self._traces.clear()
            self._due.clear()
            for trace in traces:
                self._decide(trace, out)
            self._gauges()
        if out:
            self._emit(out)
        return len(traces)

    def _decide(self, trace: PendingTrace, out: list[Item]) -> Decision:
        self._bytes -= trace.nbytes
        decision = first_match(self.policies, trace.view(), self._policy_failed)
        policy = decision.reason.split(":", 1)[0] or "none"
        self._t.inc("count_traces_sampled", policy=policy, decision=decision.verdict.value)
        if decision.sampled:
            self._sampled.add(trace.trace_id)
            out.extend(trace.items)
        else:
            self._not_sampled.add(trace.trace_id)
        return decision

    def _policy_failed(self, policy: Policy, exc: BaseException) -> None:
        self._t.inc("sampling_policy_errors", policy=str(getattr(policy, "name", "?")))

    def _gauges(self) -> None:
        self._t.set("sampling_traces_on_memory", len(self._traces))
        self._t.set("sampling_bytes_on_memory", self._bytes)


__all__ = ["TailSampler", "PendingTrace", "Verdict"]
