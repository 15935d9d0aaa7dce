"""Our spans as Arize Phoenix reads them: OpenInference span kinds and the verdict where Phoenix shows it.

Phoenix files a trace under its resource's ``openinference.project.name`` ("default" without one) and
shows a span's kind from ``openinference.span.kind`` ("unknown" without one). ``OpenInferenceSpans`` is a
span processor that adds, as each of our spans starts:

* ``openinference.span.kind``: ``LLM`` on a request span (and an ``llm.choice``), ``CHAIN`` on its phase
  spans (queue, prefill, decode and what they hold) and on engine steps;
* on a request span, ``llm.model_name`` and ``llm.token_count.*`` (Phoenix's model and token columns),
  and ``metadata``: a small JSON object leading with ``llm.slow.cause``, the breached objectives and
  their SLOs, which Phoenix shows above the attribute list and can filter on (``metadata['slow_cause'] == ...``).

Add it to the tracer provider *before* the exporting processors (processors run in order). A processor
that is not the SDK's own exporting one means our spans take the SDK's path rather than direct export
(``otel_llm.otlp.direct_export``): the price of enriching them.

    provider = TracerProvider(resource=Resource.create({"service.name": "chat",
                                                        "openinference.project.name": "chat"}))
    provider.add_span_processor(OpenInferenceSpans())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter("http://phoenix:6006/v1/traces")))
"""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor

from .. import semconv as sc
from ..guard import Guard

SPAN_KIND = "openinference.span.kind"
PROJECT_NAME = sc.OPENINFERENCE_PROJECT_NAME
MODEL_NAME = "llm.model_name"
TOKEN_COUNTS = {"llm.token_count.prompt": sc.USAGE_INPUT_TOKENS, "llm.token_count.completion": sc.USAGE_OUTPUT_TOKENS}
METADATA = "metadata"
# our spans below a request, and the engine steps: steps of a chain in OpenInference's terms
CHAIN_SPANS = frozenset({sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE, sc.SPAN_PREFILL_CHUNK, sc.SPAN_REQUEUE,
                         sc.SPAN_REPREFILL, sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW, sc.SPAN_ENGINE_STEP})


def openinference_attributes(name: str, attributes: Any) -> dict[str, Any]:
    """What to add to one of our spans (``{}`` for a span that is not ours)."""
    a = attributes or {}
    if sc.LATENCY_E2E in a or name == sc.SPAN_CHOICE:
        out: dict[str, Any] = {SPAN_KIND: "LLM"}
        model = a.get(sc.RESPONSE_MODEL) or a.get(sc.REQUEST_MODEL)
        if model:
            out[MODEL_NAME] = model
        counts = {k: a[v] for k, v in TOKEN_COUNTS.items() if isinstance(a.get(v), int)}
        if len(counts) == 2:
            counts["llm.token_count.total"] = sum(counts.values())
        out.update(counts)
        meta: dict[str, Any] = {}
        if sc.SLOW_CAUSE in a:
            meta["slow_cause"] = a[sc.SLOW_CAUSE]
            cost = a.get(sc.SLOW_SECONDS.get(str(a[sc.SLOW_CAUSE]), ""))
            if isinstance(cost, (int, float)):
                meta["slow_seconds"] = round(float(cost), 4)
        if a.get(sc.SLO_BREACHED):
            meta["slo_breached"] = list(a[sc.SLO_BREACHED])
            slo = {str(o): a[sc.SLO_THRESHOLDS[str(o)]] for o in a[sc.SLO_BREACHED]
                   if isinstance(a.get(sc.SLO_THRESHOLDS.get(str(o), "")), (int, float))}
            if slo:
                meta["slo"] = slo  # the thresholds it breached, in seconds
        if sc.SAMPLING_REASON in a:
            meta["kept_for"] = a[sc.SAMPLING_REASON]
        if meta:
            out[METADATA] = json.dumps(meta, separators=(",", ":"))
        return out
    if name in CHAIN_SPANS:
        return {SPAN_KIND: "CHAIN"}
    return {}


class OpenInferenceSpans(SpanProcessor):
    """Adds OpenInference attributes to our spans as they start (see the module's docstring)."""

    def __init__(self) -> None:
        # its own: the user builds and owns this processor, no instrumentor does (its errors: ``guard.errors``)
        self.guard = Guard()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        try:
            extra = openinference_attributes(span.name, span.attributes)
            if extra:
                span.set_attributes(extra)
        except Exception as exc:  # a span we cannot read: left as it is, never an error for the host
            self.guard.failed("openinference attributes", exc)

    def on_end(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
