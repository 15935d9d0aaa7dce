"""otel-llm's own health as metrics, beside the ones it derives: what it kept, sent and dropped, its errors.

"A dead exporter costs nothing but dropped telemetry, counted" needs the count somewhere an
operator looks. Observable counters cost nothing until the meter provider collects them;
``otel_llm.stats()`` returns the same numbers as a dict.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from . import semconv as sc
from .guard import GUARD

REQUESTS = "otel_llm.requests"  # by otel_llm.state: started, finished, kept, untracked, spans_dropped
SPANS_SENT = "otel_llm.spans.sent_direct"  # written by us and sent with the provider's OTLP exporters
SPANS_DROPPED = "otel_llm.spans.dropped_direct"  # direct export: buffer full, or every send failed
ENGINE_STEPS = "otel_llm.engine_steps"  # by otel_llm.state: recorded, emitted, settled_early
ERRORS = "otel_llm.errors"  # instrumentation errors caught, by otel_llm.site
STATE, SITE, ENGINE = "otel_llm.state", "otel_llm.site", sc.ENGINE


def register(meter: Meter, engine: str, stats: Callable[[], dict[str, Any]]) -> None:
    """Observable counters over ``stats()`` (Telemetry.stats)."""

    def by_state(prefix: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for key, value in stats().items():
                if key.startswith(prefix):
                    yield Observation(value, {ENGINE: engine, STATE: key[len(prefix):]})
        return observe

    def one(key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            value = stats().get(key)
            if value is not None:
                yield Observation(value, {ENGINE: engine})
        return observe

    def errors(options: CallbackOptions) -> Iterable[Observation]:
        for site, n in list(GUARD.errors.items()):
            yield Observation(n, {SITE: site})

    meter.create_observable_counter(REQUESTS, [by_state("requests_")], unit="{request}",
                                    description="Requests seen by otel-llm, by what happened to their telemetry")
    meter.create_observable_counter(ENGINE_STEPS, [by_state("steps_")], unit="{step}",
                                    description="Engine steps recorded, emitted as spans, or settled early")
    meter.create_observable_counter(SPANS_SENT, [one("direct_spans_sent")], unit="{span}",
                                    description="Spans otel-llm wrote as OTLP and sent with the provider's exporters")
    meter.create_observable_counter(SPANS_DROPPED, [one("direct_spans_dropped")], unit="{span}",
                                    description="Directly exported spans dropped (buffer full or export failed)")
    meter.create_observable_counter(ERRORS, [errors], unit="{error}",
                                    description="Instrumentation errors caught (the host's work went on)")
