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
from typing import Callable, Sequence

from otel_llm.core.policies import NOT_SAMPLED, Decision, Policy, TraceView, Verdict, first_match
from otel_llm.core.summary import RequestSummary

from .config import TailSamplingConfig
from .decision_cache import DecisionCache
from .spans import Extracted, Group
from .telemetry import SelfTelemetry

Clock = Callable[[], float]
Item = tuple[Group, bytes]  # (resource and scope, encoded span), as spans.encode_request takes them
Emit = Callable[[list[Item]], None]
_SAMPLED = Verdict.SAMPLED
_NOT_SAMPLED_KEY = ("none", Verdict.NOT_SAMPLED.value)  # (policy, decision) labels of NOT_SAMPLED


class PendingTrace:
    """A buffered trace: its encoded spans and the facts the policies read."""

    __slots__ = ("trace_id", "first_seen", "decide_at", "items", "nbytes", "summaries", "reasons", "has_error",
                 "request_seen", "start_ns", "end_ns")

    def __init__(self, trace_id: bytes, first_seen: float, decide_at: float, request_seen: bool) -> None:
        self.trace_id = trace_id
        self.first_seen = first_seen
        self.decide_at = decide_at
        self.items: list[Item] = []
        self.nbytes = 0
        self.summaries: list[RequestSummary] | None = None  # created on first use: most traces have one
        self.reasons: list[str] | None = None
        self.has_error = False
        self.request_seen = request_seen
        self.start_ns = 0
        self.end_ns = 0

    def view(self) -> TraceView:
        duration = (self.end_ns - self.start_ns) / 1e9 if self.end_ns > self.start_ns else None
        # the lists themselves, not tuple copies: the trace is out of the buffer once it is viewed
        return TraceView(int.from_bytes(self.trace_id, "big"), self.summaries or (), self.has_error,
                         len(self.items), duration, self.reasons or ())


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

    def add(self, batch: Extracted) -> None:
        """Buffer one received batch (spans with their request summaries), in one pass under the lock."""
        out: list[Item] = []
        late_sampled = late_dropped = 0
        decided: dict[tuple[str, str], int] = {}
        traces, sampled, not_sampled = self._traces, self._sampled, self._not_sampled
        due, seq, push = self._due, self._seq, heapq.heappush
        with self._lock:
            now = self._clock()
            decision_wait = now + self.cfg.decision_wait
            soon = min(now + self.cfg.decision_wait_after_root_received, decision_wait)
            added = 0
            for tid, group, raw, start, end, error, root, request in batch.spans:
                size = len(raw)
                added += size
                trace = traces.get(tid)
                if trace is None:
                    if tid in sampled:
                        late_sampled += 1
                        out.append((group, raw))
                        added -= size
                        continue
                    if tid in not_sampled:
                        late_dropped += 1
                        added -= size
                        continue
                    # a new trace, filled from its first span (a 1-span trace never takes the path below);
                    # one that starts with its request (or root) span waits only for stragglers
                    seen = request is not None or root
                    trace = traces[tid] = PendingTrace(tid, now, soon if seen else decision_wait, seen)
                    push(due, (trace.decide_at, next(seq), tid))
                    trace.items.append((group, raw))
                    trace.nbytes = size
                    trace.has_error = error
                    trace.start_ns = start
                    trace.end_ns = end
                else:
                    trace.items.append((group, raw))
                    trace.nbytes += size
                    if error:
                        trace.has_error = True
                    if start and (not trace.start_ns or start < trace.start_ns):
                        trace.start_ns = start
                    if end > trace.end_ns:
                        trace.end_ns = end
                    if (request is not None or root) and not trace.request_seen:
                        # the request (or root) span is in: wait a little for stragglers, then decide
                        trace.request_seen = True
                        if soon < trace.decide_at:
                            trace.decide_at = soon
                            self._push(trace)
                if request is not None:
                    if trace.summaries is None:
                        trace.summaries = [request.summary]
                    else:
                        trace.summaries.append(request.summary)
                    if request.reason:
                        if trace.reasons is None:
                            trace.reasons = [request.reason]
                        else:
                            trace.reasons.append(request.reason)
            self._bytes += added
            self._enforce_limits(out, decided)
            self._gauges()
        if late_sampled:
            self._t.inc("sampling_late_spans", late_sampled, decision="sampled")
        if late_dropped:
            self._t.inc("sampling_late_spans", late_dropped, decision="not_sampled")
        self._count(decided)
        if out:
            self._emit(out)

    def _push(self, trace: PendingTrace) -> None:
        heapq.heappush(self._due, (trace.decide_at, next(self._seq), trace.trace_id))

    def _enforce_limits(self, out: list[Item], decided: dict[tuple[str, str], int]) -> None:
        while self._traces and (len(self._traces) > self.cfg.num_traces or self._bytes > self.cfg.max_buffer_bytes):
            reason = "num_traces" if len(self._traces) > self.cfg.num_traces else "max_buffer_bytes"
            _, oldest = self._traces.popitem(last=False)
            self._t.inc("sampling_evictions", reason=reason)
            self._decide(oldest, out, decided)
        if len(self._due) > 4 * max(len(self._traces), 1024):  # drop stale heap entries left by evictions
            self._due = [e for e in self._due if e[2] in self._traces]
            heapq.heapify(self._due)

    # -- decisions -----------------------------------------------------------------------------

    def tick(self) -> int:
        """Decide every trace that is due; returns how many were decided."""
        out: list[Item] = []
        decided: dict[tuple[str, str], int] = {}
        n = 0
        with self._lock:
            now = self._clock()
            due = self._due
            while due and due[0][0] <= now:
                at, _, tid = heapq.heappop(due)
                trace = self._traces.get(tid)
                if trace is None or trace.decide_at != at:
                    continue  # already decided, or moved to an earlier entry
                del self._traces[tid]
                self._decide(trace, out, decided)
                n += 1
            self._gauges()
        self._count(decided)
        if out:
            self._emit(out)
        return n

    def decide_all(self) -> int:
        """Decide every buffered trace now (at shutdown)."""
        out: list[Item] = []
        decided: dict[tuple[str, str], int] = {}
        with self._lock:
            traces = list(self._traces.values())
            self._traces.clear()
            self._due.clear()
            for trace in traces:
                self._decide(trace, out, decided)
            self._gauges()
        self._count(decided)
        if out:
            self._emit(out)
        return len(traces)

    def _decide(self, trace: PendingTrace, out: list[Item], decided: dict[tuple[str, str], int]) -> Decision:
        self._bytes -= trace.nbytes
        decision = first_match(self.policies, trace.view(), self._policy_failed)
        # counted once per batch (a labelled inc costs microseconds); most traces get the shared NOT_SAMPLED
        key = _NOT_SAMPLED_KEY if decision is NOT_SAMPLED else (decision.reason.split(":", 1)[0] or "none",
                                                               decision.verdict.value)
        decided[key] = decided.get(key, 0) + 1
        if decision.verdict is _SAMPLED:
            self._sampled.add(trace.trace_id)
            out.extend(trace.items)
        else:
            self._not_sampled.add(trace.trace_id)
        return decision

    def _count(self, decided: dict[tuple[str, str], int]) -> None:
        for (policy, verdict), n in decided.items():
            self._t.inc("count_traces_sampled", n, policy=policy, decision=verdict)

    def _policy_failed(self, policy: Policy, exc: BaseException) -> None:
        self._t.inc("sampling_policy_errors", policy=str(getattr(policy, "name", "?")))

    def _gauges(self) -> None:
        self._t.set("sampling_traces_on_memory", len(self._traces))
        self._t.set("sampling_bytes_on_memory", self._bytes)


__all__ = ["TailSampler", "PendingTrace", "Verdict"]
