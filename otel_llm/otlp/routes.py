"""How the SDK side hands a kept request's spans to export: one route, chosen when the provider is inspected.

    wire  every processor is the SDK's batch/simple processor around its OTLP exporter (``sdk_bridge``)
          and the tracer's span limits cut nothing we write: spans are written as OTLP bytes
          (``wire_tracer``; decode rows through ``encode.SiblingSpans``) and sent with those exporters
          (``direct_export``): the cheap route, where the SDK's machinery would do nothing more
          (benchmarks/decode_detail.py compares it with ``sdk``).
    sdk   the SDK's own Tracer, anything else behind it: every span through the tracer, so each processor
          sees ``on_start`` then ``on_end`` as for any span (processors we do not know get what the SDK
          gives them).
    api   any other tracer: the public API for everything.

The ``api`` and ``sdk`` routes are the core's (core/span_routes.py); this module adds the wire route.
``Router`` inspects the provider once, and again only when its processors change (a processor added
after ``instrument()`` must see the spans it would have seen); the span builder holds the route it
returns and never asks which kind it is.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span, SpanContext, Tracer

from .. import semconv as sc
from ..guard import Guard
from ..core.span_routes import ApiRoute, Route, Rows, SdkRoute, is_sdk_tracer
from ..core.step_facts import FactsCache
from ..core.timeline import StepRecord
from . import encode as w
from . import sdk_bridge
from .direct_export import DirectExport
from .wire_tracer import WireTracer, usable


class _WireRows:
    """Rows written as OTLP bytes: each attribute's bytes cached (indices, the token count), a step's facts
    encoded once per step (``EncodedFacts``), the spans concatenated and handed to the direct exporter."""

    def __init__(self, direct: DirectExport, parent: SpanContext, count: int, facts: FactsCache,
                 encoded: EncodedFacts) -> None:
        self._direct = direct
        self._parent = parent
        self._facts, self._encoded = facts, encoded
        self._step_rows: w.SiblingSpans | None = None
        self._window_rows: w.SiblingSpans | None = None
        # drawn in one call; a row beyond ``count`` draws its own. Taken inline with ``next`` (no helper
        # method: that was one Python call more per row than the layout before the route encoded rows)
        self._ids = iter(w.span_ids(count))
        self._parts: list[bytes] = []

    def step(self, start: int, end: int, index: int, tokens: int, step: StepRecord | None,
             own_prefill_tokens: int, drafted: int | None = None) -> None:
        rows = self._step_rows
        if rows is None:
            rows = self._step_rows = w.SiblingSpans(self._parent, sc.SPAN_DECODE_STEP)
        attributes = _STEP_INDEX(index) + (_ONE_TOKEN if tokens == 1 else _STEP_TOKENS(tokens))
        if drafted is not None:
            attributes += _STEP_DRAFTED(drafted)
        if step is not None:
            attributes += self._encoded.get(self._facts, step, own_prefill_tokens)
        self._parts.append(rows.encode(next(self._ids, None) or w.span_ids(1)[0], start, end, attributes))

    def window(self, start: int, end: int, tokens: int, first: int, last: int, gap_mean: float,
               gap_max: float, drafted: int | None = None) -> None:
        rows = self._window_rows
        if rows is None:
            rows = self._window_rows = w.SiblingSpans(self._parent, sc.SPAN_DECODE_WINDOW)
        # the five attributes in the order of the dict the other routes build (names encoded once)
        attributes = (_WINDOW_TOKENS(tokens) + _WINDOW_FIRST(first) + _WINDOW_LAST(last) + _WINDOW_MEAN(gap_mean)
                      + _WINDOW_MAX(gap_max))
        if drafted is not None:
            attributes += _WINDOW_DRAFTED(drafted)
        self._parts.append(rows.encode(next(self._ids, None) or w.span_ids(1)[0], start, end, attributes))

    def close(self) -> None:
        if self._parts:
            self._direct.add(b"".join(self._parts), len(self._parts))
            self._parts = []


class EncodedFacts:
    """A step's facts (core.step_facts) as OTLP ``KeyValue`` bytes, encoded once per step: a step is shared
    by every request in its batch. Bounded: cleared when full (it only saves work)."""

    def __init__(self, max_entries: int = 16384) -> None:
        self._max = max_entries
        self._bytes: dict[int, bytes] = {}

    def get(self, facts: FactsCache, step: StepRecord, own_prefill_tokens: int = 0) -> bytes:
        if own_prefill_tokens:  # this request's own chunk is not someone else's prefill: its own facts
            return w.attributes(facts.get(step, own_prefill_tokens))
        hit = self._bytes.get(step.step_id)
        if hit is None:
            if len(self._bytes) >= self._max:
                self._bytes.clear()
            hit = self._bytes[step.step_id] = w.attributes(facts.get(step))
        return hit


class WireRoute:
    """Spans written as OTLP bytes and sent with the provider's own OTLP exporters."""

    kind = "wire"

    def __init__(self, tracer: WireTracer, engine_tracer: WireTracer, direct: DirectExport) -> None:
        self.tracer, self.engine_tracer, self.direct = tracer, engine_tracer, direct
        self._encoded = EncodedFacts()

    def rows(self, parent: Span, count: int, facts: FactsCache) -> Rows:
        return _WireRows(self.direct, parent.get_span_context(), count, facts, self._encoded)


class Router:
    """Holds the route for a tracer (and the same tracer under the engine-step service), re-inspecting
    the provider only when its span processors change."""

    def __init__(self, tracer: Tracer, engine_tracer: Tracer, direct_export: bool = True,
                 guard: Guard | None = None) -> None:
        self._tracer, self._engine_tracer = tracer, engine_tracer
        self._guard = guard if guard is not None else Guard()  # the owner's: the direct exporter's errors
        self._sdk = is_sdk_tracer(tracer)
        self._fallback: Route = ApiRoute(tracer, engine_tracer)
        if self._sdk:
            self._fallback = SdkRoute(tracer, engine_tracer)
        self._wire_allowed = direct_export and self._sdk and usable(tracer)
        self._route: Route = self._fallback
        self._for: Any = None  # the processors the current route was chosen for
        self.current()

    def current(self) -> Route:
        """The route for the provider as it is now."""
        if not self._wire_allowed:
            return self._route
        try:
            processors = sdk_bridge.span_processors(self._tracer)
        except sdk_bridge.Moved:
            processors = None
        if processors is not self._for:
            self._for = processors
            self._choose()
        return self._route

    def _choose(self) -> None:
        if self._route.direct is not None:
            self._route.direct.close(timeout=1.0)
        direct = DirectExport.for_tracer(self._tracer, self._guard) if self._for is not None else None
        if direct is None:
            self._route = self._fallback
            return
        tracer = WireTracer(self._tracer, direct)
        engine = self._engine_tracer
        engine_tracer = tracer if engine is self._tracer else WireTracer(
            engine, direct, w.RequestFrame.for_tracer(engine.resource, sdk_bridge.instrumentation_scope(engine)))
        self._route = WireRoute(tracer, engine_tracer, direct)

    @property
    def route(self) -> Route:
        """The route chosen at the last inspection (no new look at the provider)."""
        return self._route


_STEP_INDEX = w.IntAttribute(sc.STEP_INDEX)
_STEP_TOKENS = w.IntAttribute(sc.STEP_TOKENS)
_ONE_TOKEN = _STEP_TOKENS(1)  # a decode step's token count, but for speculative decoding's multi-token steps
_WINDOW_TOKENS = w.IntAttribute(sc.WINDOW_TOKENS)
_WINDOW_FIRST = w.IntAttribute(sc.WINDOW_FIRST_INDEX)
_WINDOW_LAST = w.IntAttribute(sc.WINDOW_LAST_INDEX)
_WINDOW_MEAN = w.FloatAttribute(sc.WINDOW_GAP_MEAN)
_WINDOW_MAX = w.FloatAttribute(sc.WINDOW_GAP_MAX)
_STEP_DRAFTED = w.IntAttribute(sc.STEP_DRAFTED)
_WINDOW_DRAFTED = w.IntAttribute(sc.WINDOW_DRAFTED)
