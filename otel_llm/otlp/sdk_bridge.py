"""Every private opentelemetry-sdk (and OTLP exporter) name we read, in one place.

Direct export (``direct_export``, ``wire_tracer``) sends spans we encoded ourselves through the
exporters the tracer provider already has, and writes them as the SDK would. For that it must see
what the public API does not show: which processors a provider has and what is behind them, a
batch processor's schedule, an exporter's client, a tracer's span limits and scope. Those reads
are here and nowhere else (tests/otlp/test_otlp_package.py checks that), so a new SDK release that
moves one breaks this module alone, and ``check()`` says which one.

Tested with opentelemetry-sdk and opentelemetry-exporter-otlp-proto-{http,grpc}:
  * 1.45.2 (the shared venv; the HTTP exporter's ``_client``, ``_OTLPHTTPClient``),
  * 1.34.0 (``MIN_SDK``, the oldest release direct export supports: the first with
    ``BatchSpanProcessor._batch_processor``; the HTTP exporter then posts with its ``_export``).
CI runs the fence tests against ``MIN_SDK`` in a second small venv (scripts/sdk_floor.sh).

Below ``MIN_SDK``, or when a release moves an internal, direct export is off and every span takes
the SDK's own path: still correct, at a multiple of the CPU per span (benchmarks/decode_detail.py).
That is never silent: ``senders_of`` logs one warning naming what moved, and ``check()`` (run by the
tests) fails on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from ..guard import Guard

_log = logging.getLogger(__name__)

MIN_SDK = "1.34.0"  # keep equal to the floor in pyproject.toml and scripts/sdk_floor.sh
TESTED_WITH = ("1.34.0", "1.45.2")

Send = Callable[[bytes], bool]


class Moved(Exception):
    """A private SDK name this module reads is not where it was (a new or too old SDK release)."""


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise Moved(f"{type(obj).__module__}.{type(obj).__qualname__}.{name}") from None


# -- tracer --------------------------------------------------------------------------------------------

def instrumentation_scope(tracer: Any) -> Any:
    """The SDK tracer's ``InstrumentationScope`` (``Tracer._instrumentation_scope``)."""
    return _attr(tracer, "_instrumentation_scope")


def span_limits(tracer: Any) -> Any:
    """The SDK tracer's ``SpanLimits`` (``Tracer._span_limits``)."""
    return _attr(tracer, "_span_limits")


def span_processors(tracer: Any) -> tuple[Any, ...]:
    """The processors behind an SDK tracer's multi-span processor (``_span_processors``): the
    tuple is replaced, not changed, when one is added, so its identity says whether to look again."""
    return _attr(_attr(tracer, "span_processor"), "_span_processors")


def samples_local_children(sampler: Any) -> bool:
    """Whether ``sampler`` samples every span whose parent is a local sampled span, keeping the attributes
    given and the parent's trace state, and reads nothing else: the SDK's default ``ParentBased`` whose
    local-sampled-parent delegate (``ParentBased._local_parent_sampled``) is ``ALWAYS_ON``. Its
    ``should_sample`` then returns ``SamplingResult(RECORD_AND_SAMPLE, attributes, parent's trace_state)``."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    return type(sampler) is ParentBased and _attr(sampler, "_local_parent_sampled") is ALWAYS_ON


# -- processors and exporters ----------------------------------------------------------------------

@dataclass(frozen=True)
class Destination:
    """What one span processor does with a span: hand it to ``exporter``, after ``schedule_delay`` s."""

    exporter: Any
    schedule_delay: float | None  # None: at once (SimpleSpanProcessor)


def destination(processor: Any) -> Destination | None:
    """The exporter behind the SDK's own batch or simple processor; None for any other processor
    (which may filter, redact or enrich: its spans must go through it)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if type(processor) is BatchSpanProcessor:
        batch = _attr(processor, "_batch_processor")
        return Destination(_attr(batch, "_exporter"), float(_attr(batch, "_schedule_delay")))
    if type(processor) is SimpleSpanProcessor:
        return Destination(processor.span_exporter, None)
    return None


def _http_exporter_type() -> type | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    return OTLPSpanExporter


def _grpc_exporter_type() -> type | None:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    return OTLPSpanExporter


def sender(exporter: Any) -> Send | None:
    """A function that sends one serialized ``ExportTraceServiceRequest`` with this exporter's own client
    (endpoint, headers, TLS, compression, timeout: the user's); None if it is not the SDK's OTLP exporter.
    Raises ``Moved`` when it is, but its internals are not where this module reads them."""
    kind = type(exporter)
    if kind is not None and kind is _http_exporter_type():
        return _http_sender(exporter)
    if kind is not None and kind is _grpc_exporter_type():
        return _grpc_sender(exporter)
    return None


def _http_sender(exporter: Any) -> Send:
    _attr(exporter, "_shutdown")
    client = getattr(exporter, "_client", None)
    if client is not None and callable(getattr(client, "export", None)):  # 1.45 on: the shared HTTP client
        def send_http(data: bytes) -> bool:
            if exporter._shutdown:
                return False
            return bool(exporter._client.export(data).success)  # retries with backoff, like export()

        return send_http
    post = _attr(exporter, "_export")  # 1.34 - 1.44: one post (retried once on a dropped connection)

    def send_http_before_1_45(data: bytes) -> bool:
        if exporter._shutdown:
            return False
        try:
            return bool(post(data).ok)
        except Exception as exc:  # requests' errors: a dead or refusing endpoint
            _log.debug("otel-llm direct export over HTTP failed: %s", exc)
            return False

    return send_http_before_1_45


def _grpc_sender(exporter: Any) -> Send:
    from .messages import ExportTraceServiceRequest

    for name in ("_client", "_shutdown", "_headers", "_timeout"):
        _attr(exporter, name)

    def send_grpc(data: bytes) -> bool:
        client = exporter._client
        if exporter._shutdown or client is None:
            return False
        request = ExportTraceServiceRequest.FromString(data)  # the stub takes a message: parsed back in C
        for attempt in range(2):  # one retry for a stale channel; a dead collector costs one timeout
            try:
                client.Export(request=request, metadata=exporter._headers, timeout=exporter._timeout)
                return True
            except Exception as exc:
                if attempt:
                    _log.debug("otel-llm direct export over gRPC failed: %s", exc)
        return False

    return send_grpc


@dataclass(frozen=True)
class Senders:
    """A sender per processor of a provider that only exports to OTLP, and the shortest schedule."""

    sends: tuple[Send, ...]
    schedule_delay: float


def senders_of(tracer: Any, guard: Guard) -> Senders | None:
    """Senders for every processor of this SDK tracer's provider, if each is the SDK's batch or
    simple processor around the SDK's OTLP exporter; else None (the SDK path is used). A moved
    internal is logged once as a warning (by ``guard``, the owner's): direct export is then off, which costs
    CPU, not spans."""
    try:
        found = senders_of_strict(tracer)
        return found if found.sends else None
    except LookupError:  # another processor or exporter: its spans must go through it
        return None
    except Moved as moved:
        guard.warn_once(f"sdk_bridge moved: {moved}", "otel-llm: direct export is off (spans go through the SDK, "
                        "~10x the CPU): %s moved in this opentelemetry-sdk release (tested with %s)", moved,
                        ", ".join(TESTED_WITH))
        return None


# -- the fence's own check ---------------------------------------------------------------------------

def check() -> list[str]:
    """Every internal above, read from a real provider with the SDK's batch and simple processors
    around its OTLP HTTP and gRPC exporters; what is missing or not as expected (empty: all there)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    problems: list[str] = []
    http, grpc_ = _http_exporter_type(), _grpc_exporter_type()
    if http is None or grpc_ is None:
        return ["the OTLP HTTP or gRPC span exporter is not installed"]
    provider = TracerProvider()
    exporters = [http(endpoint="http://127.0.0.1:9/v1/traces"), grpc_(endpoint="127.0.0.1:9", insecure=True)]
    for e in exporters:
        provider.add_span_processor(BatchSpanProcessor(e, schedule_delay_millis=1234))
    provider.add_span_processor(SimpleSpanProcessor(exporters[0]))
    tracer = provider.get_tracer("otel_llm.sdk_bridge.check", "1")
    try:
        for name, read in (("Tracer._instrumentation_scope", instrumentation_scope),
                           ("Tracer._span_limits", span_limits), ("_span_processors", span_processors)):
            try:
                read(tracer)
            except Moved as m:
                problems.append(f"{name}: {m}")
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

        try:
            if not samples_local_children(ParentBased(ALWAYS_ON)):
                problems.append("ParentBased(ALWAYS_ON) not recognized as sampling local sampled children")
        except Moved as m:
            problems.append(f"ParentBased._local_parent_sampled: {m}")
        try:
            found = senders_of_strict(tracer)
            if len(found.sends) != 3:
                problems.append(f"expected 3 senders, found {len(found.sends)}")
            if abs(found.schedule_delay - 1.234) > 1e-9:
                problems.append(f"schedule delay read as {found.schedule_delay}, not 1.234 s")
        except Moved as m:
            problems.append(str(m))
        except LookupError as e:
            problems.append(str(e))
    finally:
        provider.shutdown()
    return problems


def senders_of_strict(tracer: Any) -> Senders:
    """``senders_of`` that raises instead of falling back (for ``check``)."""
    sends, delays = [], []
    for p in span_processors(tracer):
        dest = destination(p)
        if dest is None:
            raise LookupError(f"{type(p).__name__} is not recognized as the SDK's batch or simple processor")
        send = sender(dest.exporter)
        if send is None:
            raise LookupError(f"{type(dest.exporter).__name__} is not recognized as the SDK's OTLP exporter")
        sends.append(send)
        if dest.schedule_delay is not None:
            delays.append(dest.schedule_delay)
    return Senders(tuple(sends), min(delays, default=5.0))
