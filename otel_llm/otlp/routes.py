"""How the SDK side hands a kept request's spans to export: one route, chosen when the provider is inspected.

    wire  every processor is the SDK's batch/simple processor around its OTLP exporter (``sdk_bridge``)
          and the tracer's span limits cut nothing we write: spans are written as OTLP bytes
          (``wire_tracer``; decode rows through ``encode.SiblingSpans``) and sent with those exporters
          (``direct_export``): ~2 µs a span instead of ~25.
    sdk   the SDK's own Tracer, anything else behind it: every span through the tracer, so each processor
          sees ``on_start`` then ``on_end`` as for any span (processors we do not know get what the SDK
          gives them).
    api   any other tracer: the public API for everything.

``Router`` inspects the provider once, and again only when its processors change (a processor added
after ``instrument()`` must see the spans it would have seen); the span builder holds the route it
returns and never asks which kind it is.
"""

from __future__ import annotations

from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, Tracer

from . import encode as w
from . import sdk_bridge
from .direct_export import DirectExport
from .wire_tracer import WireTracer, usable



class Rows(Protocol):
    """Sibling spans under one parent (a request's decode rows): added in order, finished by ``close``."""

    encoded: bool  # True: decode steps may come as encoded attribute bytes (``add_encoded``)

    def add(self, name: str, start: int, end: int, attributes: dict[str, Any]) -> None: ...
    def add_encoded(self, name: str, start: int, end: int, attributes: bytes) -> None: ...
    def close(self) -> None: ...


class Route(Protocol):
    kind: str  # "wire", "sdk" or "api": for stats and tests, never for choosing behaviour
    tracer: Tracer  # request, phase, chunk and preemption spans
    engine_tracer: Tracer  # engine-step spans (their own service)
    direct: DirectExport | None  # the direct exporter this route sends with (its counts), if any

    def rows(self, parent: Span, count: int) -> Rows: ...


class _ApiRows:
    encoded = False

    def __init__(self, tracer: Tracer, parent: Span) -> None:
        self._tracer = tracer
        self._ctx = trace.set_span_in_context(parent)

    def add(self, name: str, start: int, end: int, attributes: dict[str, Any]) -> None:
        self._tracer.start_span(name, context=self._ctx, start_time=start, attributes=attributes).end(end_time=end)

    def add_encoded(self, name: str, start: int, end: int, attributes: bytes) -> None:
        raise TypeError("this route takes attribute dicts")

    def close(self) -> None:
        pass


class ApiRoute:
    kind = "api"
    direct = None

    def __init__(self, tracer: Tracer, engine_tracer: Tracer) -> None:
        self.tracer, self.engine_tracer = tracer, engine_tracer

    def rows(self, parent: Span, count: int) -> Rows:
        return _ApiRows(self.tracer, parent)


class SdkRoute(ApiRoute):
    """The SDK's Tracer, for everything: decode rows too, so every processor gets ``on_start`` (the span
    live, its parent context) before ``on_end``, as for any span (the SDK builds its spans only through a
    tracer). The route for processors we do not know: they see exactly what the SDK gives them."""

    kind = "sdk"


class _WireRows:
    encoded = True

    def __init__(self, direct: DirectExport, parent: SpanContext, count: int) -> None:
        self._direct = direct
        self._parent = parent
        self._encoders: dict[str, w.SiblingSpans] = {}
        self._ids = w.span_ids(count)  # drawn in one call
        self._parts: list[bytes] = []

    def add_encoded(self, name: str, start: int, end: int, attributes: bytes) -> None:
        encoder = self._encoders.get(name)
        if encoder is None:
            encoder = self._encoders[name] = w.SiblingSpans(self._parent, name)
        parts = self._parts
        sid = self._ids[len(parts)] if len(parts) < len(self._ids) else w.span_ids(1)[0]
        parts.append(encoder.encode(sid, start, end, attributes))

    def add(self, name: str, start: int, end: int, attributes: dict[str, Any]) -> None:
        self.add_encoded(name, start, end, w.attributes(attributes))

    def close(self) -> None:
        if self._parts:
            self._direct.add(b"".join(self._parts), len(self._parts))
            self._parts = []


class WireRoute:
    """Spans written as OTLP bytes and sent with the provider's own OTLP exporters."""

    kind = "wire"

    def __init__(self, tracer: WireTracer, engine_tracer: WireTracer, direct: DirectExport) -> None:
        self.tracer, self.engine_tracer, self.direct = tracer, engine_tracer, direct

    def rows(self, parent: Span, count: int) -> Rows:
        return _WireRows(self.direct, parent.get_span_context(), count)


def _is_sdk_tracer(tracer: Any) -> bool:
    try:
        from opentelemetry.sdk.trace import Tracer as SDKTracer
    except ImportError:
        return False
    return isinstance(tracer, SDKTracer)


class Router:
    """Holds the route for a tracer (and the same tracer under the engine-step service), re-inspecting
    the provider only when its span processors change."""

    def __init__(self, tracer: Tracer, engine_tracer: Tracer, direct_export: bool = True) -> None:
        self._tracer, self._engine_tracer = tracer, engine_tracer
        self._sdk = _is_sdk_tracer(tracer)
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
        direct = DirectExport.for_tracer(self._tracer) if self._for is not None else None
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
