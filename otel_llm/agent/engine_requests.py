"""The agent's join of an engine's request records with its step records (docs/design/enginecore-source.md).

Where the engine process is its requests' source (vLLM's Rust frontend, headless engines), a
``RequestStart`` becomes a request timeline, and a ``RequestFinish`` becomes the engine's statistics for
it, with the stamps the engine does not keep per request read off the steps that served it: scheduled (the
first step's start), the first and last token (the ``end`` of each step in which its share produced an
output, as core/step_tokens.py places them), the prompt's cached tokens (the first step's context). Then
the summary is made with the formulas every path uses (core/finish_facts.settle), so the metrics, the tail
decision, the verdict and the spans are the pipeline's, unchanged.

A finish whose start never arrived stands on its own: a stand-in timeline from its fields gives its
metrics (end-to-end, token counts, outcome); its steps were not held, so no step-derived TTFT.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..core.finish_facts import EngineStats, FinishFacts, settle
from ..core.summary import RequestSummary
from ..core.timeline import QUEUED, SCHEDULED, RequestTimeline, StepRecord
from .records import RequestFinish, RequestStart

OPERATION = "text_completion"  # what an engine does with a request: the endpoint is the frontend's to know
_PROPAGATOR = TraceContextTextMapPropagator()


class StepStamps(NamedTuple):
    """What the steps that served a request say of it (engine monotonic stamps; 0.0: no such step)."""

    scheduled: float
    first_token: float
    last_token: float
    tokens: int  # outputs placed (at most the engine's count)
    cached: int | None  # the context of its first prefill share: the prompt tokens it did not compute


def stamps_from_steps(rid: str, steps: Sequence[StepRecord], prompt: int, outputs: int) -> StepStamps:
    """``steps``: those that served ``rid``, in order. A share produced an output when it decodes, or when
    its prompt chunk completes what the request must compute (``context + tokens >= prompt + outputs so
    far``: a recompute after a preemption included). The first ``outputs`` count (async scheduling may
    schedule one step past the finish)."""
    if not steps:
        return StepStamps(0.0, 0.0, 0.0, 0, None)
    cached = None
    first = last = 0.0
    n = 0
    for k, step in enumerate(steps):
        if n >= outputs:
            break
        prefill_at = step.prefill_at
        if prefill_at:
            i = step.ids.index(rid)
            if i in prefill_at:
                chunk = step.tokens[i] if step.tokens is not None else 1
                contexts = step.contexts
                if k == 0 and contexts is not None:
                    cached = contexts[i]
                if contexts is not None and contexts[i] + chunk < prompt + n:
                    continue
        if not n:
            first = step.end
        last = step.end
        n += 1
    return StepStamps(steps[0].start, first, last, n, cached)


class EngineRequests:
    """The agent's side of an engine's request records. ``provider``: the engine's GenAI provider name."""

    def __init__(self, provider: str = "vllm") -> None:
        self.provider = provider
        self.starts = 0
        self.finishes = 0

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

    def facts(self, r: RequestFinish, steps: Sequence[StepRecord]) -> FinishFacts:
        """The engine's statistics for ``r``, its per-request stamps read off ``steps`` (those that served it)."""
        self.finishes += 1
        s = stamps_from_steps(r.request_id, steps, r.prompt_tokens, r.output_tokens)
        offset = r.end_wall - r.end  # wall minus monotonic, read together in the engine
        first = s.first_token if s.tokens == r.output_tokens else 0.0  # lost steps: vLLM's stamps unknown
        stats = EngineStats(arrival=r.arrival, queued=r.queued, scheduled=s.scheduled, first_token=first,
                            last_token=s.last_token if first else 0.0,
                            first_token_latency=first + offset - r.arrival if first else 0.0,
                            generation_tokens=r.output_tokens, preemptions=r.preemptions)
        events: list[tuple[int, float]] = [(QUEUED, r.queued)] if r.queued else []
        if s.scheduled:
            events.append((SCHEDULED, s.scheduled))
        return FinishFacts(request_id=r.request_id, reason=r.reason, end=r.end_wall, events=events,
                           cache_sources=None, cached_tokens=s.cached, output_characters=None, output_text=None,
                           model=r.model, operation=OPERATION, provider=self.provider,
                           input_tokens=r.prompt_tokens, arrival=r.arrival, stats=stats)

    def settle(self, t: RequestTimeline | None, r: RequestFinish, steps: Sequence[StepRecord]) -> RequestSummary:
        """The summary of ``r`` (fills ``t``, its timeline, where its start arrived)."""
        return settle(t, self.facts(r, steps))


def _parent(headers: dict[str, str] | None) -> Any:
    if not headers:
        return None
    ctx = _PROPAGATOR.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None
