"""Processor ``tail_sampling``: buffer spans by trace id, decide per trace with the core's policies.

A trace is decided ``decision_wait_after_root_received`` after its request span (or root
span) arrived, so stragglers can join, and at the latest ``decision_wait`` after its first
span. Time comes from the injected ``clock``; ``tick()`` decides what is due, so tests
advance a fake clock and call it (the gateway calls it after each received request, and from its
ticker thread when none arrive).

Due times wait in two FIFO queues, each in time order because its wait is a constant added to
``clock()``: the clock must not go backwards (``time.monotonic``, the default, does not; a clock that
steps back delays decisions until the queue's head is due).

Memory is bounded by ``num_traces`` and ``max_buffer_bytes`` (encoded span bytes): past
either, the oldest traces are decided early with what has arrived (an error or a slow
request in them is still kept) and the eviction is counted. Decided trace ids go to a
decision cache, so late spans follow their trace's decision.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Callable, Sequence

from otel_llm.core.sampling import NOT_SAMPLED, Policy, TraceView, Verdict, first_match
from otel_llm.core.summary import RequestSummary

from .config import TailSamplingConfig
from .decision_cache import DecisionCache
from .spans import Extracted, Group, merge_values
from .telemetry import GatewayMetrics

Clock = Callable[[], float]
Item = tuple[Group, bytes]  # (resource and scope, encoded span), as spans.encode_request takes them
Emit = Callable[[list[Item]], None]
_SAMPLED = Verdict.SAMPLED
_NOT_SAMPLED_KEY = ("none", Verdict.NOT_SAMPLED.value)  # (policy, decision) labels of NOT_SAMPLED
_NO_ATTRIBUTES: dict[str, list] = {}
NEW_TRACES = "otelcol_processor_tail_sampling_new_trace_id_received"  # upstream's series (no otelcol_llm_ twin)


class PendingTrace(TraceView):
    """A buffered trace: its encoded spans, and the ``TraceView`` the policies read (filled in at decision time)."""

    __slots__ = ("key", "decide_at", "items", "nbytes", "request_seen", "start_ns", "end_ns")

    def __init__(self, key: bytes, decide_at: float, request_seen: bool, first: Item, nbytes: int, error: bool,
                 start_ns: int, end_ns: int, summaries: list[RequestSummary] | tuple = ()) -> None:
        """A trace from its first span (one constructor call on the receive path, not a call and five stores).

        ``summaries``: the first span's request summary as a one-item list, if it has one. TraceView's
        ``trace_id``, ``span_count``, ``duration`` and ``size_bytes`` are left unset here: ``view()`` sets
        them before any policy reads the trace (four stores fewer per new trace)."""
        # reasons start as the shared empty tuple (most traces have none)
        self.summaries = summaries
        self.has_error = error
        self.recorded_reasons: list[str] | tuple = ()
        self.attributes: dict[str, list] = _NO_ATTRIBUTES  # replaced, never changed in place
        self.key = key
        self.decide_at = decide_at
        self.items: list[Item] = [first]
        self.nbytes = nbytes
        self.request_seen = request_seen
        self.start_ns = start_ns
        self.end_ns = end_ns

    def view(self) -> TraceView:
        """Itself, with the trace-wide facts filled in (the lists themselves: the trace is out of the buffer)."""
        self.trace_id = int.from_bytes(self.key, "big")
        self.span_count = len(self.items)
        self.size_bytes = self.nbytes
        self.duration = (self.end_ns - self.start_ns) / 1e9 if self.end_ns > self.start_ns else None
        return self


class TailSampler:
    def __init__(self, cfg: TailSamplingConfig, policies: Sequence[Policy], clock: Clock,
                 telemetry: GatewayMetrics, emit: Emit) -> None:
        self.cfg = cfg
        self.policies = tuple(policies)
        # (kept trace ids, every decided trace id), called under the lock after each batch of decisions
        self.on_decided: Callable[[list[bytes], list[bytes]], None] | None = None
        self._clock = clock
        self._t = telemetry
        self._emit = emit
        self._traces: OrderedDict[bytes, PendingTrace] = OrderedDict()  # insertion order = age, for eviction
        # (decide_at, trace id) in two queues, each in time order by construction (now + a constant wait):
        # traces whose request/root span arrived, and the rest; an entry whose trace was decided, or moved
        # to the first queue, is skipped when it comes up
        self._due_root: deque[tuple[float, bytes]] = deque()
        self._due_first: deque[tuple[float, bytes]] = deque()
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

    def holds(self, trace_id: bytes) -> bool:
        """The trace is buffered, waiting for its decision."""
        return trace_id in self._traces

    # -- receive path --------------------------------------------------------------------------

    def add(self, batch: Extracted) -> None:
        """Buffer one received batch (spans with their request summaries), in one pass under the lock."""
        out: list[Item] = []
        late_sampled = late_dropped = 0
        decided: dict[tuple[str, str], int] = {}
        traces = self._traces
        with self._lock:
            # no decision is made in the loop below, so the decision caches' sets stay the same through it
            sampled, sampled_before = self._sampled.generations()
            not_sampled, not_sampled_before = self._not_sampled.generations()
            # under the lock: a compaction (in another add) replaces the queues
            due_root, due_first = self._due_root.append, self._due_first.append
            now = self._clock()
            decision_wait = now + self.cfg.decision_wait
            soon = min(now + self.cfg.decision_wait_after_root_received, decision_wait)
            added = 0
            held_before = len(traces)  # nothing leaves the buffer in the loop: the growth is the new traces
            for tid, group, raw, start, end, error, root, request in batch.spans:
                size = len(raw)
                added += size
                trace = traces.get(tid)
                if trace is None:
                    if tid in sampled or tid in sampled_before:
                        late_sampled += 1
                        out.append((group, raw))
                        added -= size
                        continue
                    if tid in not_sampled or tid in not_sampled_before:
                        late_dropped += 1
                        added -= size
                        continue
                    # a new trace, filled from its first span (a 1-span trace never takes the path below);
                    # one that starts with its request (or root) span waits only for stragglers
                    if request is not None:  # its summary goes in with it (the common case at shape 1)
                        trace = traces[tid] = PendingTrace(tid, soon, True, (group, raw), size, error, start, end,
                                                           [request.summary])
                        due_root((soon, tid))
                        if request.reason:
                            trace.recorded_reasons = [request.reason]
                        continue
                    if root:
                        trace = traces[tid] = PendingTrace(tid, soon, True, (group, raw), size, error, start, end)
                        due_root((soon, tid))
                    else:
                        trace = traces[tid] = PendingTrace(tid, decision_wait, False, (group, raw), size, error,
                                                           start, end)
                        due_first((decision_wait, tid))
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
                            due_root((soon, tid))
                if request is not None:
                    if trace.summaries:
                        trace.summaries.append(request.summary)
                    else:
                        trace.summaries = [request.summary]
                    if request.reason:
                        if trace.recorded_reasons:
                            trace.recorded_reasons.append(request.reason)
                        else:
                            trace.recorded_reasons = [request.reason]
            if batch.attributes:  # values the attribute policies read; the traces exist by now (or were decided)
                for tid, values in batch.attributes.items():
                    trace = traces.get(tid)
                    if trace is not None:
                        if trace.attributes is _NO_ATTRIBUTES:
                            trace.attributes = values
                        else:
                            merge_values(trace.attributes, ((k, v) for k, vs in values.items() for v in vs))
            self._bytes += added
            new_traces = len(traces) - held_before
            self._enforce_limits(out, decided)
            self._gauges()
        if new_traces:
            self._t.inc(NEW_TRACES, new_traces)
        if late_sampled:
            self._t.inc("sampling_late_spans", late_sampled, decision="sampled")
        if late_dropped:
            self._t.inc("sampling_late_spans", late_dropped, decision="not_sampled")
        self._count(decided)
        if out:
            self._emit(out)

    def _enforce_limits(self, out: list[Item], decided: dict[tuple[str, str], int]) -> None:
        while self._traces and (len(self._traces) > self.cfg.num_traces or self._bytes > self.cfg.max_buffer_bytes):
            reason = "num_traces" if len(self._traces) > self.cfg.num_traces else "max_buffer_bytes"
            _, oldest = self._traces.popitem(last=False)
            self._t.inc("sampling_evictions", reason=reason)
            self._decide([oldest], out, decided)
        limit = 4 * max(len(self._traces), 1024)
        if len(self._due_root) + len(self._due_first) > limit:  # drop stale entries left by evictions
            traces = self._traces
            self._due_root = deque(e for e in self._due_root if e[1] in traces)
            self._due_first = deque(e for e in self._due_first if e[1] in traces)

    # -- decisions -----------------------------------------------------------------------------

    def tick(self) -> int:
        """Decide every trace that is due; returns how many were decided."""
        out: list[Item] = []
        decided: dict[tuple[str, str], int] = {}
        due: list[PendingTrace] = []
        with self._lock:
            now = self._clock()
            traces, root, first = self._traces, self._due_root, self._due_first
            pop = traces.pop
            while True:  # the earlier of the two queues' heads first: decisions in time order
                if root and root[0][0] <= now and not (first and first[0][0] < root[0][0]):
                    at, tid = root.popleft()
                elif first and first[0][0] <= now:
                    at, tid = first.popleft()
                else:
                    break
                trace = traces.get(tid)
                if trace is None or trace.decide_at != at:
                    continue  # already decided, or moved to an earlier entry
                pop(tid)
                due.append(trace)
            n = len(due)
            if due:
                self._decide(due, out, decided)
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
            self._due_root.clear()
            self._due_first.clear()
            self._decide(traces, out, decided)
            self._gauges()
        self._count(decided)
        if out:
            self._emit(out)
        return len(traces)

    def _decide(self, due: list[PendingTrace], out: list[Item], decided: dict[tuple[str, str], int]) -> None:
        """Decide traces taken out of the buffer, in order, with the core's ``first_match`` (an explicit drop
        wins, else the first SAMPLED vote; a policy that raises is no vote, counted), in one loop over the
        traces with the counters kept per batch (a decision per received request span at shape 1)."""
        policies, on_error = self.policies, self._policy_failed
        keep, forget = self._sampled.add, self._not_sampled.add
        not_sampled, released = 0, 0
        kept: list[bytes] = []
        for trace in due:
            released += trace.nbytes
            chosen = first_match(policies, trace.view(), on_error)
            if chosen is NOT_SAMPLED:
                not_sampled += 1
                forget(trace.key)
                continue
            # counted once per batch (a labelled inc costs microseconds)
            key = (chosen.reason.split(":", 1)[0] or "none", chosen.verdict.value)
            decided[key] = decided.get(key, 0) + 1
            if chosen.verdict is _SAMPLED:
                keep(trace.key)
                kept.append(trace.key)
                out.extend(trace.items)
            else:
                forget(trace.key)
        self._bytes -= released
        if self.on_decided is not None:
            self.on_decided(kept, [t.key for t in due])
        if not_sampled:
            decided[_NOT_SAMPLED_KEY] = decided.get(_NOT_SAMPLED_KEY, 0) + not_sampled

    def _count(self, decided: dict[tuple[str, str], int]) -> None:
        for (policy, verdict), n in decided.items():
            self._t.inc("count_traces_sampled", n, policy=policy, decision=verdict)

    def _policy_failed(self, policy: Policy, exc: BaseException) -> None:
        self._t.inc("sampling_policy_errors", policy=str(getattr(policy, "name", "?")))

    def _gauges(self) -> None:
        self._t.set("sampling_traces_on_memory", len(self._traces))
        self._t.set("sampling_bytes_on_memory", self._bytes)


__all__ = ["TailSampler", "PendingTrace", "Verdict"]
