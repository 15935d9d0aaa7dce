"""TensorRT-LLM's iteration stats -> the core's engine steps, linked to the requests they served.

Iteration stats reach the caller process only when someone pulls them (``LLM.get_stats`` /
``get_stats_async``, which trtllm-serve's ``/metrics`` calls): pulling drains TensorRT-LLM's
queue, so we never pull, we read what the user or the server pulls. Each dict is the C++
``IterationStats`` JSON (keys as tests/bindings/test_executor_bindings.py asserts them:
``iter``, ``iterLatencyMS``, ``timestamp``, ``numActiveRequests``, ``numQueuedRequests``,
``gpuMemUsage``, ``kvCacheStats``, ``inflightBatchingStats``). The PyTorch backend stamps
``timestamp`` with local wall time (``%m-%d-%Y %H:%M:%S.%f``) when it starts the iteration (read in
a stored version of ``_torch/pyexecutor/py_executor.py`` ``_get_init_iter_stats``, not at the pinned
release); the C++ (TensorRT) backend's format was not verified: when ``timestamp`` does not parse, the
iteration is placed where it ended no later than: when we read it.

The stats name no requests by default (``requestStats`` exists only with ``enable_iter_req_stats``, and
whether its ``id`` is the LLM API's ``request_id`` could not be verified in the sources read). What
ties an iteration to a request is the request's own ``RequestPerfMetrics.first_iter`` / ``last_iter``,
known when the request finishes. So the ledger holds a finished request back (its spans and metrics
not recorded yet) until the stats of its last iteration have arrived and every iteration it spans
has all its scheduled requests accounted for, then hands the complete steps to the core
(``Pipeline.add_step``) and finishes the request (``Pipeline.finish``); its token stamps are put at
the ends of the iterations that produced them then (``decode_stamps``), so its decode-step spans link
those iterations. A request waits at most
``wait_s`` (the ``iteration_wait`` option; then it finishes with the steps known by then). Before any
stats were seen nothing waits, unless the LLM was built with ``enable_iter_perf_stats`` (then from the
first request). Memory is bounded: at most ``max_steps`` iterations and ``max_waiting`` requests.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping

from ... import semconv as sc
from ...core.materializer import Materializer
from ...core.summary import RequestSummary
from ...core.timeline import RequestTimeline, StepRecord
from ...guard import Guard

_TIMESTAMP_FORMATS = ("%m-%d-%Y %H:%M:%S.%f", "%m-%d-%Y %H:%M:%S")


def _num(d: Mapping[str, Any] | None, key: str) -> Any:
    v = d.get(key) if d else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _start_wall(stats: Mapping[str, Any]) -> float | None:
    raw = stats.get("timestamp")
    if not isinstance(raw, str):
        return None
    for fmt in _TIMESTAMP_FORMATS:
        try:
            return datetime.strptime(raw, fmt).timestamp()  # naive: local time, as the engine wrote it
        except ValueError:
            continue
    return None


@dataclass(slots=True)
class Iteration:
    """One iteration as its stats describe it, waiting for the requests it served."""

    step: StepRecord
    scheduled: int  # requests the engine scheduled in it: the shares we wait for
    context_requests: int
    context_tokens: int
    members: list[tuple[str, int, bool]] = field(default_factory=list)


def iteration_from_stats(stats: Mapping[str, Any], now_mono: float, now_wall: float) -> Iteration | None:
    """One stats dict -> an ``Iteration`` (``None`` if it has no ``iter``)."""
    it = stats.get("iter")
    if not isinstance(it, int) or isinstance(it, bool):
        return None
    latency_ms = _num(stats, "iterLatencyMS")
    latency = latency_ms / 1000.0 if latency_ms and latency_ms > 0 else 0.0
    wall = _start_wall(stats)
    if wall is not None:
        start = wall - (now_wall - now_mono)
    else:  # no usable stamp: it ended no later than when we saw it
        start = now_mono - latency
    ifb = stats.get("inflightBatchingStats") or {}
    kv = stats.get("kvCacheStats") or {}
    ctx_reqs = int(_num(ifb, "numContextRequests") or 0)
    gen_reqs = int(_num(ifb, "numGenRequests") or 0)
    ctx_tokens = int(_num(ifb, "numCtxTokens") or 0)
    scheduled = _num(ifb, "numScheduledRequests")
    scheduled = int(scheduled) if scheduled is not None else ctx_reqs + gen_reqs
    avg_decoded = _num(ifb, "avgNumDecodedTokensPerIter")
    used, total = _num(kv, "usedNumBlocks"), _num(kv, "maxNumBlocks")
    attrs: dict[str, Any] = {
        sc.STEP_LATENCY: latency,
        # the engine's own batch composition (the shares we attach only serve to link requests)
        sc.STEP_NUM_PREFILL_REQS: ctx_reqs,
        sc.STEP_NUM_PREFILL_TOKENS: ctx_tokens,
        sc.STEP_NUM_DECODE_REQS: gen_reqs,
        sc.STEP_NUM_DECODE_TOKENS: int(round(gen_reqs * avg_decoded)) if avg_decoded else gen_reqs,
        sc.STEP_BATCH_SIZE: scheduled,
        sc.STEP_PHASE: "mixed" if ctx_reqs and gen_reqs else "prefill" if ctx_reqs else "decode",
    }
    gpu = _num(stats, "gpuMemUsage")
    if gpu is not None:
        attrs[sc.STEP_GPU_MEMORY] = int(gpu)
    if used is not None:
        attrs[sc.STEP_KV_BLOCKS_USED] = int(used)
    if total is not None:
        attrs[sc.STEP_KV_BLOCKS_MAX] = int(total)
    step = StepRecord(
        step_id=it, start=start, end=start + latency, requests=[],
        running=int(_num(stats, "numActiveRequests") or 0),
        waiting=int(_num(stats, "numQueuedRequests") or 0),
        preempted=int(_num(ifb, "numPausedRequests") or 0),
        kv_cache_usage=(used / total) if used is not None and total else None,
        attributes=attrs,
    )
    return Iteration(step, scheduled, ctx_reqs, ctx_tokens)


def decode_stamps(t: RequestTimeline, output_tokens: int | None, first: int, last: int,
                  ends: Mapping[int, float]) -> None:
    """Token stamps at the ends of the iterations that produced them, so the core's decode rows (within
    the span budget) carry and link the iterations behind a request's decode phase: the core ties a
    decode step to the engine step that ended when its token was stamped.

    Which of ``first..last`` produced which token the stats do not say. Without speculative decoding
    each iteration of a running request produces one token, so its token ``j`` (0-based) came from
    iteration ``last - (tokens - 1) + j``: counted back from ``last``, iterations before the first
    token's computed a chunked prompt. With speculative decoding (more tokens than iterations) each
    iteration after the first produced one update of a streamed request, and a request not streamed
    gets its tokens split evenly over them (the total exact).

    * Not streamed: one stamp (its first token, the engine's) becomes one per decode iteration.
    * Streamed: each update is moved from when it reached this process to the end of the iteration
      that produced its last token (the engine's time, as vLLM's stamps are); its token count stays.
      With speculative decoding only when its updates and iterations pair one to one.

    A streamed request whose iterations' stats are not all there keeps its stamps as they are; one not
    streamed hands the tokens of an iteration without stats to the next one. A request that was paused
    inside its range breaks the counting (documented).
    """
    ts = t.token_ts
    if not ts or not ends:
        return
    if t.request_attributes.get(sc.REQUEST_STREAM):
        _retime_updates(t, first, last, ends)
    elif len(ts) == 1:
        _one_stamp_per_iteration(t, (output_tokens or 0) - 1, first, last, ends)


def _retime_updates(t: RequestTimeline, first: int, last: int, ends: Mapping[int, float]) -> None:
    ts = t.token_ts
    counts = [t.tokens_at(i) for i in range(len(ts))]
    tokens = sum(counts)
    if tokens - 1 <= last - first:  # one token per iteration
        base, done, iterations = last - (tokens - 1), counts[0], []
        for n in counts[1:]:
            done += n
            iterations.append(base + done - 1)
    elif len(ts) - 1 == last - first:  # several tokens per iteration, one update per iteration
        iterations = list(range(first + 1, last + 1))
    else:
        return
    new = [ends.get(k) for k in iterations]
    if None in new:  # all or nothing: a mix of the engine's and this process's stamps would mislead
        return
    for i, end in enumerate(new, 1):
        # the engine's and the stats' clocks may disagree a little: never backwards
        ts[i] = end if end >= ts[i - 1] else ts[i - 1]


def _one_stamp_per_iteration(t: RequestTimeline, tokens: int, first: int, last: int,
                             ends: Mapping[int, float]) -> None:
    n = min(last - first, tokens)
    if n <= 0:
        return
    ts = t.token_ts
    base, extra = divmod(tokens, n)
    counts: dict[int, int] = {}
    carry = 0
    for j, k in enumerate(range(last - n + 1, last + 1)):
        carry += base + (j < extra)
        end = ends.get(k)
        if end is None:
            continue
        ts.append(end if end >= ts[-1] else ts[-1])
        if carry > 1:
            counts[len(ts) - 1] = carry
        carry = 0
    if carry and len(ts) > 1:  # the last iterations' stats are missing: their tokens join the last known
        counts[len(ts) - 1] = counts.get(len(ts) - 1, 1) + carry
    t.multi_token_steps = counts or None


@dataclass(slots=True)
class Waiting:
    timeline: RequestTimeline
    summary: RequestSummary
    first: int
    last: int
    deadline: float
    pending: int = 0  # iterations of its range we hold that still miss some of their requests
    ends: dict[int, float] = field(default_factory=dict)  # iteration -> its end, for each it joined


class IterationLedger:
    """Holds iterations and finished requests until they can be tied together (see the module doc).

    Each event costs O(the requests of the iterations it touches), never O(all waiting requests): a
    waiting request counts its incomplete iterations (``pending``) and is ready when that count is 0
    and the stats of its last iteration have arrived; deadlines expire in arrival order.
    """

    def __init__(self, add_step: Callable[[StepRecord], None], finish: Callable[[str, RequestSummary], Any],
                 max_steps: int, max_waiting: int, wait_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic, background: bool = True,
                 guard: Guard | None = None) -> None:
        self._add_step = add_step
        self._finish = finish
        self.max_steps = max_steps
        self.max_waiting = max_waiting
        self.wait_s = wait_s
        self._clock = clock
        self.iterations: OrderedDict[int, Iteration] = OrderedDict()
        self.waiting: OrderedDict[str, Waiting] = OrderedDict()  # in arrival order, so deadlines are ordered
        self.highest = -1  # highest iteration seen
        self.seen_any = False  # stats seen, or announced (expect()): finished requests wait for theirs
        self.dropped_iterations = 0  # evicted before all their requests came
        self.released_early = 0  # requests finished on timeout or overflow, before their steps were complete
        # the user's threads (results, get_stats) and trtllm-serve's event loop all report here
        self._lock = threading.RLock()
        self._submitted: OrderedDict[int, None] = OrderedDict()  # handed to the core: a re-read is ignored
        self._by_last: dict[int, list[str]] = {}  # last iteration -> waiting requests (those whose stats end there)
        self._by_first: dict[int, list[str]] = {}  # first iteration -> waiting requests the sweep has not reached
        self._open: set[str] = set()  # waiting requests whose range the sweep is in
        self._swept = -1
        # The work runs on its own thread (background=True): reading a pull of stats costs in proportion
        # to the requests each iteration served (benchmarks/trtllm_overhead.py, the ledger), and
        # trtllm-serve pulls from its event loop (/metrics), which must not stall on it. The caller only queues. A full queue drops stats (counted) and runs a finish where it is.
        self.stats_dropped = 0
        # guard: the instrumentor's, which counts the worker's errors (its own where built alone, as in tests)
        self._worker = Materializer(self._run, guard if guard is not None else Guard(), max_jobs=max_steps + 4096,
                                    name="otel-llm-tensorrt_llm-iterations") if background else None

    # -- inputs ----------------------------------------------------------------------------------

    def expect(self) -> None:
        """Iteration stats will come (the LLM was built with them on): requests wait from the first one."""
        self.seen_any = True

    def observe(self, stats: Mapping[str, Any]) -> None:
        """One iteration's stats, as the user or the server pulled them (read when they were pulled)."""
        job = ("stats", stats, time.monotonic(), time.time())
        if self._worker is None:
            self._run(job)
        elif not self._worker.submit(job):
            self.stats_dropped += 1

    def _run(self, job: tuple) -> None:
        if job[0] == "stats":
            _, stats, now_mono, now_wall = job
            it = iteration_from_stats(stats, now_mono, now_wall)
            if it is not None:
                with self._lock:
                    self._observe(it)
        else:
            _, t, s, iterations = job
            self._finished(t, s, iterations)

    def sync(self, timeout: float | None = 10.0) -> bool:
        """Wait until what was handed over so far has been worked through."""
        return self._worker.flush(timeout) if self._worker is not None else True

    def close(self, timeout: float = 5.0) -> None:
        self.flush()
        if self._worker is not None:
            self._worker.close(timeout)

    def _observe(self, it: Iteration) -> None:
        k = it.step.step_id
        if k in self.iterations or k in self._submitted:
            return
        self.seen_any = True
        self.iterations[k] = it
        while len(self.iterations) > self.max_steps:
            self._evict(self.iterations.popitem(last=False)[1])
        candidates = []
        # the requests waiting for this iteration join it now (those whose range covers it)
        for w in self._covering(k):
            self._join(it, w)
            candidates.append(w)
        if k > self.highest:
            for last in range(self.highest + 1, k + 1):
                for rid in self._by_last.pop(last, ()):
                    w = self.waiting.get(rid)
                    if w is not None:
                        candidates.append(w)
            self.highest = k
        self._settle(candidates)

    def _covering(self, k: int) -> list[Waiting]:
        """Waiting requests whose range covers ``k``, by a sweep over iteration numbers (they arrive in
        order): O(the requests open at ``k``), not O(all waiting)."""
        for j in range(self._swept + 1, k + 1):
            self._open.update(self._by_first.pop(j, ()))
        self._swept = max(self._swept, k)
        out = []
        for rid in list(self._open):
            w = self.waiting.get(rid)
            if w is None or w.last < k:
                self._open.discard(rid)  # released, or its range is behind the sweep
            elif w.first <= k:
                out.append(w)
        return out

    def finished(self, t: RequestTimeline, s: RequestSummary, iterations: tuple[int, int] | None) -> None:
        """A request TensorRT-LLM has finished; its spans are built once its iterations are settled."""
        job = ("finished", t, s, iterations)
        if self._worker is None or not self._worker.submit(job):
            self._run(job)  # never lose a request: a full queue finishes it here

    def _finished(self, t: RequestTimeline, s: RequestSummary, iterations: tuple[int, int] | None) -> None:
        with self._lock:
            if iterations is None or not self.seen_any:
                self._finish(t.request_id, s)
                self._expire()
                return
            self._wait(t, s, iterations)

    def _wait(self, t: RequestTimeline, s: RequestSummary, iterations: tuple[int, int]) -> None:
        w = Waiting(t, s, iterations[0], iterations[1], self._clock() + self.wait_s)
        self.waiting[t.request_id] = w
        if w.last > self.highest:
            self._by_last.setdefault(w.last, []).append(t.request_id)
            # iterations of its range still to come: the sweep picks it up
            if w.first > self._swept:
                self._by_first.setdefault(w.first, []).append(t.request_id)
            else:
                self._open.add(t.request_id)
        candidates = [w]
        for k in range(w.first, w.last + 1):
            it = self.iterations.get(k)
            if it is not None:
                was_complete = self._complete(it)
                self._join(it, w)
                if not was_complete and self._complete(it):
                    candidates.extend(self._member_waits(it))
        while len(self.waiting) > self.max_waiting:
            self._release_one(next(iter(self.waiting)), early=True)
        self._settle(candidates)

    # -- settlement ------------------------------------------------------------------------------

    def _join(self, it: Iteration, w: Waiting) -> None:
        # A request's first iteration computed (the start of) its prompt; which later ones continued a
        # chunked prompt the stats do not say, so those count as decode. Its prompt tokens in that
        # iteration: the engine's context-token count when it was the only context request, else its
        # prompt length. The step span itself carries the engine's own counts.
        t = w.timeline
        was_complete = self._complete(it)
        w.ends[it.step.step_id] = it.step.end
        if it.step.step_id == w.first:
            tokens = it.context_tokens if it.context_requests == 1 else (t.input_tokens or 0)
            it.members.append((t.request_id, tokens, True))
        else:
            it.members.append((t.request_id, 1, False))
        if was_complete:
            return  # more requests than it scheduled (paused ones in their range): nothing to wait for
        if self._complete(it):
            for m in self._member_waits(it):
                if m is not w:
                    m.pending -= 1
        else:
            w.pending += 1

    def _member_waits(self, it: Iteration) -> list[Waiting]:
        out = []
        for rid, _, _ in it.members:
            w = self.waiting.get(rid)
            if w is not None:
                out.append(w)
        return out

    @staticmethod
    def _complete(it: Iteration) -> bool:
        return len(it.members) >= it.scheduled

    def _evict(self, it: Iteration) -> None:
        # held too long (past max_steps): its requests stop waiting for it, and it is not emitted
        self.dropped_iterations += 1
        if not self._complete(it):
            for w in self._member_waits(it):
                w.pending -= 1

    def _ready(self, w: Waiting) -> bool:
        return w.pending <= 0 and self.highest >= w.last

    def _settle(self, candidates: list[Waiting]) -> None:
        for w in candidates:
            if w.timeline.request_id in self.waiting and self._ready(w):
                self._release_one(w.timeline.request_id, early=False)
        self._expire()

    def _expire(self) -> None:
        if not self.waiting:
            return
        now = self._clock()
        while self.waiting:
            rid, w = next(iter(self.waiting.items()))
            if now < w.deadline:
                return
            self._release_one(rid, early=not self._ready(w))

    def release(self, force: bool = False) -> None:
        """Finish what waited past its bound (every waiting request with ``force``)."""
        with self._lock:
            if force:
                for rid in list(self.waiting):
                    if rid in self.waiting:
                        self._release_one(rid, early=not self._ready(self.waiting[rid]))
            else:
                self._expire()

    def _release_one(self, rid: str, early: bool) -> None:
        w = self.waiting.pop(rid)
        if early:
            self.released_early += 1
        self._open.discard(rid)
        for index, key in ((self._by_first, w.first), (self._by_last, w.last)):
            rids = index.get(key)
            if rids is not None and rid in rids:
                rids.remove(rid)
                if not rids:
                    del index[key]
        # its iterations go to the core now (with every request that joined them so far, all of them
        # still unfinished there), so the core links each to the kept requests it served
        for k in range(w.first, w.last + 1):
            it = self.iterations.pop(k, None)
            if it is None:
                continue
            if not self._complete(it):  # the others waiting on it stop waiting: it has gone to the core
                for m in self._member_waits(it):
                    if m is not w:
                        m.pending -= 1
            it.step.requests = it.members
            self._add_step(it.step)
            self._submitted[k] = None
            if len(self._submitted) > self.max_steps:
                self._submitted.popitem(last=False)
        decode_stamps(w.timeline, w.summary.output_tokens, w.first, w.last, w.ends)
        self._finish(rid, w.summary)

    def flush(self, timeout: float | None = 10.0) -> None:
        self.sync(timeout)
        self.release(force=True)

    def held(self) -> dict[str, int]:
        """Sizes of what is held (tests assert nothing outlives its request)."""
        return {"iterations": len(self.iterations), "waiting": len(self.waiting), "open": len(self._open),
                "by_first": sum(map(len, self._by_first.values())), "by_last": sum(map(len, self._by_last.values()))}
