"""Client-side metrics (the caller's view of a generation call), declared as a table like the server's.

Recorded once per finished call from a ``RequestSummary`` whose ``ttft`` is the time to the
first content chunk, ``tpot`` the mean time per output chunk after the first and ``e2e``
the call's duration, all measured on the client's monotonic clock. Goodput uses the same
``SLOTable`` as the server side: a call is good when it met every SLO of its model at once.

``gen_ai.client.operation.time_per_output_chunk`` is recorded once per streamed call, as the
mean gap between content chunks (what the server's ``time_per_output_token`` is per request),
not once per chunk: a histogram ``record`` costs more than the whole per-chunk budget, and the
per-chunk profile (max gap, gaps over the TPOT SLO) is on the span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import Meter

from . import semconv as sc
from .metrics import DURATION_BUCKETS, RATE_BUCKETS, TOKEN_BUCKETS, HistogramSpec
from .slo import SLOTable
from .summary import RequestSummary

@dataclass(slots=True)
class ClientSummary(RequestSummary):
    """A call as the client saw it: ``tpot`` is per token when the server reported usage (vLLM's
    benchmark definition, comparable with the server's SLO), else per chunk."""

    time_per_output_chunk: float | None = None


CLIENT_HISTOGRAMS: tuple[HistogramSpec, ...] = (
    HistogramSpec("gen_ai.client.operation.duration", "s", DURATION_BUCKETS,
                  "Duration of the client's generation call, to the last chunk for streams", lambda s: s.e2e),
    HistogramSpec("gen_ai.client.operation.time_to_first_chunk", "s", DURATION_BUCKETS,
                  "Time from issuing the request to the first content chunk (streaming calls only)",
                  lambda s: s.ttft),
    HistogramSpec("gen_ai.client.operation.time_per_output_chunk", "s", DURATION_BUCKETS,
                  "Mean time between content chunks after the first, per streamed call",
                  lambda s: s.time_per_output_chunk),
    HistogramSpec("llm.client.output.characters_per_second", "{character}/s", RATE_BUCKETS,
                  "Output characters over the call's duration (tokenizer-independent)",
                  lambda s: s.output_characters_per_second),
)
CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
CLIENT_REQUESTS = "llm.client.requests"
CLIENT_GOOD_REQUESTS = "llm.client.requests.good"


class ClientMetrics:
    """The client instruments, built once per meter; ``record`` is called once per finished call."""

    def __init__(self, meter: Meter, slos: SLOTable) -> None:
        self._slos = slos
        self._histograms = [
            (spec, meter.create_histogram(spec.name, unit=spec.unit, description=spec.description,
                                          explicit_bucket_boundaries_advisory=list(spec.buckets)))
            for spec in CLIENT_HISTOGRAMS
        ]
        self._tokens = meter.create_histogram(
            CLIENT_TOKEN_USAGE, unit="{token}", description="Input and output tokens per call",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS))
        self._requests = meter.create_counter(CLIENT_REQUESTS, unit="{request}", description="Finished calls")
        self._good = meter.create_counter(
            CLIENT_GOOD_REQUESTS, unit="{request}",
            description="Finished calls that met every SLO at once, as the client saw them (goodput = good / all)")
        self._attr_cache: dict[tuple, tuple[dict, dict, dict]] = {}

    def breaches(self, s: RequestSummary) -> tuple[str, ...]:
        return self._slos.for_model(s.model).breaches(s)

    def tpot_limit(self, model: str | None) -> float | None:
        return self._slos.for_model(model).tpot

    def record(self, s: RequestSummary, server: tuple[str | None, int | None] = (None, None),
               context: Context | None = None) -> bool:
        """Record one call; returns whether it met every SLO (and did not fail)."""
        attrs, input_attrs, output_attrs = self._attributes(s, server)
        for spec, hist in self._histograms:
            value = spec.value(s)
            if value is not None:
                hist.record(value, attrs, context=context)
        if s.input_tokens is not None:
            self._tokens.record(s.input_tokens, input_attrs, context=context)
        if s.output_tokens is not None:
            self._tokens.record(s.output_tokens, output_attrs, context=context)
        good = not s.failed and not self.breaches(s)
        self._requests.add(1, attrs, context=context)
        if good:
            self._good.add(1, attrs, context=context)
        return good

    def _attributes(self, s: RequestSummary, server: tuple[str | None, int | None]) -> tuple[dict, dict, dict]:
        key = (s.model, s.operation, s.provider, s.error_type, server)
        found = self._attr_cache.get(key)
        if found is None:
            attrs: dict[str, Any] = {sc.OPERATION_NAME: s.operation}
            if s.provider:
                attrs[sc.PROVIDER_NAME] = s.provider
            if s.model:
                attrs[sc.REQUEST_MODEL] = s.model
            if s.error_type:
                attrs[sc.ERROR_TYPE] = s.error_type
            if server[0]:
                attrs[sc.SERVER_ADDRESS] = server[0]
            if server[1] is not None:
                attrs[sc.SERVER_PORT] = server[1]
            found = (attrs, {**attrs, sc.TOKEN_TYPE: "input"}, {**attrs, sc.TOKEN_TYPE: "output"})
            if len(self._attr_cache) < 4096:  # bounded: model names come from users
                self._attr_cache[key] = found
        return found
