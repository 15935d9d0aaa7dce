"""Materialize a finished request's timeline as spans, at the detail its sampling decision earned.

Runs once per kept request, after it finished: every span is built with explicit start
and end times from the engine's stamps. Layout (the README's trace contract):

    {operation} {model}                 request span, [arrival, arrival + e2e]
      llm.queue                         [arrival, first scheduled]   event llm.engine.queued
      llm.prefill                       [first scheduled, first token]
        llm.prefill.chunk (each)        the engine steps that computed the prompt
      llm.decode                        [first token, end]
        llm.decode.step (each)          [previous token, this token]
      llm.requeue / llm.reprefill       per preemption, under the phase it hit; event llm.preemption

Children tile the request span: the queue span starts at arrival, so it includes the
frontend's input processing and the hop to the engine (the engine's own queue time is
the attribute ``llm.latency.queue`` and the event ``llm.engine.queued``); the decode
span ends when the frontend received the last output, as the engine's e2e does.
"""

from __future__ import annotations

import copy
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Sequence

from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, Tracer

from . import semconv as sc
from .clock import WallClock
from .config import Detail
from .content import input_messages, output_messages
from .decode_rows import choose_rows, eventful_steps
from .direct_export import DirectExport
from . import otlp_wire as w
from . import wire_tracer
from .otlp_wire import IntAttribute, RequestFrame, SiblingSpans, span_ids
from .step_facts import FactsCache
from .timeline import BLOCKED_NAMES, QUEUED, RequestTimeline, StepRecord
from .summary import RequestSummary


def request_attributes(t: RequestTimeline, s: RequestSummary, reason: str, slo_met: bool,
                       breached: tuple[str, ...], capture_content: bool) -> dict[str, Any]:
    a: dict[str, Any] = {sc.OPERATION_NAME: t.operation}
    if t.provider:
        a[sc.PROVIDER_NAME] = t.provider
    if t.model:
        # the engine serves the model it was asked for under that name: it is also the response's model
        a[sc.REQUEST_MODEL] = a[sc.RESPONSE_MODEL] = t.model
    a.update(t.request_attributes)
    if t.response_id:
        a[sc.RESPONSE_ID] = t.response_id
    if t.finish_reason:
        a[sc.RESPONSE_FINISH_REASONS] = (t.finish_reason,)
    for key, value in (
        (sc.USAGE_INPUT_TOKENS, s.input_tokens), (sc.USAGE_OUTPUT_TOKENS, s.output_tokens),
        (sc.LATENCY_TTFT, s.ttft), (sc.LATENCY_TPOT, s.tpot), (sc.LATENCY_E2E, s.e2e),
        (sc.LATENCY_QUEUE, s.queue), (sc.LATENCY_PREFILL, s.prefill), (sc.LATENCY_DECODE, s.decode),
        (sc.USAGE_CACHE_READ_INPUT_TOKENS, s.prefix_cache_hit_tokens), (sc.OUTPUT_CHARACTERS, s.output_characters),
        (sc.LATENCY_MAX_GAP, s.max_gap),
    ):
        if value is not None:
            a[key] = value
    if s.gaps is not None:  # compact: the histogram's bucket counts, so a collector can add them up
        a[sc.LATENCY_ITL_COUNTS] = tuple(s.gaps.counts)
    a[sc.NUM_PREEMPTIONS] = s.num_preemptions
    a[sc.SLO_MET] = slo_met
    if breached:
        a[sc.SLO_BREACHED] = breached
    a[sc.SAMPLING_REASON] = reason
    if s.error_type:
        a[sc.ERROR_TYPE] = s.error_type
    if capture_content:
        # the engine sees the prompt as rendered (a chat template already applied): one user message
        if t.prompt_text is not None:
            a[sc.INPUT_MESSAGES] = input_messages([("user", t.prompt_text)])
        if t.output_text is not None:
            a[sc.OUTPUT_MESSAGES] = output_messages({0: [t.output_text]}, [t.finish_reason] if t.finish_reason else [])
    return a


class _DirectEmitter:
    """Hands finished decode-step spans straight to an OpenTelemetry SDK tracer's processors.

    They are retroactive and can have no children, so the SDK's live-span machinery
    (locks, bounded containers, a second ReadableSpan copy at end) buys nothing: building
    the ReadableSpan directly costs about a third (benchmarks/vllm_overhead.py). Only used
    with the SDK's own Tracer; any other tracer gets the public API.
    """

    def __init__(self, tracer: Any) -> None:
        self._processor = tracer.span_processor
        self._resource = _hash_once(tracer.resource)
        self._scope = tracer._instrumentation_scope
        self._ids = tracer.id_generator

    @classmethod
    def for_tracer(cls, tracer: Tracer) -> "_DirectEmitter | None":
        try:
            from opentelemetry.sdk.trace import Tracer as SDKTracer
        except ImportError:
            return None
        if not isinstance(tracer, SDKTracer):
            return None
        try:
            return cls(tracer)
        except AttributeError:  # another SDK release: the public API path still works
            return None

    def emit(self, name: str, parent: SpanContext, start: int, end: int, attributes: dict[str, Any]) -> None:
        from opentelemetry.sdk.trace import ReadableSpan

        context = SpanContext(parent.trace_id, self._ids.generate_span_id(), False, parent.trace_flags,
                              parent.trace_state)
        self._processor.on_end(ReadableSpan(name=name, context=context, parent=parent, resource=self._resource,
                                            attributes=attributes, start_time=start, end_time=end,
                                            instrumentation_scope=self._scope))


def _hash_once(resource: Any) -> Any:
    """The same resource, hashing in O(1): the SDK's OTLP encoder groups spans by resource and
    ``Resource.__hash__`` JSON-encodes every attribute on each call, ~20% of encoding a small span.
    Equal to the original and with the same hash, so the encoder puts both in one group."""
    from opentelemetry.sdk.resources import Resource

    class _HashedOnce(Resource):
        def __init__(self, original: Resource) -> None:
            super().__init__(original.attributes, original.schema_url)
            self._hash = hash(original)

        def __hash__(self) -> int:
            return self._hash

    try:
        return _HashedOnce(resource)
    except Exception:  # not the SDK's Resource as we know it: use it as it is
        return resource


@dataclass(slots=True)
class Materialized:
    """A kept request's root span, and the engine steps behind its own prefill-chunk and
    decode-step spans (the only steps that link to it: bounded by the span budget too)."""

    context: SpanContext
    linked_steps: set[int] = field(default_factory=set)


class SpanBuilder:
    """Builds a kept request's spans through ``tracer``, or, when its provider only batches to
    OTLP exporters, as OTLP wire bytes sent with those exporters (direct_export, wire_tracer).
    Engine-step spans go out under their own service (``engine_step_service``)."""

    def __init__(self, tracer: Tracer, direct_export: bool = True, max_spans: int = 1000,
                 engine_service: str = "{service}") -> None:
        self._sdk_tracer = tracer
        self._engine_sdk_tracer = with_service(tracer, engine_service)
        self._tracer: Tracer = tracer  # the one spans are built with now: the SDK's, or a WireTracer
        self._engine_tracer: Tracer = self._engine_sdk_tracer
        self._direct = _DirectEmitter.for_tracer(tracer)
        self._wire_allowed = direct_export and self._direct is not None and wire_tracer.usable(tracer)
        self._wire: DirectExport | None = None
        self._wire_for: Any = None  # the processors the current DirectExport was made for
        self._max_spans = max_spans
        self._facts = FactsCache()
        self.wire_export()

    def wire_export(self) -> DirectExport | None:
        """The direct exporter, redone if the provider's span processors changed (a processor added
        after instrument() must see the spans it would have seen)."""
        if not self._wire_allowed:
            return None
        processors = getattr(self._sdk_tracer.span_processor, "_span_processors", None)
        if processors is not self._wire_for:
            if self._wire is not None:
                self._wire.close(timeout=1.0)
            self._wire_for = processors
            self._wire = DirectExport.for_tracer(self._sdk_tracer)
            if self._wire is None:
                self._tracer, self._engine_tracer = self._sdk_tracer, self._engine_sdk_tracer
            else:
                self._tracer = wire_tracer.WireTracer(self._sdk_tracer, self._wire)
                self._engine_tracer = self._tracer if self._engine_sdk_tracer is self._sdk_tracer else \
                    wire_tracer.WireTracer(self._engine_sdk_tracer, self._wire, RequestFrame.for_tracer(
                        self._engine_sdk_tracer.resource, self._engine_sdk_tracer._instrumentation_scope))
        return self._wire

    @property
    def direct(self) -> DirectExport | None:
        """The direct exporter in use now, if any (its counts)."""
        return self._wire

    def flush(self, timeout: float | None = 10.0) -> bool:
        return self._wire.flush(timeout) if self._wire is not None else True

    def close(self, timeout: float = 5.0) -> None:
        if self._wire is not None:
            self._wire.close(timeout)

    def request(self, t: RequestTimeline, s: RequestSummary, attributes: dict[str, Any], detail: Detail,
                clock: WallClock, steps: Sequence[StepRecord] = (),
                tpot_slo: float | None = None) -> Materialized | None:
        """The request's spans; ``steps`` are the engine steps it took part in that are still held
        (their facts go on its chunk and decode-step spans), ``tpot_slo`` its model's."""
        start = clock.wall_ns(t.arrival)
        end = max(start, clock.wall_ns(t.arrival + (s.e2e or 0.0)))
        name = f"{t.operation} {t.model}" if t.model else t.operation
        self.wire_export()  # picks the tracer for this request
        root = self._tracer.start_span(name, context=t.parent, kind=t.kind, start_time=start, attributes=attributes)
        if not root.is_recording():  # the provider's own sampler said no (e.g. an unsampled parent)
            root.end(end_time=end)
            return None
        if s.error_type:
            root.set_status(Status(StatusCode.ERROR, f"{s.error_type}: finish reason {t.finish_reason}"))
        kept = Materialized(root.get_span_context())
        if detail >= Detail.PHASES:
            self._phases(root, t, start, end, detail, clock, steps, tpot_slo, kept.linked_steps)
        root.end(end_time=end)
        return kept

    def _phases(self, root: Span, t: RequestTimeline, start: int, end: int, detail: Detail,
                clock: WallClock, steps: Sequence[StepRecord], tpot_slo: float | None, linked: set[int]) -> None:
        ctx = trace.set_span_in_context(root)
        queued = t.first(QUEUED)
        scheduled = t.first_scheduled()
        sched_ns = _clamp(clock.mono_ns(scheduled), start, end) if scheduled is not None else end
        first_ns = _clamp(clock.mono_ns(t.token_ts[0]), sched_ns, end) if t.token_ts else end

        queue = self._child(sc.SPAN_QUEUE, ctx, start)
        if queued is not None:
            queue.add_event(sc.EVENT_ENGINE_QUEUED, timestamp=_clamp(clock.mono_ns(queued), start, sched_ns))
        queue.end(end_time=sched_ns)
        if scheduled is None:
            return
        preemptions = t.preemptions()
        # the request, its phases and preemptions always; what is left goes to chunks and decode rows
        room = self._max_spans - (4 if t.token_ts else 3) - 2 * len(preemptions)
        by_id = {st.step_id: st for st in steps}
        prefill = self._child(sc.SPAN_PREFILL, ctx, sched_ns)
        decode = self._child(sc.SPAN_DECODE, ctx, first_ns) if t.token_ts else None
        if t.chunks:
            rows_later = detail >= Detail.STEPS and len(t.token_ts) > 1
            room -= self._chunks(prefill, t, sched_ns, end, clock, by_id, room // 2 if rows_later else room, linked)
        for preempted, rescheduled in preemptions:
            p_ns = _clamp(clock.mono_ns(preempted), sched_ns, end)
            phase = prefill if p_ns < first_ns or decode is None else decode
            phase.add_event(sc.EVENT_PREEMPTION, timestamp=p_ns)
            pctx = trace.set_span_in_context(phase)
            back_ns = _clamp(clock.mono_ns(rescheduled), p_ns, end) if rescheduled is not None else end
            self._child(sc.SPAN_REQUEUE, pctx, p_ns).end(end_time=back_ns)
            if rescheduled is not None:
                resumed = next((ts for ts in t.token_ts if ts >= rescheduled), None)
                done_ns = _clamp(clock.mono_ns(resumed), back_ns, end) if resumed is not None else end
                self._child(sc.SPAN_REPREFILL, pctx, back_ns).end(end_time=done_ns)
        prefill.end(end_time=first_ns)
        if decode is None:
            return
        if detail >= Detail.STEPS and decode.is_recording():  # a sampler may have dropped the decode span
            self._decode_rows(decode, t, first_ns, end, clock, steps, tpot_slo, preemptions, room, linked)
        decode.end(end_time=end)

    def _chunks(self, prefill: Span, t: RequestTimeline, sched_ns: int, end: int, clock: WallClock,
                by_id: dict[int, StepRecord], room: int, linked: set[int]) -> int:
        """Prefill-chunk spans (the slowest, if they are more than ``room``); returns how many."""
        chunks = t.chunks
        keep = range(len(chunks))
        if len(chunks) > room:
            slowest = sorted(keep, key=lambda i: chunks[i].end - chunks[i].start, reverse=True)[:max(room, 0)]
            keep = sorted(slowest)
            prefill.set_attribute(sc.CHUNKS_OMITTED, len(chunks) - len(keep))
        pctx = trace.set_span_in_context(prefill)
        for i in keep:
            c = chunks[i]
            c_start = _clamp(clock.mono_ns(c.start), sched_ns, end)
            c_end = _clamp(clock.mono_ns(c.end), c_start, end)
            attrs: dict[str, Any] = {sc.CHUNK_INDEX: i, sc.CHUNK_TOKENS: c.tokens, sc.ENGINE_STEP_ID: c.step_id}
            step = by_id.get(c.step_id)
            if step is not None:
                attrs.update(self._facts.get(step, c.tokens))
            self._child(sc.SPAN_PREFILL_CHUNK, pctx, c_start, attrs).end(end_time=c_end)
            linked.add(c.step_id)
        return len(keep)

    def _decode_rows(self, decode: Span, t: RequestTimeline, first_ns: int, end: int, clock: WallClock,
                     steps: Sequence[StepRecord], tpot_slo: float | None,
                     preemptions: list[tuple[float, float | None]], room: int, linked: set[int]) -> None:
        """One span per eventful decode step, one ``llm.decode.window`` per run of the others
        (decode_rows), within ``room`` spans; each step's span carries its engine step's facts."""
        ts = t.token_ts
        n = len(ts) - 1
        if n <= 0:
            return
        gaps = [b - a for a, b in zip(ts, islice(ts, 1, None))]
        multi = t.multi_token_steps
        per_token = [g / t.tokens_at(i) for i, g in enumerate(gaps, 1)] if multi else gaps
        by_token = token_steps(ts, steps) if steps else {}
        own = {c.step_id: c.tokens for c in t.chunks}
        facts = self._facts
        others = facts.carried_prefill(by_token, own)
        hit = {bisect_right(ts, p) for p, _ in preemptions}  # ts[i-1] <= p < ts[i]: step i held it
        hit.update(i for i, st in by_token.items() if st.preempted)  # its engine step preempted someone
        rows = choose_rows(n, eventful_steps(per_token, tpot_slo, hit, others), room)
        if rows.coalesced:
            decode.set_attribute(sc.EVENTFUL_COALESCED, rows.coalesced)
        parent = decode.get_span_context()
        offset = clock.offset_ns
        wire = self._tracer.wire if isinstance(self._tracer, wire_tracer.WireTracer) else None
        direct = self._direct
        dctx = trace.set_span_in_context(decode)
        step_encoder = SiblingSpans(parent, sc.SPAN_DECODE_STEP) if wire is not None else None
        window_encoder = SiblingSpans(parent, sc.SPAN_DECODE_WINDOW) if wire is not None else None
        ids = span_ids(len(rows.rows)) if wire is not None else ()
        parts = []
        prev = first_ns
        for k, (a, b) in enumerate(rows.rows):
            if k and not k % _YIELD_EVERY:
                yield_gil()
            now = int(ts[b] * 1e9) + offset  # clock.mono_ns, inlined
            now = prev if now < prev else end if now > end else now
            if a == b:
                name = sc.SPAN_DECODE_STEP
                step = by_token.get(a)
                own_tokens = own.get(step.step_id, 0) if step is not None else 0
                if step is not None:
                    linked.add(step.step_id)
                if wire is not None:
                    extra = facts.encoded(step, own_tokens) if step is not None else b""
                    parts.append(step_encoder.encode(ids[k], prev, now,
                                                     _STEP_INDEX(a) + _STEP_TOKENS(t.tokens_at(a)) + extra))
                    prev = now
                    continue
                attrs = {sc.STEP_INDEX: a, sc.STEP_TOKENS: t.tokens_at(a)}
                if step is not None:
                    attrs.update(facts.get(step, own_tokens))
            else:
                name = sc.SPAN_DECODE_WINDOW
                tokens = sum(t.tokens_at(i) for i in range(a, b + 1)) if multi else b - a + 1
                attrs = {sc.WINDOW_TOKENS: tokens, sc.WINDOW_FIRST_INDEX: a, sc.WINDOW_LAST_INDEX: b,
                         sc.WINDOW_GAP_MEAN: (ts[b] - ts[a - 1]) / tokens, sc.WINDOW_GAP_MAX: max(gaps[a - 1:b])}
                if wire is not None:
                    parts.append(window_encoder.encode(ids[k], prev, now, w.attributes(attrs)))
                    prev = now
                    continue
            if direct is not None:
                direct.emit(name, parent, prev, now, attrs)
            else:
                self._child(name, dctx, prev, attrs).end(end_time=now)
            prev = now
        if wire is not None and parts:
            wire.add(b"".join(parts), len(parts))

    def engine_step(self, step: StepRecord, clock: WallClock, engine: str,
                    extra: dict[str, Any] | None = None) -> None:
        start = clock.mono_ns(step.start)
        end = max(start, clock.mono_ns(step.end))
        attrs: dict[str, Any] = {
            sc.ENGINE: engine,
            sc.ENGINE_STEP_ID: step.step_id,
            sc.STEP_PHASE: step.phase,
            sc.STEP_NUM_PREFILL_REQS: step.prefill_requests,
            sc.STEP_NUM_PREFILL_TOKENS: step.prefill_tokens,
            sc.STEP_NUM_DECODE_REQS: step.decode_requests,
            sc.STEP_NUM_DECODE_TOKENS: step.decode_tokens,
            sc.STEP_BATCH_SIZE: len(step.requests),
            sc.STEP_NUM_RUNNING: step.running,
            sc.STEP_NUM_WAITING: step.waiting,
            sc.STEP_NUM_PREEMPTED: step.preempted,
            sc.SAMPLING_REASON: "served_kept_request",
        }
        if step.kv_cache_usage is not None:
            attrs[sc.STEP_KV_CACHE_USAGE] = step.kv_cache_usage
        if extra:
            attrs.update(extra)  # anatomy, roofline, GPU sample (core/diagnosis)
        if step.queue_blocked:
            attrs[sc.STEP_QUEUE_BLOCKED] = BLOCKED_NAMES[step.queue_blocked]
        if step.attributes:  # an engine's own numbers win over what the shares above approximate
            attrs.update(step.attributes)
        self.wire_export()
        links = [trace.Link(c) for c in step.links]
        span = self._engine_tracer.start_span(sc.SPAN_ENGINE_STEP, context=_ROOT, kind=SpanKind.INTERNAL,
                                       start_time=start, attributes=attrs, links=links)
        span.end(end_time=end)

    def _child(self, name: str, ctx: Any, start: int, attributes: dict | None = None) -> Span:
        return self._tracer.start_span(name, context=ctx, start_time=start, attributes=attributes)


_ROOT = trace.set_span_in_context(trace.INVALID_SPAN)
_YIELD_EVERY = 32  # decode-step spans built between offers of the GIL (~0.3 ms of work)
_SAME_OUTPUT_S = 5e-4  # a token's stamp and its step's end: equal, or µs apart (one output batch per client)
_STEP_INDEX = IntAttribute(sc.STEP_INDEX)
_STEP_TOKENS = IntAttribute(sc.STEP_TOKENS)


def yield_gil() -> None:
    """Offer the GIL to the engine's thread. Spans are built on a background thread, but a busy
    Python thread keeps the GIL for up to the switch interval (5 ms) each time the engine's
    thread wants it back; short slices keep the engine's waits short."""
    time.sleep(0)


def _clamp(v: int, lo: int, hi: int) -> int:
    return lo if v < lo else hi if v > hi else v


def token_steps(token_ts: Sequence[float], steps: Sequence[StepRecord]) -> dict[int, StepRecord]:
    """The engine step that produced each token (index into ``token_ts``), for the steps given.

    A token's stamp is the timestamp of the engine's output batch, which is also the end the
    step hook recorded (steps.py): equal for the first client, microseconds apart for the others
    (vLLM stamps one output batch per client). Steps that produced no token (a non-final prefill
    chunk) match nothing."""
    index = {v: i for i, v in enumerate(token_ts)}
    out: dict[int, StepRecord] = {}
    approximate = []
    for st in steps:
        i = index.get(st.end)
        if i is None:
            approximate.append(st)
        else:
            out[i] = st
    for st in approximate:
        j = bisect_left(token_ts, st.end)
        near = [k for k in (j - 1, j) if 0 <= k < len(token_ts) and k not in out
                and abs(token_ts[k] - st.end) <= _SAME_OUTPUT_S]
        if near:
            out[min(near, key=lambda k: abs(token_ts[k] - st.end))] = st
    return out


def with_service(tracer: Tracer, template: str) -> Tracer:
    """The same SDK tracer (processors, sampler, ids, limits, scope) under a resource whose
    ``service.name`` (and Phoenix project) is ``template`` with ``{service}`` the tracer's.
    Any other tracer, or the same name, is returned as it is."""
    resource = getattr(tracer, "resource", None)
    attrs = getattr(resource, "attributes", None)
    if attrs is None:
        return tracer
    current = str(attrs.get(sc.SERVICE_NAME, "unknown_service"))
    name = template.format(service=current)
    if name == current:
        return tracer
    try:
        from opentelemetry.sdk.resources import Resource

        # Phoenix files traces under openinference.project.name (default "default"), not service.name
        other = Resource({**attrs, sc.SERVICE_NAME: name, sc.OPENINFERENCE_PROJECT_NAME: name}, resource.schema_url)
        clone = copy.copy(tracer)  # the SDK tracer reads self.resource when it starts a span
        clone.resource = other
        return clone
    except Exception:  # not the SDK's tracer as we know it: steps stay with the requests
        return tracer
