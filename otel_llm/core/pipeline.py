"""The cold path, shared by every engine adapter: finish -> decide -> spans -> metrics -> steps.

``RequestPipeline`` is what adapters call; ``Pipeline`` (here) does the work in the process it runs in,
``agent_pipeline.AgentPipeline`` hands each request's start and finish to an agent process that runs a
``Pipeline`` of its own. Which one serves an instrumentation is chosen by its owner, once.

Adapters keep a ``RequestTimeline`` per in-flight request (through ``start``), append
engine stamps to it on the hot path, feed engine steps to ``add_step``, and call
``finish`` once with the engine's own numbers in a ``RequestSummary``. The pipeline registers no
exit hook: its owner (the instrumentor) flushes it at exit, through its ``Lifecycle``.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.metrics import Meter
from opentelemetry.trace import NonRecordingSpan, Tracer

from .. import semconv as sc
from .clock import WallClock
from .config import Config, Detail
from .diagnosis.verdict import StepWindow, decide as slow_verdict, note_frontend
from .diagnosis.anatomy import EngineFacts, StepDiagnosis
from .diagnosis.engine_time import StepTime, busy, engine_time, interference_caused
from .finish_facts import FinishFacts, settle
from ..guard import Guard
from .inter_token import gap_summary
from .lora import AdapterNames, AdapterStepMetrics, request_load_events, span_parts
from .materializer import Materializer
from . import self_metrics
from .metrics import ServerMetrics
from .sampling import (NOT_SAMPLED, Decision, ErrorPolicy, LatencyPercentilePolicy, Policy, ProbabilisticPolicy,
                       SLOPolicy, TraceView, Verdict, first_match)
from .span_routes import RouterFactory
from .spans import (Materialized, SpanBuilder, attribution_attributes, choice_attributes, group_attributes,
                    request_attributes, yield_gil)
from .spec_decode import add_to_requests
from .step_runs import StepRuns
from .step_tokens import token_times
from .summary import RequestSummary
from .timeline import PrefillChunk, RequestGroup, RequestTimeline, StepRecord


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
    # token times from the engine steps: finished requests whose steps did not add up to vLLM's token
    # count (a step record lost or settled early): they keep vLLM's TTFT/TPOT/e2e, not inter-token latencies
    token_times_unplaced: int = 0


# -- the materializer's jobs: one record type per kind of work, handled in submission order ----------

@dataclass(slots=True, frozen=True)
class RequestJob:
    """A finished request: its spans (if ``decision`` kept it), metrics and step settlement."""
    timeline: RequestTimeline
    summary: RequestSummary
    decision: Decision | None  # None: not kept (metrics and settlement only)
    detail: Detail


@dataclass(slots=True, frozen=True)
class GroupJob:
    """A user request whose n > 1 sequences all finished: one trace, one decision, for all of them."""
    group: RequestGroup
    decision: Decision | None
    detail: Detail


@dataclass(slots=True, frozen=True)
class StepMetricsJob:
    """Engine steps whose metrics this frontend records (in batches)."""
    steps: list[StepRecord]


@dataclass(slots=True, frozen=True)
class EarlyStepJob:
    """A step evicted from the buffer before its requests finished: emitted as it is."""
    step: StepRecord


@dataclass(slots=True, frozen=True)
class CloseJob:
    """``close()``: emit the steps still held."""


Job = RequestJob | GroupJob | StepMetricsJob | EarlyStepJob | CloseJob


class RequestPipeline(Protocol):
    """What an adapter hands a request's telemetry to: ``Pipeline`` (the work done in this process) or
    ``agent_pipeline.AgentPipeline`` (done by an agent process). The adapters call nothing else."""

    config: Config
    engine: str
    guard: Guard
    counts: Counts
    requests: dict[str, RequestTimeline]  # in-flight requests' timelines, by request id (the hot path's)

    def start(self, timeline: RequestTimeline) -> bool: ...
    def add_step(self, step: StepRecord) -> None: ...
    def finish(self, request_id: str, s: RequestSummary) -> Decision: ...
    def finish_facts(self, facts: FinishFacts) -> Decision: ...
    def engine_built(self, facts: EngineFacts) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def flush(self, timeout: float | None = 10.0) -> bool: ...
    def close(self, timeout: float = 5.0) -> None: ...


def admit(pipeline: RequestPipeline, timeline: RequestTimeline) -> bool:
    """Hold ``timeline`` among ``pipeline``'s in-flight requests, unless ``max_requests`` are held (then it
    gets metrics only: counted untracked, and its user request's trace is built without it)."""
    if len(pipeline.requests) >= pipeline.config.max_requests:
        pipeline.counts.requests_untracked += 1
        if timeline.group is not None:
            timeline.group.expected -= 1
        return False
    pipeline.requests[timeline.request_id] = timeline
    return True


class Pipeline:
    """One engine's request pipeline, in this process (a ``RequestPipeline``): a finished request is decided, measured, and (if kept) built into spans.

    Decisions and metrics run where a request finishes (cheap, O(1)); spans and engine-step
    settlement run on the materializer thread, in order, so the engine's thread never builds spans."""

    def __init__(self, config: Config, tracer: Tracer, meter: Meter, engine: str,
                 router: RouterFactory | None = None, guard: Guard | None = None) -> None:
        """``router``: how spans reach export (``otel_llm.otlp.routes.Router``, which the instrumentors hand
        over: the OTLP wire route where the provider allows); without one, the public API's routes.
        ``guard``: the owner's (the instrumentor's), which counts every error caught here and in what the
        pipeline builds (its own where it is built alone, as in tests)."""
        self.config = config
        self.engine = engine
        self.guard = guard = guard if guard is not None else Guard()
        self.spans = SpanBuilder(tracer, config.direct_export, config.max_spans_per_request,
                                 config.engine_step_service, router, guard)
        self.metrics = ServerMetrics(meter, config.slo)
        causes: list[Policy] = [ErrorPolicy("error"), SLOPolicy(config.slo)]
        if config.tail_quantile > 0:
            causes.append(LatencyPercentilePolicy(config.tail_quantile))
        self.causes = causes
        self._cause_names = frozenset(p.name for p in causes)
        self.baseline = ProbabilisticPolicy(config.sample_rate)
        self.requests: dict[str, RequestTimeline] = {}
        # held engine steps, in the order they arrived (StepRecord.seq): a step that served a tracked request
        # stays until no request that may be in it is left to settle (see _settle_steps), or max_steps push it out
        self.steps: OrderedDict[int, StepRecord] = OrderedDict()
        self._runs = StepRuns()  # the same steps as runs of an unchanged batch: a request's own steps found per run
        self._seq = 0  # steps held so far: a request started at seq s is only in steps of seq > s
        # tracked requests not settled yet (finished ones too, until the materializer is done with them), in
        # the order they started: the first one's ``steps_from`` is the oldest step that may still be theirs
        self._unsettled: dict[str, RequestTimeline] = {}
        self.window = StepWindow(config.max_steps)  # every step, compactly, for the slow-cause verdict
        self._last_end: dict[int, float] = {}  # engine -> its latest step's end: each step's busy time
        self._busy: dict[int, StepTime] = {}  # held step id -> its busy time (core/diagnosis/engine_time.py)
        self.adapters = AdapterNames()  # LoRA adapter ids -> names, for step spans (adapters set max_loras)
        # the steps' adapters as metrics, labelled with the request metrics' bounded labels (one cap for all)
        self.adapter_steps = AdapterStepMetrics(meter, self.adapters, self.metrics.adapters)
        self._steps_lock = threading.Lock()  # the engine's thread adds steps, the materializer settles them
        self.counts = Counts()
        # per-step anatomy and roofline; the vLLM adapter configures the model and device when it builds
        self.diagnosis = StepDiagnosis(meter, guard)
        self._step_metrics: list[StepRecord] = []  # steps whose metrics this frontend records, in batches
        self.materializer = Materializer(self._materialize, guard, name=f"otel-llm-{engine}")
        self_metrics.register(meter, engine, self.stats, guard)

    def engine_built(self, facts: EngineFacts) -> None:
        """An engine was built (or one built earlier is instrumented again): the step diagnosis set up for it."""
        self.diagnosis.setup(facts.model, self.config, facts.on_cuda, facts.devices)
        self.window.max_loras = facts.max_loras
        self.diagnosis.kv_cache = facts.kv_cache

    def stats(self) -> dict[str, int]:
        """What happened to the telemetry so far: requests kept, spans sent and dropped (counts)."""
        out = dict(vars(self.counts))
        out["lora_labels_collapsed"] = self.metrics.adapters.collapsed
        out["tenant_labels_collapsed"] = self.metrics.tenants.collapsed
        wire = self.spans.direct
        if wire is not None:
            out["direct_spans_sent"] = wire.counts.spans_sent
            out["direct_spans_dropped"] = wire.counts.spans_dropped
            out["direct_requests_failed"] = wire.counts.requests_failed
        return out

    def latest_step_end(self) -> float | None:
        """The latest end of a step added so far, over its engines (their monotonic clock); None before any."""
        return max(self._last_end.values(), default=None)

    # -- hot-path bookkeeping (adapters call these; O(1)) ------------------------------------

    def start(self, timeline: RequestTimeline) -> bool:
        if not admit(self, timeline):
            return False
        rid = timeline.request_id
        if timeline.lora_id is not None:
            self.adapters.note(timeline.lora_id, timeline.lora_name)
        timeline.steps_from = self._seq + 1
        with self._steps_lock:
            unsettled = self._unsettled
            if rid in unsettled:  # an id reused before its earlier request settled: keep start order
                del unsettled[rid]
            unsettled[rid] = timeline
        self.counts.requests_started += 1
        return True

    def add_step(self, step: StepRecord) -> None:
        """An engine step, as the scheduler saw it. O(1) per step but for its prefilling shares: which
        steps served a request is worked out when it finishes (``_own_steps``: for its engine time, and for the
        verdict and spans that read them), not by touching each request in each step."""
        self.counts.steps_recorded += 1
        # its time past the engine's previous step (overlapping steps counted once: core/diagnosis/engine_time.py)
        engine, end = step.step_id >> 32, step.end
        previous = self._last_end.get(engine)
        step_busy = busy(step.start, end, previous)
        if previous is None or end > previous:
            if previous is None and len(self._last_end) >= 64:  # engines come and go (restarts)
                self._last_end.clear()
            self._last_end[engine] = end
        requests = self.requests
        ids = step.ids
        prefill_at = step.prefill_at
        prefill_tokens = 0
        if prefill_at:  # a few shares a step at most (new prompts' chunks): each request's own chunks
            step_id, start, end, tokens = step.step_id, step.start, step.end, step.tokens
            for i in prefill_at:
                n = tokens[i] if tokens is not None else 1
                prefill_tokens += n
                t = requests.get(ids[i])
                if t is not None:
                    t.chunks.append(PrefillChunk(step_id, start, end, n))
        if step.spec is not None:  # speculative decoding: each request's drafts and acceptances, as counted
            add_to_requests(step.spec, ids, requests)
        grammar = step.grammar
        if grammar is not None and (grammar.hit_at or grammar.miss_at):  # first scheduled: its grammar reused?
            for at, hit in ((grammar.hit_at, True), (grammar.miss_at, False)):
                for i in at:
                    t = requests.get(ids[i])
                    if t is not None:
                        t.request_attributes[sc.STRUCTURED_OUTPUT_CACHE_HIT] = hit
        self.window.add(step, prefill_tokens, len(ids) - len(prefill_at))
        if not ids:
            return
        # Metrics count each step once: in the frontend that owns its first request (with several API
        # servers each receives every step). Recorded on the materializer thread, in batches.
        counted = ids[0] in requests
        if not counted and not any(map(requests.__contains__, ids)):  # (in C; stops at the first of ours)
            return  # serves no request tracked here: not held
        counted = counted and self.config.engine_steps
        evicted = []
        full = False
        with self._steps_lock:
            self._seq += 1
            step.seq = self._seq
            if counted:
                batch = self._step_metrics
                batch.append(step)
                full = len(batch) >= _STEP_BATCH or step.end - batch[0].end > _STEP_BATCH_S
            steps = self.steps
            runs = self._runs
            if step.step_id in steps:  # a reused id: held in arrival order all the same
                del steps[step.step_id]
                steps[step.step_id] = step
                runs.rebuild(steps.values())
            else:
                steps[step.step_id] = step
                runs.add(step)
            self._busy[step.step_id] = StepTime(step_busy, len(ids) if step.tokens is None else None)
            while len(steps) > self.config.max_steps:
                old = steps.popitem(last=False)[1]
                runs.drop_oldest()
                self._busy.pop(old.step_id, None)
                lost = self._lose(old)
                if lost or old.links:
                    evicted.append((old, lost))
        if self.config.engine_steps:
            for old, lost in evicted:
                self.counts.steps_settled_early += lost  # its requests outlived the buffer
                self.materializer.submit(EarlyStepJob(old))  # emitted if linked
        if full:
            self._submit_step_metrics()

    def _lose(self, step: StepRecord) -> bool:
        """``step`` leaves the buffer (under the lock): the requests it served that are still to settle lose
        it (their verdict then cannot place them: unknown). True if there were such requests."""
        unsettled = self._unsettled
        lost = False
        for rid in step.ids:
            t = unsettled.get(rid)
            if t is not None and t.steps_from <= step.seq:
                t.steps_lost = lost = True
        return lost

    # -- cold path ---------------------------------------------------------------------------

    def decide(self, t: RequestTimeline, summaries: tuple[RequestSummary, ...]) -> tuple[Decision, Detail]:
        """One decision per trace: a request's, or all the sequences' of a user request with n > 1."""
        parent = trace.get_current_span(t.parent).get_span_context() if t.parent is not None else None
        if parent is not None and parent.is_valid and not parent.trace_flags.sampled:
            # the caller chose not to trace: no spans; still evaluate so rolling quantiles see it
            first_match(self.causes, TraceView(parent.trace_id, summaries), self._policy_failed)
            return Decision(Verdict.NOT_SAMPLED, "parent_not_sampled"), Detail.REQUEST
        trace_id = parent.trace_id if parent is not None and parent.is_valid else random.getrandbits(128)
        view = TraceView(trace_id, summaries)
        cause = first_match(self.causes, view, self._policy_failed)
        if cause.sampled:
            return cause, self.config.detail
        base = self.baseline.evaluate(view)
        if base.sampled:
            return base, self.config.baseline_detail
        if t.request_attributes.get(sc.DISAGG_ROLE) == sc.DISAGG_ROLE_PREFILL:
            # the prefill half of a disaggregated request (a kv_producer instance's): whether the user's
            # request breached is decided on the decode instance, later; export this half at phase detail
            # so that the gateway, which sees both halves of the trace, can keep it whole. (Not kv_both: an
            # engine that offloads its own KV cache serves whole requests.)
            return _HANDOFF_KEPT, max(Detail.PHASES, self.config.baseline_detail)
        return NOT_SAMPLED, Detail.REQUEST

    def finish_facts(self, facts: FinishFacts) -> Decision:
        """Settle a finished request from the engine's own numbers (core/finish_facts.py): its summary made
        here, then ``finish``."""
        return self.finish(facts.request_id, settle(self.requests.get(facts.request_id), facts))

    def finish(self, request_id: str, s: RequestSummary) -> Decision:
        """Settle a finished (or aborted, or failed) request; releases everything held for it."""
        t = self.requests.pop(request_id, None)
        self.counts.requests_finished += 1
        if t is None:  # untracked: metrics only (no token stamps: no inter-token latencies)
            self.metrics.record(s)
            return NOT_SAMPLED
        if t.spec is not None and s.spec_draft_tokens is None:
            s.spec_verify_steps, s.spec_draft_tokens, s.spec_accepted_tokens = t.spec
        if t.lora_name is not None and s.lora is None:
            s.lora = t.lora_name
        if s.disagg_role is None:  # which half of a disaggregated request (its metrics are labelled by it)
            s.disagg_role = t.request_attributes.get(sc.DISAGG_ROLE)
        if s.tenant is None:  # its tenant (core/tenant.py: cleaned where the adapter read it)
            s.tenant = t.request_attributes.get(sc.REQUEST_TENANT)
        group = t.group
        if group is not None:  # one of n sequences: the user request is decided, and traced, as one
            group.finished.append((t, s))
            if not group.complete:
                return _GROUP_PENDING
            decision, detail = self.decide(t, tuple(x for _, x in group.finished))
            job: Job = GroupJob(group, decision if decision.sampled else None, detail)
        else:
            decision, detail = self.decide(t, (s,))
            job = RequestJob(t, s, decision if decision.sampled else None, detail)
        # spans, metrics and step settlement: all off this (the engine's) thread, in order
        if self.materializer.submit(job):
            return decision
        if decision.sampled:  # the materializer is far behind: keep what is cheap, count the rest
            self.counts.requests_spans_dropped += 1
        for member, summary in group.finished if group is not None else ((t, s),):
            self._tokens_from_steps(member)
            self._add_gaps(member, summary)
            self.metrics.record(summary)
            self._settle_steps(member, None)
        return decision

    def _submit_step_metrics(self) -> None:
        with self._steps_lock:  # flush() may come from another thread than add_step's
            batch, self._step_metrics = self._step_metrics, []
        if batch:
            self.materializer.submit(StepMetricsJob(batch))

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every finished request's spans were handed to the span processors (and the
        decode steps we encode ourselves were sent)."""
        self._submit_step_metrics()
        return self.materializer.flush(timeout) and self.spans.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Emit what is held (steps serving kept requests) and stop the materializer."""
        self._submit_step_metrics()
        self.materializer.submit(CloseJob())
        self.materializer.close(timeout)
        self.diagnosis.close()
        self.spans.close(timeout)

    # -- on the materializer thread ------------------------------------------------------------

    def _materialize(self, job: Job) -> None:
        kind = job.__class__
        if kind is RequestJob:
            self._materialize_request(job)
        elif kind is GroupJob:
            self._materialize_group(job)
        elif kind is StepMetricsJob:
            try:
                self.diagnosis.record(job.steps, self.adapter_steps.step_label)
                self.adapter_steps.record(job.steps)  # steps per adapter, LoRA adapter loads and evictions
            except Exception as exc:
                self.guard.failed("engine step metrics", exc)
        elif kind is EarlyStepJob:  # settled early: its requests outlived the step buffer
            self._emit_step(job.step)
        elif kind is CloseJob:  # emit the steps still held
            with self._steps_lock:
                held = list(self.steps.values())
                self.steps.clear()
                self._runs.clear()
                self._busy.clear()
            for step in held:
                self._emit_step(step)
        else:
            raise TypeError(f"not a materializer job: {kind.__name__}")

    def _explain(self, t: RequestTimeline, s: RequestSummary, breached: tuple[str, ...],
                 for_cause: bool) -> Any:
        """Why it was slow: for kept requests, and for every breach's counter."""
        if not (breached or for_cause):
            return None
        try:
            verdict = slow_verdict(t, self.window, breached, self.config.slo.for_model(s.model))
            s.slow_cause = verdict.cause
            return verdict
        except Exception as exc:  # a bug of ours costs the verdict only
            self.guard.failed("slow-cause verdict", exc)
            return None

    def _for_cause(self, decision: Decision | None) -> bool:
        # a prefill half is judged too: the collector weighs its verdict in the user request's (core/disagg.py)
        return decision is not None and (decision.reason.partition(":")[0] in self._cause_names
                                         or decision is _HANDOFF_KEPT)

    def _materialize_request(self, job: RequestJob) -> None:
        t, s, decision, detail = job.timeline, job.summary, job.decision, job.detail
        kept: Materialized | None = None
        own = self._tokens_from_steps(t)
        self._add_gaps(t, s)
        slo = self.config.slo.for_request(s.model, s.tenant)
        breached = slo.breaches(s)
        for_cause = self._for_cause(decision)
        if own is None:
            own = self._own_steps(t) if self.config.engine_steps or breached or for_cause or decision is not None \
                else ()
        self._attribute(t, s, own)
        verdict = self._explain(t, s, breached, for_cause)
        if t.handoff is not None:  # after its own verdict: the baseline is the other requests' loads
            self.window.handoffs.add(t.handoff)
        note_frontend(t, self.window)  # the same for the frontend's hand-over and output delays
        if decision is not None:
            try:
                attrs = request_attributes(t, s, decision.reason, not breached and not s.failed, breached,
                                           self.config.capture_content)
                attrs.update(slo.span_attributes)  # type: ignore[attr-defined]
                attrs.update(attribution_attributes(s))
                if verdict is not None and for_cause:
                    attrs.update(verdict.attributes())
                held = own if detail >= Detail.PHASES and self.config.engine_steps else []
                kept = self.spans.request(t, s, attrs, detail, WallClock(), held, slo.tpot,
                                          events=request_load_events(t.lora_id, own, self.adapters))
                if kept is not None:
                    self.counts.requests_kept += 1
            except Exception as exc:  # a bug of ours (or a span processor's) costs these spans only
                self.guard.failed("request spans", exc)
        span_ctx = kept.context if kept is not None else None
        # metrics cover every request, whatever happened to its spans; the exemplar points at it
        self.metrics.record(s, trace.set_span_in_context(NonRecordingSpan(span_ctx)) if span_ctx else None)
        # engine steps are the most detailed layer: those behind a full-detail request's own chunk and
        # decode-step spans (the span budget bounds them) link to it
        self._settle_steps(t, kept if detail >= Detail.STEPS else None)

    def _materialize_group(self, job: GroupJob) -> None:
        """n sequences of one user request: one trace (a request span over one ``llm.choice`` per
        sequence). Metrics stay per sequence, as vLLM's own (each sequence is a finished request in
        its statistics); the exemplars of all of them point at the one trace."""
        members = sorted(job.group.finished, key=lambda m: m[0].choice_index or 0)
        derived = []
        for t, s in members:
            derived.append(self._tokens_from_steps(t))
            self._add_gaps(t, s)
        decision, detail = job.decision, job.detail
        slo = self.config.slo.for_request(members[0][1].model, members[0][1].tenant)
        breaches = [slo.breaches(s) for _, s in members]
        for_cause = self._for_cause(decision)
        owns = [o if o is not None else self._own_steps(t) if self.config.engine_steps or b or for_cause
                or decision is not None else () for (t, _), b, o in zip(members, breaches, derived)]
        for (t, s), own in zip(members, owns):
            self._attribute(t, s, own)
        verdicts = [self._explain(t, s, b, for_cause) for (t, s), b in zip(members, breaches)]
        for t, _ in members:
            note_frontend(t, self.window)
        root: Materialized | None = None
        choices: list[Materialized | None] = [None] * len(members)
        if decision is not None:
            try:
                breached = tuple(dict.fromkeys(o for b in breaches for o in b))
                met = not breached and not any(s.failed for _, s in members)
                attrs = group_attributes(members, decision.reason, met, breached, self.config.capture_content)
                attrs.update(slo.span_attributes)  # type: ignore[attr-defined]
                parts = []
                phases = detail >= Detail.PHASES and self.config.engine_steps
                for (t, s), b, verdict, own in zip(members, breaches, verdicts, owns):
                    a = choice_attributes(t, s, not b and not s.failed, b)
                    a.update(attribution_attributes(s))
                    if verdict is not None and for_cause:
                        a.update(verdict.attributes())
                    parts.append((t, s, a, own if phases else []))
                events = [request_load_events(t.lora_id, own, self.adapters) for (t, _), own in zip(members, owns)]
                root, choices = self.spans.request_group(parts, attrs, detail, WallClock(), slo.tpot, events)
                if root is not None:
                    self.counts.requests_kept += 1
            except Exception as exc:
                self.guard.failed("request spans", exc)
        exemplar = trace.set_span_in_context(NonRecordingSpan(root.context)) if root is not None else None
        for (t, s), kept in zip(members, choices):
            self.metrics.record(s, exemplar)
            self._settle_steps(t, kept if detail >= Detail.STEPS else None)

    def _attribute(self, t: RequestTimeline, s: RequestSummary, own: Any) -> None:
        """Its engine time (its share of each step that served it) and the prefill interference its prompt
        caused others (core/diagnosis/engine_time.py): from the steps joined at finish, none if one was lost."""
        if not own or t.steps_lost:
            return
        try:
            d = self.diagnosis  # (the held steps' times read one ``get`` each: no lock for that)
            s.engine_time = engine_time(t.request_id, own, self._busy, d.shape, d.peaks, served=True)
            s.interference_caused = interference_caused(t.chunks, self.window, self._busy) if t.chunks else 0.0
        except Exception as exc:  # a bug of ours costs the attribution only
            self.guard.failed("engine time", exc)

    def _tokens_from_steps(self, t: RequestTimeline) -> list[StepRecord] | None:
        """Stamp-free frontend: ``t``'s token times from the held steps that served it (core/step_tokens.py),
        and those steps (None: ``t`` was stamped on the hot path, nothing read here). Where its finish joined
        its steps and placed its outputs on them (``steps_of``: agent/engine_requests.py), the times it placed
        are taken as they are; where they did not add up (or a step of it was lost), it has none."""
        window = t.token_window
        if window is None:
            return None
        placed = t.served is not None
        if t.token_ts and not placed:
            return None
        own = self._own_steps(t)
        if t.token_ts:
            return own
        try:
            times = token_times(t.request_id, own, window) if not (placed or t.steps_lost) else None
        except Exception as exc:  # a bug of ours costs this request's inter-token latencies only
            self.guard.failed("token times from steps", exc)
            times = None
        if times is None:
            if window.tokens > 1:  # (one token has no gap to lose)
                self.counts.token_times_unplaced += 1
        else:
            t.token_ts = times
        return own

    def steps_of(self, t: RequestTimeline) -> list[StepRecord]:
        """The held engine steps that served ``t``, in order, joined once for both its finish and the
        pipeline (kept on ``t``): an agent whose engine is its requests' source reads its stamps and places its
        token times off them before the summary (agent/engine_requests.py)."""
        out = t.served = self._own_steps(t)
        return out

    def _own_steps(self, t: RequestTimeline) -> list[StepRecord]:
        """The held engine steps that served ``t`` (all of them, unless it outlived ``max_steps`` steps),
        in order; also fills ``t.steps`` with their ids for the verdict (empty if one was lost: its verdict
        cannot place it). A scan of the steps held since it started, one set lookup per run of an unchanged
        batch (core/step_runs.py), unless its finish joined them already (``steps_of``)."""
        out = t.served
        if out is not None:
            return out
        with self._steps_lock:
            out = self._runs.served(t.request_id, t.steps_from)
        if not t.steps and not t.steps_lost:
            t.steps = list(map(_STEP_ID, out))
        return out

    def _settle_steps(self, t: RequestTimeline, kept: Materialized | None) -> None:
        """``t`` is done with: link its kept spans' steps, and release the steps no request left to settle
        can be in (those before the oldest unsettled request started); emit the linked ones."""
        done = []
        with self._steps_lock:
            unsettled = self._unsettled
            rid = t.request_id
            if unsettled.get(rid) is t:
                del unsettled[rid]
            steps = self.steps
            if kept is not None and kept.linked_steps:
                context = kept.context
                for step in filter(None, map(steps.get, kept.linked_steps)):
                    if step.links:
                        step.links.append(context)
                    else:  # the record's shared empty tuple until now
                        step.links = [context]
            floor = next(iter(unsettled.values())).steps_from if unsettled else None
            while steps:
                step = next(iter(steps.values()))
                if floor is not None and step.seq >= floor:
                    break
                steps.popitem(last=False)
                self._runs.drop_oldest()
                self._busy.pop(step.step_id, None)
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
                self.guard.failed("engine step diagnosis", exc)
                extra = None
            events = None
            if step.loras or step.worker is not None:
                extra = dict(extra or ())
                if step.loras:
                    extra.update(self.adapters.step_attributes(step.loras, self.window.max_loras))
                if step.worker is not None:  # the model runner's: drafter time, adapter loads and evictions
                    attributes, events = span_parts(step, self.adapters)
                    extra.update(attributes)
            self.spans.engine_step(step, WallClock(), self.engine, extra, events)
            self.counts.steps_emitted += 1

    def _add_gaps(self, t: RequestTimeline, s: RequestSummary) -> None:
        """Inter-token latencies for every request, from its token stamps, unless the adapter gave them."""
        if s.gaps is None:
            try:
                s.gaps = gap_summary(t.token_ts, t.multi_token_steps)
            except Exception as exc:  # a bug of ours costs this request's inter-token latencies only
                self.guard.failed("inter-token latencies", exc)
                return
            if s.gaps is not None and s.max_gap is None:
                s.max_gap = s.gaps.max_gap

    def _policy_failed(self, policy: Policy, exc: BaseException) -> None:
        self.guard.failed(f"policy {getattr(policy, 'name', policy)!s}", exc)


_STEP_ID = attrgetter("step_id")
_STEP_BATCH = 32  # steps per metrics job
_STEP_BATCH_S = 1.0  # ... or fewer, once the oldest waited this long (engine monotonic seconds)


_GROUP_PENDING = Decision(Verdict.NOT_SAMPLED, "group_pending")  # a sequence whose siblings are still running
_HANDOFF_KEPT = Decision(Verdict.SAMPLED, sc.SAMPLING_REASON_DEFERRED)  # the prefill half of a disaggregated request
