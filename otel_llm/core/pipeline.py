"""The cold path, shared by every engine adapter: finish -> decide -> spans -> metrics -> steps.

Adapters keep a ``RequestTimeline`` per in-flight request (through ``start``), append
engine stamps to it on the hot path, feed engine steps to ``add_step``, and call
``finish`` once with the engine's own numbers in a ``RequestSummary``.
"""

from __future__ import annotations

import atexit
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.metrics import Meter
from opentelemetry.trace import NonRecordingSpan, Tracer

from .clock import WallClock
from .config import Config, Detail
from .diagnosis.verdict import StepWindow, decide as slow_verdict
from .diagnosis.anatomy import StepDiagnosis
from .guard import GUARD
from .inter_token import gap_summary
from .materializer import Materializer
from . import self_metrics
from .metrics import ServerMetrics
from .policies import (NOT_SAMPLED, Decision, ErrorPolicy, LatencyPercentilePolicy, Policy, ProbabilisticPolicy,
                       SLOPolicy, TraceView, Verdict, first_match)
from .spans import Materialized, SpanBuilder, request_attributes, yield_gil
from .summary import RequestSummary
from .timeline import PrefillChunk, RequestTimeline, StepRecord


@dataclass
class Counts:
    requests_started: int = 0
    requests_finished: int = 0
    requests_untracked: int = 0  # over max_requests: metrics only
    requests_kept: int = 0
    requests_spans_dropped: int = 0  # kept requests whose spans the full materializer queue refused
    steps_recorded: int = 0
    steps_emitted: int = 0
    steps_settled_early: int = 0


class Pipeline:
    """One engine's request pipeline: a finished request is decided, measured, and (if kept) built into spans.

    Decisions and metrics run where a request finishes (cheap, O(1)); spans and engine-step
    settlement run on the materializer thread, in order, so the engine's thread never builds spans."""

    def __init__(self, config: Config, tracer: Tracer, meter: Meter, engine: str) -> None:
        self.config = config
        self.engine = engine
        self.spans = SpanBuilder(tracer, config.direct_export, config.max_spans_per_request,
                                 config.engine_step_service)
        self.metrics = ServerMetrics(meter, config.slo)
        causes: list[Policy] = [ErrorPolicy("error"), SLOPolicy(config.slo)]
        if config.tail_quantile > 0:
            causes.append(LatencyPercentilePolicy(config.tail_quantile))
        self.causes = causes
        self._cause_names = frozenset(p.name for p in causes)
        self.baseline = ProbabilisticPolicy(config.sample_rate)
        self.requests: dict[str, RequestTimeline] = {}
        self.steps: OrderedDict[int, StepRecord] = OrderedDict()
        self.window = StepWindow(config.max_steps)  # every step, compactly, for the slow-cause verdict
        self._steps_lock = threading.Lock()  # the engine's thread adds steps, the materializer settles them
        self.counts = Counts()
        # per-step anatomy and roofline; the vLLM adapter configures the model and device when it builds
        self.diagnosis = StepDiagnosis(meter)
        self._step_metrics: list[StepRecord] = []  # steps whose metrics this frontend records, in batches
        self.materializer = Materializer(self._materialize, name=f"otel-llm-{engine}")
        # registered after the materializer's own exit hook, so it runs first (atexit is LIFO): it
        # builds what is queued, then sends what we export directly; providers made earlier shut down after
        atexit.register(self.flush, 2.0)
        self_metrics.register(meter, engine, self.stats)

    def stats(self) -> dict[str, int]:
        """What happened to the telemetry so far: requests kept, spans sent and dropped (counts)."""
        out = dict(vars(self.counts))
        wire = self.spans.direct
        if wire is not None:
            out["direct_spans_sent"] = wire.counts.spans_sent
            out["direct_spans_dropped"] = wire.counts.spans_dropped
            out["direct_requests_failed"] = wire.counts.requests_failed
        return out

    # -- hot-path bookkeeping (adapters call these; O(1)) ------------------------------------

    def start(self, timeline: RequestTimeline) -> bool:
        if len(self.requests) >= self.config.max_requests:
            self.counts.requests_untracked += 1
            return False
        self.requests[timeline.request_id] = timeline
        self.counts.requests_started += 1
        return True

    def add_step(self, step: StepRecord) -> None:
        """An engine step, as the scheduler saw it; ties it to the requests it served."""
        self.counts.steps_recorded += 1
        requests = self.requests
        pending = prefill_tokens = prefill_requests = 0
        step_id = step.step_id
        for rid, tokens, prefill in step.requests:
            t = requests.get(rid)
            if prefill:  # (the same two tests a share costs without the counts)
                prefill_tokens += tokens
                prefill_requests += 1
                if t is not None:
                    t.chunks.append(PrefillChunk(step_id, step.start, step.end, tokens))
            if t is None:
                continue
            pending += 1
            t.steps.append(step_id)
        self.window.add(step, prefill_tokens, len(step.requests) - prefill_requests)
        if not pending or not self.config.engine_steps:
            return
        # Metrics count each step once: in the frontend that owns its first request (with several API
        # servers each receives every step). Recorded on the materializer thread, in batches.
        counted = step.requests[0][0] in requests
        step.pending = pending
        evicted = []
        full = False
        with self._steps_lock:
            if counted:
                batch = self._step_metrics
                batch.append(step)
                full = len(batch) >= _STEP_BATCH or step.end - batch[0].end > _STEP_BATCH_S
            self.steps[step.step_id] = step
            while len(self.steps) > self.config.max_steps:
                evicted.append(self.steps.popitem(last=False)[1])
        for old in evicted:
            self.counts.steps_settled_early += 1
            self.materializer.submit((old, None, None, None))
        if full:
            self._submit_step_metrics()

    # -- cold path ---------------------------------------------------------------------------

    def decide(self, t: RequestTimeline, s: RequestSummary) -> tuple[Decision, Detail]:
        parent = trace.get_current_span(t.parent).get_span_context() if t.parent is not None else None
        if parent is not None and parent.is_valid and not parent.trace_flags.sampled:
            # the caller chose not to trace: no spans; still evaluate so rolling quantiles see it
            first_match(self.causes, TraceView(parent.trace_id, (s,)), _policy_failed)
            return Decision(Verdict.NOT_SAMPLED, "parent_not_sampled"), Detail.REQUEST
        trace_id = parent.trace_id if parent is not None and parent.is_valid else random.getrandbits(128)
        view = TraceView(trace_id, (s,))
        cause = first_match(self.causes, view, _policy_failed)
        if cause.sampled:
            return cause, self.config.detail
        base = self.baseline.evaluate(view)
        if base.sampled:
            return base, self.config.baseline_detail
        return NOT_SAMPLED, Detail.REQUEST

    def finish(self, request_id: str, s: RequestSummary) -> Decision:
        """Settle a finished (or aborted, or failed) request; releases everything held for it."""
        t = self.requests.pop(request_id, None)
        self.counts.requests_finished += 1
        if t is None:  # untracked: metrics only
            self.metrics.record(s)
            return NOT_SAMPLED
        decision, detail = self.decide(t, s)
        # spans, metrics and step settlement: all off this (the engine's) thread, in order
        if self.materializer.submit((t, s, decision if decision.sampled else None, detail)):
            return decision
        if decision.sampled:  # the materializer is far behind: keep what is cheap, count the rest
            self.counts.requests_spans_dropped += 1
        _add_gaps(t, s)
        self.metrics.record(s)
        self._settle_steps(t, None)
        return decision

    def _submit_step_metrics(self) -> None:
        with self._steps_lock:  # flush() may come from another thread than add_step's
            batch, self._step_metrics = self._step_metrics, []
        if batch:
            self.materializer.submit((batch, None, None, None))

    def flush(self, timeout: float | None = 10.0) -> bool:
        self._submit_step_metrics()
        """Wait until every finished request's spans were handed to the span processors (and the
        decode steps we encode ourselves were sent)."""
        return self.materializer.flush(timeout) and self.spans.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Emit what is held (steps serving kept requests) and stop the materializer."""
        self._submit_step_metrics()
        self.materializer.submit((None, None, None, None))
        self.materializer.close(timeout)
        self.diagnosis.close()
        self.spans.close(timeout)
        atexit.unregister(self.flush)

    # -- on the materializer thread ------------------------------------------------------------

    def _materialize(self, job: tuple) -> None:
        t, s, decision, detail = job
        if isinstance(t, list):  # engine steps' metrics
            try:
                self.diagnosis.record(t)
            except Exception as exc:
                GUARD.failed("engine step metrics", exc)
            return
        if isinstance(t, StepRecord):  # settled early: its requests outlived the step buffer
            self._emit_step(t)
            return
        if t is None:  # close(): emit the steps still held
            with self._steps_lock:
                held = list(self.steps.values())
                self.steps.clear()
            for step in held:
                self._emit_step(step)
            return
        kept: Materialized | None = None
        _add_gaps(t, s)
        slo = self.config.slo.for_model(s.model)
        breached = slo.breaches(s)
        for_cause = decision is not None and decision.reason.partition(":")[0] in self._cause_names
        verdict = None
        if breached or for_cause:  # why was it slow: for kept requests, and for every breach's counter
            try:
                verdict = slow_verdict(t, self.window, breached)
                s.slow_cause = verdict.cause
            except Exception as exc:  # a bug of ours costs the verdict only
                GUARD.failed("slow-cause verdict", exc)
        if decision is not None:
            try:
                attrs = request_attributes(t, s, decision.reason, not breached and not s.failed, breached,
                                           self.config.capture_content)
                if verdict is not None and for_cause:
                    attrs.update(verdict.attributes())
                held = self._held_steps(t) if detail >= Detail.PHASES else []
                kept = self.spans.request(t, s, attrs, detail, WallClock(), held, slo.tpot)
                if kept is not None:
                    self.counts.requests_kept += 1
            except Exception as exc:  # a bug of ours (or a span processor's) costs these spans only
                GUARD.failed("request spans", exc)
        span_ctx = kept.context if kept is not None else None
        # metrics cover every request, whatever happened to its spans; the exemplar points at it
        self.metrics.record(s, trace.set_span_in_context(NonRecordingSpan(span_ctx)) if span_ctx else None)
        # engine steps are the most detailed layer: those behind a full-detail request's own chunk and
        # decode-step spans (the span budget bounds them) link to it
        self._settle_steps(t, kept if detail >= Detail.STEPS else None)

    def _held_steps(self, t: RequestTimeline) -> list[StepRecord]:
        """The engine steps of ``t`` still held (all of them, unless it outlived ``max_steps`` steps)."""
        with self._steps_lock:
            steps = self.steps
            return [st for st in map(steps.get, t.steps) if st is not None]

    def _settle_steps(self, t: RequestTimeline, kept: Materialized | None) -> None:
        done = []
        linked = kept.linked_steps if kept is not None else ()
        with self._steps_lock:
            steps = self.steps
            for step_id in t.steps:
                step = steps.get(step_id)
                if step is None:
                    continue
                if step_id in linked:
                    step.links.append(kept.context)
                step.pending -= 1
                if step.pending <= 0:
                    del steps[step_id]
                    done.append(step)
        for step in done:
            if step.links:  # only emitted steps cost enough to offer the GIL between them
                self._emit_step(step)
                yield_gil()

    def _emit_step(self, step: StepRecord) -> None:
        if step.links:
            try:
                extra = self.diagnosis.attributes(step)
            except Exception as exc:  # the step span still goes out, without the diagnosis
                GUARD.failed("engine step diagnosis", exc)
                extra = None
            self.spans.engine_step(step, WallClock(), self.engine, extra)
            self.counts.steps_emitted += 1


# The former name (until 2026-11-30), while branches written against it land; use ``Pipeline``.
Pipeline = Pipeline

_STEP_BATCH = 32  # steps per metrics job
_STEP_BATCH_S = 1.0  # ... or fewer, once the oldest waited this long (engine monotonic seconds)


def _add_gaps(t: RequestTimeline, s: RequestSummary) -> None:
    """Inter-token latencies for every request, from its token stamps, unless the adapter gave them."""
    if s.gaps is None:
        try:
            s.gaps = gap_summary(t.token_ts, t.multi_token_steps)
        except Exception as exc:  # a bug of ours costs this request's inter-token latencies only
            GUARD.failed("inter-token latencies", exc)
            return
        if s.gaps is not None and s.max_gap is None:
            s.max_gap = s.gaps.max_gap


def _policy_failed(policy: Policy, exc: BaseException) -> None:
    GUARD.failed(f"policy {getattr(policy, 'name', policy)!s}", exc)
