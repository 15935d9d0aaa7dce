"""The routes a kept request's spans take to export, as the span builder sees them (``SpanBuilder``).

The core lays spans out as values and hands them to a route; a route builds its own form of them. Here:
the routes of the public OpenTelemetry API (``api``, and ``sdk``: the SDK's own tracer), which any tracer
takes. The OTLP wire route (bytes sent with the provider's own OTLP exporters) and the ``Router`` that
picks it when a provider allows are in ``otel_llm.otlp.routes``; the instrumentors hand that router to
the pipeline, so nothing here imports the OTLP layer.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from opentelemetry import trace
from opentelemetry.trace import Span, Tracer

from .. import semconv as sc
from ..guard import Guard
from .step_facts import FactsCache
from .timeline import StepRecord


class DirectSink(Protocol):
    """A route's own exporter (the wire route's direct export): its counts, flushed and closed with it."""

    counts: Any

    def flush(self, timeout: float | None = 10.0) -> bool: ...
    def close(self, timeout: float = 5.0) -> bool: ...


class Rows(Protocol):
    """A request's decode rows (sibling spans under its decode span), laid out by the core as plain values
    and encoded here, by the route: added in order, finished by ``close``."""

    def step(self, start: int, end: int, index: int, tokens: int, step: StepRecord | None,
             own_prefill_tokens: int, drafted: int | None = None) -> None:
        """An ``llm.decode.step`` span: token ``index``, its ``tokens``, and the facts of the engine step
        that produced it (``step``; ``own_prefill_tokens``: this request's own prefill in that step;
        ``drafted``: the draft tokens it verified there, None without speculative decoding)."""

    def window(self, start: int, end: int, tokens: int, first: int, last: int, gap_mean: float,
               gap_max: float, drafted: int | None = None) -> None:
        """An ``llm.decode.window`` span: tokens ``first``..``last``, their count and gaps (``drafted``:
        the draft tokens verified over them, None without speculative decoding or a known step)."""

    def close(self) -> None: ...


class Route(Protocol):
    kind: str  # "wire", "sdk" or "api": for stats and tests, never for choosing behaviour
    tracer: Tracer  # request, phase, chunk and preemption spans
    engine_tracer: Tracer  # engine-step spans (their own service)
    direct: DirectSink | None  # the direct exporter this route sends with (its counts), if any

    def rows(self, parent: Span, count: int, facts: FactsCache) -> Rows: ...


class Router(Protocol):
    """Holds the route for a tracer, looking at its provider again in ``current``."""

    def current(self) -> Route: ...

    @property
    def route(self) -> Route: ...


# Router(tracer, engine_tracer, direct_export, guard): the router a pipeline's span builder uses (the
# guard: the pipeline's owner's, which counts the export route's errors)
RouterFactory = Callable[[Tracer, Tracer, bool, Guard], Router]


class _ApiRows:
    """Rows as attribute dicts, through a tracer."""

    def __init__(self, tracer: Tracer, parent: Span, facts: FactsCache) -> None:
        self._tracer = tracer
        self._ctx = trace.set_span_in_context(parent)
        self._facts = facts

    def step(self, start: int, end: int, index: int, tokens: int, step: StepRecord | None,
             own_prefill_tokens: int, drafted: int | None = None) -> None:
        attrs = {sc.STEP_INDEX: index, sc.STEP_TOKENS: tokens}
        if drafted is not None:
            attrs[sc.STEP_DRAFTED] = drafted
        if step is not None:
            attrs.update(self._facts.get(step, own_prefill_tokens))
        self._tracer.start_span(sc.SPAN_DECODE_STEP, context=self._ctx, start_time=start,
                                attributes=attrs).end(end_time=end)

    def window(self, start: int, end: int, tokens: int, first: int, last: int, gap_mean: float,
               gap_max: float, drafted: int | None = None) -> None:
        attrs = {sc.WINDOW_TOKENS: tokens, sc.WINDOW_FIRST_INDEX: first, sc.WINDOW_LAST_INDEX: last,
                 sc.WINDOW_GAP_MEAN: gap_mean, sc.WINDOW_GAP_MAX: gap_max}
        if drafted is not None:
            attrs[sc.WINDOW_DRAFTED] = drafted
        self._tracer.start_span(sc.SPAN_DECODE_WINDOW, context=self._ctx, start_time=start,
                                attributes=attrs).end(end_time=end)

    def close(self) -> None:
        pass


class ApiRoute:
    kind = "api"
    direct = None

    def __init__(self, tracer: Tracer, engine_tracer: Tracer) -> None:
        self.tracer, self.engine_tracer = tracer, engine_tracer

    def rows(self, parent: Span, count: int, facts: FactsCache) -> Rows:
        return _ApiRows(self.tracer, parent, facts)


class SdkRoute(ApiRoute):
    """The SDK's Tracer, for everything: decode rows too, so every processor gets ``on_start`` (the span
    live, its parent context) before ``on_end``, as for any span (the SDK builds its spans only through a
    tracer). The route for processors we do not know: they see exactly what the SDK gives them."""

    kind = "sdk"


def is_sdk_tracer(tracer: Any) -> bool:
    try:
        from opentelemetry.sdk.trace import Tracer as SDKTracer
    except ImportError:
        return False
    return isinstance(tracer, SDKTracer)


class ApiRouter:
    """The routes of the public API alone: the SDK's tracer's (``sdk``) or any other's (``api``). The
    default of a pipeline built without an OTLP router (``otel_llm.otlp.routes.Router``)."""

    def __init__(self, tracer: Tracer, engine_tracer: Tracer, direct_export: bool = True,
                 guard: Guard | None = None) -> None:
        self._route: Route = (SdkRoute if is_sdk_tracer(tracer) else ApiRoute)(tracer, engine_tracer)

    def current(self) -> Route:
        return self._route

    @property
    def route(self) -> Route:
        return self._route
