"""Materialize a finished request's timeline as spans, at the detail its sampling decision earned.

Runs once per kept request, after it finished: every span is built with explicit start
and end times from the engine's stamps. Layout (the trace contract, docs/trace-contract.md):

    {operation} {model}                 request span, [arrival, arrival + e2e]
      llm.queue                         [arrival, first scheduled]   event llm.engine.queued
      llm.prefill                       [first scheduled, first token]
        llm.prefill.chunk (each)        the engine steps that computed the prompt
      llm.decode                        [first token, end]
        llm.decode.step (each)          [previous token, this token]
      llm.requeue / llm.reprefill       per preemption, under the phase it hit; event llm.preemption

A user request that asked for n > 1 choices (parallel sampling) is one trace too: its request span
(``request_group``) holds one ``llm.choice`` span per sequence, and each choice holds the layout above
from ``llm.queue`` down.

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

from .. import semconv as sc
from ..guard import Guard
from .clock import WallClock
from .config import Detail
from .content import input_messages, output_messages
from .decode_rows import choose_rows, eventful_steps
from .finish_facts import ERROR_TYPES
from .span_routes import ApiRouter, DirectSink, Route, RouterFactory
from .step_facts import FactsCache
from .handoff import handoff_attributes
from .timeline import BLOCKED_NAMES, QUEUED, RequestTimeline, StepRecord
from .summary import RequestSummary


def request_attributes(t: RequestTimeline, s: RequestSummary, reason: str, slo_met: bool,
                       breached: tuple[str, ...], capture_content: bool) -> dict[str, Any]:
    a: dict[str, Any] = {sc.OPERATION_NAME: t.operation}
    if t.provider:
        a[sc.PROVIDER_NAME] = t.provider
    _models(a, t)
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
    a.update(vllm_latency_attributes(s))
    if t.handoff is not None:
        a.update(handoff_attributes(t.handoff))
    if s.gaps is not None:  # compact: the histogram's bucket counts, so a collector can add them up
        a[sc.LATENCY_ITL_COUNTS] = tuple(s.gaps.counts)
    a.update(feature_attributes(t, s))
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


def _models(a: dict[str, Any], t: RequestTimeline) -> None:
    """The requested and the served model, and the request's own attributes (the API request's model among
    them, which wins): a LoRA request's response model is its adapter, so client and server series join."""
    served = t.served_model
    if served:
        a[sc.REQUEST_MODEL] = a[sc.RESPONSE_MODEL] = served
    a.update(t.request_attributes)


def vllm_latency_attributes(s: RequestSummary) -> dict[str, float]:
    """vLLM's own request-span latencies (``gen_ai.latency.*``, its formulas: queue from queued to scheduled,
    prefill from scheduled to the first token, decode from the first to the last token, inference both), the
    same values as ours, so that dashboards built on vLLM's tracing find them on our spans."""
    a = {key: value for key, value in ((sc.VLLM_TTFT, s.ttft), (sc.VLLM_E2E, s.e2e), (sc.VLLM_QUEUE, s.queue),
                                       (sc.VLLM_PREFILL, s.prefill), (sc.VLLM_DECODE, s.decode))
         if value is not None}
    if s.prefill is not None and s.decode is not None:
        a[sc.VLLM_INFERENCE] = s.prefill + s.decode
    return a


ABORTED = ERROR_TYPES["abort"]  # error.type of an aborted request
SpanEvent = tuple[str, dict[str, Any], float]  # a span event: name, attributes, engine monotonic time
MAX_ADAPTER_NAME = 256  # characters of a LoRA adapter's name kept on a span (names come from users)


def feature_attributes(t: RequestTimeline, s: RequestSummary) -> dict[str, Any]:
    """The production features' request facts: speculative decoding, the LoRA adapter, cache reads by source."""
    a: dict[str, Any] = {}
    for key, value in ((sc.SPEC_VERIFY_STEPS, s.spec_verify_steps), (sc.SPEC_DRAFT_TOKENS, s.spec_draft_tokens),
                       (sc.SPEC_ACCEPTED_TOKENS, s.spec_accepted_tokens),
                       (sc.SPEC_ACCEPTANCE_RATE, s.spec_acceptance_rate),
                       (sc.SPEC_ACCEPTANCE_LENGTH, s.spec_acceptance_length),
                       (sc.CACHE_READ_LOCAL, s.cache_read_local), (sc.CACHE_READ_EXTERNAL, s.cache_read_external)):
        if value is not None:
            a[key] = value
    if t.lora_name is not None:
        a[sc.LORA_NAME] = t.lora_name[:MAX_ADAPTER_NAME]
    if t.lora_id is not None:
        a[sc.LORA_ID] = t.lora_id
    return a


def attribution_attributes(s: RequestSummary) -> dict[str, Any]:
    """Its engine time and the interference its prompt caused (core/diagnosis/engine_time.py), where computed."""
    a: dict[str, Any] = {}
    if s.engine_time is not None:
        a[sc.REQUEST_ENGINE_TIME] = round(s.engine_time, 9)
    if s.interference_caused is not None:
        a[sc.REQUEST_INTERFERENCE_CAUSED] = round(s.interference_caused, 9)
    return a


def group_attributes(members: Sequence[tuple[RequestTimeline, RequestSummary]], reason: str, slo_met: bool,
                     breached: tuple[str, ...], capture_content: bool) -> dict[str, Any]:
    """The request span of a user request that asked for n > 1 choices: what the user asked and got,
    over all its sequences (each sequence's own numbers are on its ``llm.choice`` span)."""
    t, s = members[0]
    group = t.group
    a: dict[str, Any] = {sc.OPERATION_NAME: t.operation}
    if t.provider:
        a[sc.PROVIDER_NAME] = t.provider
    _models(a, t)
    a.pop(sc.REQUEST_SEED, None)  # the engine seeds each sequence differently (seed + index): on the choices
    if group is not None:
        a[sc.REQUEST_CHOICE_COUNT] = group.choice_count
    if t.response_id:
        a[sc.RESPONSE_ID] = t.response_id
    reasons = tuple(m.finish_reason for m, _ in members if m.finish_reason)
    if reasons:
        a[sc.RESPONSE_FINISH_REASONS] = reasons
    if s.input_tokens is not None:
        a[sc.USAGE_INPUT_TOKENS] = s.input_tokens  # one prompt, whatever n
    outputs = [x.output_tokens for _, x in members if x.output_tokens is not None]
    if outputs:
        a[sc.USAGE_OUTPUT_TOKENS] = sum(outputs)
    ttfts = [x.ttft for _, x in members if x.ttft is not None]
    if ttfts:
        a[sc.LATENCY_TTFT] = min(ttfts)  # the user's first token: the first of any sequence
    e2es = [x.e2e for _, x in members if x.e2e is not None]
    if e2es:
        a[sc.LATENCY_E2E] = max(e2es)  # done when the last sequence is
    a[sc.NUM_PREEMPTIONS] = sum(x.num_preemptions or 0 for _, x in members)
    a[sc.SLO_MET] = slo_met
    if breached:
        a[sc.SLO_BREACHED] = breached
    a[sc.SAMPLING_REASON] = reason
    failed = next((x for _, x in members if x.error_type), None)
    if failed is not None:
        a[sc.ERROR_TYPE] = failed.error_type
    if capture_content:
        if t.prompt_text is not None:
            a[sc.INPUT_MESSAGES] = input_messages([("user", t.prompt_text)])
        texts = {i: [m.output_text] for i, (m, _) in enumerate(members) if m.output_text is not None}
        if texts:
            a[sc.OUTPUT_MESSAGES] = output_messages(texts, [m.finish_reason or "" for m, _ in members])
    return a


def choice_attributes(t: RequestTimeline, s: RequestSummary, slo_met: bool,
                      breached: tuple[str, ...]) -> dict[str, Any]:
    """One sequence's ``llm.choice`` span: its index, seed, finish reason, tokens and timings."""
    a: dict[str, Any] = {sc.CHOICE_INDEX: t.choice_index if t.choice_index is not None else 0}
    seed = t.request_attributes.get(sc.REQUEST_SEED)
    if seed is not None:
        a[sc.REQUEST_SEED] = seed
    if t.finish_reason:
        a[sc.RESPONSE_FINISH_REASONS] = (t.finish_reason,)
    for key, value in (
        (sc.USAGE_OUTPUT_TOKENS, s.output_tokens),
        (sc.LATENCY_TTFT, s.ttft), (sc.LATENCY_TPOT, s.tpot), (sc.LATENCY_E2E, s.e2e),
        (sc.LATENCY_QUEUE, s.queue), (sc.LATENCY_PREFILL, s.prefill), (sc.LATENCY_DECODE, s.decode),
        (sc.USAGE_CACHE_READ_INPUT_TOKENS, s.prefix_cache_hit_tokens), (sc.OUTPUT_CHARACTERS, s.output_characters),
    ):
        if value is not None:
            a[key] = value
    a.update(feature_attributes(t, s))
    a[sc.NUM_PREEMPTIONS] = s.num_preemptions
    a[sc.SLO_MET] = slo_met
    if breached:
        a[sc.SLO_BREACHED] = breached
    if s.error_type:
        a[sc.ERROR_TYPE] = s.error_type
    return a


@dataclass(slots=True)
class Materialized:
    """A kept request's root span, and the engine steps behind its own prefill-chunk and
    decode-step spans (the only steps that link to it: bounded by the span budget too)."""

    context: SpanContext
    linked_steps: set[int] = field(default_factory=set)


class SpanBuilder:
    """Builds a kept request's spans through the route its router chose for the tracer's provider (with
    ``otlp.routes.Router``: OTLP wire bytes sent with its own OTLP exporters), the SDK's tracer, or the
    public API.
    Engine-step spans go out under their own service (``engine_step_service``)."""

    def __init__(self, tracer: Tracer, direct_export: bool = True, max_spans: int = 1000,
                 engine_service: str = "{service}", router: RouterFactory | None = None,
                 guard: Guard | None = None) -> None:
        # router: otel_llm.otlp.routes.Router where the instrumentor hands it over (the wire route when the
        # provider allows), else the public API's routes; guard: the owner's, for the route's errors
        self._router = (router or ApiRouter)(tracer, with_service(tracer, engine_service), direct_export,
                                             guard if guard is not None else Guard())
        self._route: Route = self._router.route
        self._max_spans = max_spans
        self._facts = FactsCache()

    def wire_export(self) -> DirectSink | None:
        """The direct exporter, after a new look at the provider (its processors may have changed)."""
        self._route = self._router.current()
        return self._route.direct

    @property
    def route(self) -> Route:
        """The route spans take now."""
        return self._route

    @property
    def direct(self) -> DirectSink | None:
        """The direct exporter in use now, if any (its counts)."""
        return self._route.direct

    def flush(self, timeout: float | None = 10.0) -> bool:
        direct = self._route.direct
        return direct.flush(timeout) if direct is not None else True

    def close(self, timeout: float = 5.0) -> None:
        direct = self._route.direct
        if direct is not None:
            direct.close(timeout)

    def request(self, t: RequestTimeline, s: RequestSummary, attributes: dict[str, Any], detail: Detail,
                clock: WallClock, steps: Sequence[StepRecord] = (),
                tpot_slo: float | None = None, choice_of: Span | None = None,
                max_spans: int | None = None, events: Sequence[SpanEvent] = ()) -> Materialized | None:
        """The request's spans; ``steps`` are the engine steps it took part in that are still held
        (their facts go on its chunk and decode-step spans), ``tpot_slo`` its model's. ``choice_of``:
        the request span of the user request this sequence is one choice of (see ``request_group``);
        its spans then hang under an ``llm.choice`` span there, within ``max_spans``. ``events``: (name,
        attributes, engine monotonic time) each, on its request (or choice) span, e.g. its adapter's loads."""
        start = clock.wall_ns(t.arrival)
        end = max(start, clock.wall_ns(t.arrival + (s.e2e or 0.0)))
        if choice_of is None:
            model = t.requested_model
            name, context, kind = (f"{t.operation} {model}" if model else t.operation), t.parent, t.kind
            self.wire_export()  # the route for this request
        else:
            name, context, kind = sc.SPAN_CHOICE, trace.set_span_in_context(choice_of), SpanKind.INTERNAL
        root = self._route.tracer.start_span(name, context=context, kind=kind, start_time=start,
                                             attributes=attributes)
        if not root.is_recording():  # the provider's own sampler said no (e.g. an unsampled parent)
            root.end(end_time=end)
            return None
        if s.error_type and not (kind is SpanKind.SERVER and s.error_type == ABORTED):
            # (a SERVER span's abort is its client's cancellation, not a server error: error.type says aborted)
            root.set_status(Status(StatusCode.ERROR, f"{s.error_type}: finish reason {t.finish_reason}"))
        for event_name, event_attributes, at in events:
            root.add_event(event_name, event_attributes, timestamp=_clamp(clock.mono_ns(at), start, end))
        kept = Materialized(root.get_span_context())
        if detail >= Detail.PHASES and t.handoff is not None:
            self._handoff(root, t.handoff, start, end, clock)
        if detail >= Detail.PHASES:
            self._phases(root, t, start, end, detail, clock, steps, tpot_slo, kept.linked_steps,
                         self._max_spans if max_spans is None else max_spans)
        root.end(end_time=end)
        return kept

    def request_group(self, members: Sequence[tuple[RequestTimeline, RequestSummary, dict[str, Any],
                                                     Sequence[StepRecord]]],
                      attributes: dict[str, Any], detail: Detail, clock: WallClock,
                      tpot_slo: float | None = None, events: Sequence[Sequence[SpanEvent]] | None = None,
                      ) -> tuple[Materialized | None, list[Materialized | None]]:
        """A user request that asked for n > 1 choices: one request span (named and parented as a
        single request's, carrying ``attributes``, from the first arrival to the last sequence's end)
        over one ``llm.choice`` span per sequence, each with its own phases. The span budget is
        shared: each choice gets an equal part of it. ``events``: each choice's span events, parallel to
        ``members`` (``request``'s). Returns the request span's and each choice's."""
        first = members[0][0]
        start = min(clock.wall_ns(t.arrival) for t, _, _, _ in members)
        end = max(max(start, clock.wall_ns(t.arrival + (s.e2e or 0.0))) for t, s, _, _ in members)
        model = first.requested_model
        name = f"{first.operation} {model}" if model else first.operation
        self.wire_export()  # the route for this request
        root = self._route.tracer.start_span(name, context=first.parent, kind=first.kind, start_time=start,
                                             attributes=attributes)
        if not root.is_recording():
            root.end(end_time=end)
            return None, [None] * len(members)
        failed = next((s for _, s, _, _ in members if s.error_type and not
                       (first.kind is SpanKind.SERVER and s.error_type == ABORTED)), None)
        if failed is not None:
            root.set_status(Status(StatusCode.ERROR, f"{failed.error_type}: a choice failed"))
        budget = max((self._max_spans - 1) // len(members), 1)
        choices = [self.request(t, s, attrs, detail, clock, steps, tpot_slo, choice_of=root, max_spans=budget,
                                events=events[i] if events is not None else ())
                   for i, (t, s, attrs, steps) in enumerate(members)]
        root.end(end_time=end)
        return Materialized(root.get_span_context()), choices

    def _phases(self, root: Span, t: RequestTimeline, start: int, end: int, detail: Detail,
                clock: WallClock, steps: Sequence[StepRecord], tpot_slo: float | None, linked: set[int],
                max_spans: int) -> None:
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
        room = max_spans - (4 if t.token_ts else 3) - 2 * len(preemptions)
        prefill = self._child(sc.SPAN_PREFILL, ctx, sched_ns)
        decode = self._child(sc.SPAN_DECODE, ctx, first_ns) if t.token_ts else None
        if t.chunks:
            rows_later = detail >= Detail.STEPS and len(t.token_ts) > 1
            room -= self._chunks(prefill, t, sched_ns, end, clock, _chunk_steps(t.chunks, steps),
                                 room // 2 if rows_later else room, linked)
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

    def _handoff(self, root: Span, h: Any, start: int, end: int, clock: WallClock) -> None:
        """One ``llm.kv_transfer`` span per direction: the load (or the wait for it) on a decode
        instance, the save on a prefill instance; failed ones carry an error status."""
        ctx = trace.set_span_in_context(root)
        for direction, begin, finish, seconds in ((sc.KV_LOAD, h.load_start, h.load_end, h.load_s),
                                                 (sc.KV_SAVE, h.save_start, h.save_end, h.save_s)):
            if begin is None:
                continue
            b_ns = _clamp(clock.mono_ns(begin), start, end)
            e_ns = _clamp(clock.mono_ns(finish), b_ns, end) if finish is not None else end
            attrs: dict[str, Any] = {sc.KV_TRANSFER_DIRECTION: direction, sc.KV_TRANSFER_CONNECTOR: h.connector}
            if direction == sc.KV_LOAD:
                attrs[sc.KV_TRANSFER_EXTERNAL_TOKENS] = h.external_tokens
                attrs[sc.LATENCY_KV_LOAD] = seconds
                if h.failed_blocks:
                    attrs[sc.KV_TRANSFER_FAILED_BLOCKS] = h.failed_blocks
            else:
                attrs[sc.LATENCY_KV_SAVE] = seconds
            span = self._child(sc.SPAN_KV_TRANSFER, ctx, b_ns, attrs)
            if h.failed and (direction == sc.KV_LOAD or not h.loaded):
                span.set_status(Status(StatusCode.ERROR, h.error_type or "kv hand-off failed"))
            span.end(end_time=e_ns)
        if h.failed and h.load_start is None and h.save_start is None:  # failed before any transfer
            span = self._child(sc.SPAN_KV_TRANSFER, ctx, start, {sc.KV_TRANSFER_CONNECTOR: h.connector})
            span.set_status(Status(StatusCode.ERROR, h.error_type or "kv hand-off failed"))
            span.end(end_time=start)

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
        offset = clock.offset_ns
        rid = t.request_id
        out = self._route.rows(decode, len(rows.rows), facts)  # the route encodes them
        prev = first_ns
        for k, (a, b) in enumerate(rows.rows):
            if k and not k % _YIELD_EVERY:
                yield_gil()
            now = int(ts[b] * 1e9) + offset  # clock.mono_ns, inlined
            now = prev if now < prev else end if now > end else now
            if a == b:
                step = by_token.get(a)
                if step is not None:
                    linked.add(step.step_id)
                    drafted = _drafted(step, rid) if step.spec is not None else None
                    out.step(prev, now, a, t.tokens_at(a) if multi else 1, step, own.get(step.step_id, 0), drafted)
                else:
                    out.step(prev, now, a, t.tokens_at(a) if multi else 1, None, 0)
            else:
                tokens = sum(t.tokens_at(i) for i in range(a, b + 1)) if multi else b - a + 1
                drafted = _window_drafted(by_token, rid, a, b) if t.spec is not None else None
                out.window(prev, now, tokens, a, b, (ts[b] - ts[a - 1]) / tokens, max(gaps[a - 1:b]), drafted)
            prev = now
        out.close()

    def engine_step(self, step: StepRecord, clock: WallClock, engine: str,
                    extra: dict[str, Any] | None = None,
                    events: Sequence[SpanEvent] | None = None) -> None:
        """``events``: (name, attributes, engine monotonic time) each, e.g. LoRA adapter loads (core/lora.py)."""
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
            sc.STEP_BATCH_SIZE: len(step.ids),
            sc.STEP_NUM_RUNNING: step.running,
            sc.STEP_NUM_WAITING: step.waiting,
            sc.STEP_NUM_PREEMPTED: step.preempted,
            sc.SAMPLING_REASON: "served_kept_request",
        }
        if step.kv_cache_usage is not None:
            attrs[sc.STEP_KV_CACHE_USAGE] = step.kv_cache_usage
        spec = step.spec
        if spec is not None:  # speculative decoding: what this step verified, as the scheduler counted it
            attrs[sc.STEP_SPEC_DRAFTS] = spec.drafts
            attrs[sc.STEP_SPEC_DRAFT_TOKENS] = spec.draft_tokens
            attrs[sc.STEP_SPEC_ACCEPTED_TOKENS] = spec.accepted_tokens
        if extra:
            attrs.update(extra)  # anatomy, roofline, GPU sample (core/diagnosis)
        if step.queue_blocked:
            attrs[sc.STEP_QUEUE_BLOCKED] = BLOCKED_NAMES[step.queue_blocked]
        if step.attributes:  # an engine's own numbers win over what the shares above approximate
            attrs.update(step.attributes)
        self.wire_export()
        links = [trace.Link(c) for c in step.links]
        span = self._route.engine_tracer.start_span(sc.SPAN_ENGINE_STEP, context=_ROOT, kind=SpanKind.INTERNAL,
                                       start_time=start, attributes=attrs, links=links)
        for name, attributes, at in events or ():
            span.add_event(name, attributes, timestamp=_clamp(clock.mono_ns(at), start, end))
        span.end(end_time=end)

    def _child(self, name: str, ctx: Any, start: int, attributes: dict | None = None) -> Span:
        return self._route.tracer.start_span(name, context=ctx, start_time=start, attributes=attributes)


_ROOT = trace.set_span_in_context(trace.INVALID_SPAN)
_YIELD_EVERY = 32  # decode-step spans built between offers of the GIL: a slice short against the switch interval
_SAME_OUTPUT_S = 5e-4  # a token's stamp and its step's end: equal, or µs apart (one output batch per client)


def _drafted(step: StepRecord, request_id: str) -> int:
    """The draft tokens the request verified in ``step`` (0: it had none there). O(the step's drafts)."""
    spec, ids = step.spec, step.ids
    for i, d in zip(spec.at, spec.drafted):
        if ids[i] == request_id:
            return d
    return 0


def _window_drafted(by_token: dict[int, StepRecord], request_id: str, a: int, b: int) -> int | None:
    """The draft tokens the request verified over the steps of tokens a..b; None where no step is known."""
    total, known = 0, False
    for i in range(a, b + 1):
        step = by_token.get(i)
        if step is not None:
            known = True
            if step.spec is not None:
                total += _drafted(step, request_id)
    return total if known else None


def yield_gil() -> None:
    """Offer the GIL to the engine's thread. Spans are built on a background thread, but a busy
    Python thread keeps the GIL for up to the switch interval (``sys.getswitchinterval()``) each
    time the engine's thread wants it back; short slices keep the engine's waits short."""
    time.sleep(0)


def _chunk_steps(chunks: Sequence[Any], steps: Sequence[StepRecord]) -> dict[int, StepRecord]:
    """The steps that computed these prefill chunks, by id: a prompt's chunks come first among a request's
    steps, so the scan stops once every chunk's step is found (not a dict of every step it ran in)."""
    want = {c.step_id for c in chunks}
    out: dict[int, StepRecord] = {}
    for st in steps:
        if st.step_id in want:
            out[st.step_id] = st
            if len(out) == len(want):
                break
    return out


def _clamp(v: int, lo: int, hi: int) -> int:
    return lo if v < lo else hi if v > hi else v


def token_steps(token_ts: Sequence[float], steps: Sequence[StepRecord]) -> dict[int, StepRecord]:
    """The engine step that produced each token (index into ``token_ts``), for the steps given.

    A token's stamp is the timestamp of the engine's output batch, which is also the end the
    step hook recorded (step_hooks.py): equal for the first client, microseconds apart for the others
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
