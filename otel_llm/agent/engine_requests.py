"""The agent's join of an engine's request records with its step records (docs/design/enginecore-source.md).

Where the engine process is its requests' source (vLLM's Rust frontend, headless engines), a
``RequestStart`` becomes a request timeline, and a ``RequestFinish`` becomes the engine's statistics for
it, with the stamps the engine does not keep per request read off the steps that served it: scheduled (the
first step's start), the first and last token (the ``end`` of each step in which its share produced an
output, as core/step_tokens.py places them), the prompt's cached tokens (the first step's context). Its
steps are joined once (``Pipeline.steps_of``, kept on its timeline for the pipeline) and its outputs placed
on them once: the same placement is its token times, which the pipeline takes as they are. Then the
summary is made with the formulas every path uses (core/finish_facts.settle), so the metrics, the tail
decision, the verdict and the spans are the pipeline's, unchanged.

A finish whose start never arrived stands on its own: a stand-in timeline from its fields gives its
metrics (end-to-end, token counts, outcome); its steps were not held, so no step-derived TTFT.

Where a Python frontend serves the requests, the engine's records say so (``enriched``) and the frontend
sends one ``RequestEnrichment`` a request when it lets it go: joined here on the engine's request id
(``Enrichments``). The request is settled once, when both are in: the engine's finish usually comes first
(it is sent before the last output leaves the engine) and waits for the enrichment at most ``HOLD_TURNS``
turns of the agent, then settles without it (counted); a stop string the frontend found comes the other
way (the frontend finishes the request, then aborts it in the engine), and the frontend's reason wins: a
flush right after waits a bounded while for such an engine finish (agent/process.py, ``FLUSH_STEP_WAIT_S``). What
the enrichment says wins where both know: the operation, the parent, the finish reason, the tokens the
frontend received, and TTFT and end-to-end as the frontend received the outputs (vLLM's own statistics).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..core.finish_facts import EngineStats, FinishFacts, settle
from ..core.step_tokens import output_times
from ..core.summary import RequestSummary
from ..core.timeline import QUEUED, SCHEDULED, RequestGroup, RequestTimeline, StepRecord
from .records import RequestEnrichment, RequestFinish, RequestStart

OPERATION = "text_completion"  # what an engine does with a request: the endpoint is the frontend's to know
_PROPAGATOR = TraceContextTextMapPropagator()
HOLD_TURNS = 100  # agent turns an engine finish waits for its enrichment (2 s busy, 10 s idle)
# ... and an enrichment for its engine finish (a stop string's abort follows at once; a request another
# process's engine ran, e.g. a --headless rank under a Python head, never reaches this agent: not kept for ever)
ENRICHMENT_TURNS = 4 * HOLD_TURNS
MAX_WAITING = 65536  # enrichments and engine finishes waiting for each other, each (then the oldest goes)


class StepStamps(NamedTuple):
    """What the steps that served a request say of it (engine monotonic stamps; 0.0: no such step)."""

    scheduled: float
    first_token: float
    last_token: float
    tokens: int  # outputs placed (at most the engine's count)
    cached: int | None  # the context of its first prefill share: the prompt tokens it did not compute
    times: list[float]  # the outputs' times (core/step_tokens.output_times): its token times where complete


def stamps_from_steps(rid: str, steps: Sequence[StepRecord], prompt: int, outputs: int) -> StepStamps:
    """``steps``: those that served ``rid``, in order. Its outputs placed once (core/step_tokens.py's rule,
    the first ``outputs`` of them): their first and last are its token stamps."""
    if not steps:
        return StepStamps(0.0, 0.0, 0.0, 0, None, [])
    times, cached = output_times(rid, steps, prompt, outputs)
    if not times:
        return StepStamps(steps[0].start, 0.0, 0.0, 0, cached, times)
    return StepStamps(steps[0].start, times[0], times[-1], len(times), cached, times)


class EngineRequests:
    """The agent's side of an engine's request records. ``provider``: the engine's GenAI provider name."""

    def __init__(self, provider: str = "vllm") -> None:
        self.provider = provider
        self.starts = 0
        self.finishes = 0
        self.enrichments = Enrichments()

    def timeline(self, r: RequestStart) -> RequestTimeline:
        self.starts += 1
        t = RequestTimeline(request_id=r.request_id, arrival=r.arrival, model=r.model, operation=OPERATION,
                            provider=self.provider, kind=SpanKind.SERVER, parent=_parent(r.trace_headers),
                            response_id=r.external_id or r.request_id, request_attributes=dict(r.sampling),
                            input_tokens=r.prompt_tokens)
        t.lora_name, t.lora_id = r.lora_name, r.lora_id
        t.steps_give_tokens = True
        t.events = [(QUEUED, r.queued)]
        return t

    def facts(self, r: RequestFinish, s: StepStamps, outputs: int,
              e: RequestEnrichment | None = None) -> FinishFacts:
        """The engine's statistics for ``r``, its per-request stamps ``s`` (read off the steps that served it,
        ``outputs`` of them placed at most); with ``e``, its frontend's enrichment, what the frontend saw where
        it saw it."""
        self.finishes += 1
        offset = r.end_wall - r.end  # wall minus monotonic, read together in the engine
        first = s.first_token if s.tokens == outputs else 0.0  # lost steps: vLLM's stamps unknown
        latency = first + offset - r.arrival if first else 0.0
        if first and e is not None and e.first_output:  # vLLM's own TTFT: when the frontend received it
            latency = e.first_output - r.arrival
        stats = EngineStats(arrival=r.arrival, queued=r.queued, scheduled=s.scheduled, first_token=first,
                            last_token=s.last_token if first else 0.0, first_token_latency=latency,
                            generation_tokens=outputs, preemptions=r.preemptions)
        events: list[tuple[int, float]] = [(QUEUED, r.queued)] if r.queued else []
        if s.scheduled:
            events.append((SCHEDULED, s.scheduled))
        if e is None:
            return FinishFacts(request_id=r.request_id, reason=r.reason, end=r.end_wall, events=events,
                               cache_sources=None, cached_tokens=s.cached, output_characters=None, output_text=None,
                               model=r.model, operation=OPERATION, provider=self.provider,
                               input_tokens=r.prompt_tokens, arrival=r.arrival, stats=stats)
        return FinishFacts(request_id=r.request_id, reason=e.reason or r.reason, end=e.end or r.end_wall,
                           events=events, cache_sources=None, cached_tokens=s.cached,
                           output_characters=e.output_characters, output_text=e.output_text,
                           model=e.model or r.model, operation=e.operation, provider=self.provider,
                           input_tokens=r.prompt_tokens, arrival=r.arrival, stats=stats)

    def settle(self, t: RequestTimeline | None, r: RequestFinish, steps: Sequence[StepRecord],
               e: RequestEnrichment | None = None) -> RequestSummary:
        """The summary of ``r`` (fills ``t``, its timeline, where its start arrived), with its enrichment.
        ``steps``: those that served it (the pipeline's one join, ``Pipeline.steps_of``). Its outputs are
        placed on them once: their stamps make its statistics, and, where they add up to its count (the
        engine's stamps are then known) and no step of it was lost, they are its token times, which the
        pipeline then takes as they are."""
        if e is not None and t is not None:
            self.enrichments.apply(t, e)
        outputs = e.output_tokens if e is not None and e.output_tokens is not None else r.output_tokens
        s = stamps_from_steps(r.request_id, steps, r.prompt_tokens, outputs)
        summary = settle(t, self.facts(r, s, outputs, e))
        if t is not None and t.token_window is not None and not t.steps_lost:
            t.token_ts = s.times
        return summary


class Enrichments:
    """A Python frontend's enrichments and the engine's finishes, waiting for each other (module docstring).
    ``ready(finishes)`` at each turn of the agent: the engine finishes to settle now, each with its enrichment
    (or None: none is coming, or it waited too long)."""

    def __init__(self, hold_turns: int = HOLD_TURNS, max_waiting: int = MAX_WAITING,
                 enrichment_turns: int = ENRICHMENT_TURNS) -> None:
        self.hold_turns, self.max_waiting, self.enrichment_turns = hold_turns, max_waiting, enrichment_turns
        self.arrived: dict[str, RequestEnrichment] = {}  # by the engine's request id, until its finish comes
        self.came: dict[str, int] = {}  # ... and the turn it came at (in the same order)
        self.turns = 0
        # arrived since the last flush: a flush waits a bounded while for their engine finishes (a stop string:
        # the frontend lets the request go first, the engine's abort follows), once each
        self.fresh: set[str] = set()
        self.held: dict[str, list] = {}  # engine finishes waiting for their enrichment: [record, turns waited]
        self.groups: dict[str, RequestGroup] = {}  # n > 1: the user requests whose sequences are settling
        self.joined = 0  # requests settled with their enrichment
        self.missing = 0  # engine finishes settled without the enrichment they waited for (lost, or late)
        self.dropped = 0  # enrichments whose engine finish never came (over max_waiting, or ENRICHMENT_TURNS)

    def add(self, e: RequestEnrichment) -> None:
        arrived = self.arrived
        if len(arrived) >= self.max_waiting:
            self._drop(next(iter(arrived)))
        rid = e.request_id
        if rid in arrived:  # (a repeated id: its turn is the latest)
            del arrived[rid], self.came[rid]
        arrived[rid] = e
        self.came[rid] = self.turns
        self.fresh.add(rid)

    def _drop(self, rid: str) -> None:
        del self.arrived[rid], self.came[rid]
        self.fresh.discard(rid)
        self.dropped += 1

    def _take(self, rid: str) -> RequestEnrichment | None:
        e = self.arrived.pop(rid, None)
        if e is not None:
            del self.came[rid]
            self.fresh.discard(rid)
        return e

    def unfinished(self, finishes: Sequence[RequestFinish]) -> set[str]:
        """The enrichments arrived since the last flush whose engine finish is neither in ``finishes`` nor
        held: what a flush waits for (and then not again: ``flushed``)."""
        fresh = self.fresh
        if not fresh:
            return set()
        have = {r.request_id for r in finishes}
        arrived, held = self.arrived, self.held
        return {rid for rid in fresh if rid in arrived and rid not in have and rid not in held}

    def flushed(self) -> None:
        self.fresh.clear()

    def ready(self, finishes: Sequence[RequestFinish],
              force: bool = False) -> list[tuple[RequestFinish, RequestEnrichment | None]]:
        """``force``: the held finishes go now, without their enrichment where it has not come (the agent's
        pipeline is closing). A flush does not force them: the frontend sent its enrichments before it."""
        out: list[tuple[RequestFinish, RequestEnrichment | None]] = []
        held, take = self.held, self._take
        for r in finishes:
            e = take(r.request_id)
            if e is not None or not r.enriched:
                out.append((r, e))
                self.joined += e is not None
            else:
                if len(held) >= self.max_waiting:
                    oldest = next(iter(held))
                    out.append((held.pop(oldest)[0], None))
                    self.missing += 1
                held[r.request_id] = [r, -1]
        for rid in list(held):
            waiting = held[rid]
            e = take(rid)
            waiting[1] += 1
            if e is not None or force or waiting[1] >= self.hold_turns:
                del held[rid]
                out.append((waiting[0], e))
                if e is None:
                    self.missing += 1
                else:
                    self.joined += 1
        self.turns += 1
        came, gone = self.came, self.turns - self.enrichment_turns  # came at ``gone`` or before: waited enough
        while came and came[next(iter(came))] <= gone:  # (in arrival order: the oldest first)
            self._drop(next(iter(came)))
        return out

    def apply(self, t: RequestTimeline, e: RequestEnrichment) -> None:
        """What the frontend knows, onto the engine's timeline of the request."""
        t.operation = e.operation
        t.kind = SpanKind.SERVER if e.server else SpanKind.INTERNAL
        parent = _parent(e.parent)
        if parent is not None:
            t.parent = parent
        if e.response_id:
            t.response_id = e.response_id
        if e.model:
            t.model = e.model
        t.request_attributes.update(e.attributes)
        t.prompt_text = e.prompt_text
        if e.group_id is not None:
            g = self.groups.get(e.group_id)
            if g is None or g.complete:
                g = self.groups[e.group_id] = RequestGroup(e.group_id, e.group_size, e.group_expected)
            t.group, t.choice_index = g, e.choice_index
            if len(g.finished) + 1 >= g.expected:  # its last sequence: the pipeline holds it from here
                del self.groups[e.group_id]


def _parent(headers: dict[str, str] | None) -> Any:
    if not headers:
        return None
    ctx = _PROPAGATOR.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None
