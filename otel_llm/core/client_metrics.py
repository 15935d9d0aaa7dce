"""Client-side metrics (the caller's view of a generation call), declared as a table like the server's.

Recorded once per finished call from a ``RequestSummary`` whose ``ttft`` is the time to the
first chunk (the conventions' chunk: an update of the generated output), ``tpot`` the mean time
per output token after the first and ``e2e`` the call's duration, all measured on the client's
monotonic clock. Goodput uses the same ``SLOTable`` as the server side: a call is good when it met
every SLO of its model at once, and a streamed call needs a first chunk to be good at all.

The conventions' ``time_per_output_chunk`` is one value per chunk after the first, as they define it.
The hot path only stamps each chunk's arrival; when the stream ends its gaps become bucket counts
(``core/inter_token.py``) added to the histogram in one call (``core/sdk_metrics.bind_counts``), as the
server's inter-token latency is: one SDK ``record`` per chunk would cost several times the 2 µs
per-chunk budget (benchmarks/core_costs.py, section ``metrics``, measures the public call). The per-stream mean stays on the span (``llm.client.time_per_output_chunk``).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Callable

from opentelemetry.context import Context
from opentelemetry.metrics import Meter

from .. import semconv as sc
from .buckets import TOKEN_BUCKETS
from .metrics import (CHARACTER_UNIT, DURATION_BUCKETS, RATE_BUCKETS, TOKEN_UNIT, HistogramSpec, InstrumentSpec,
                      MetricSet, RequestMetrics, UsageSpec, _if_succeeded)
from .semconv_mode import genai_latest
from .slo import SLOTable
from .summary import RequestSummary


@dataclass(slots=True)
class ClientSummary(RequestSummary):
    """A call as the client saw it: ``tpot`` is per token when the server reported usage (vLLM's
    benchmark definition, comparable with the server's SLO), else per chunk."""

    time_per_output_chunk: float | None = None
    ttft_required: bool = False  # a streamed call: it cannot be good without a measured first chunk
    reasoning_tokens: int | None = None  # output tokens spent reasoning, where the server reported them
    # (input tokens read from the server's cache, where it reported them: ``prefix_cache_hit_tokens``)

    @property
    def failed(self) -> bool:
        """Goodput's test reads this: a stream that never delivered a chunk did not serve its caller."""
        return self.error_type is not None or (self.ttft_required and self.ttft is None)


CLIENT_HISTOGRAMS: tuple[HistogramSpec, ...] = (
    HistogramSpec(sc.METRIC_CLIENT_DURATION, "s", DURATION_BUCKETS,
                  "Duration of the client's generation call, to the last chunk for streams", lambda s: s.e2e),
    HistogramSpec(sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK, "s", DURATION_BUCKETS,
                  "Time from issuing the request to the first chunk of the response (successful streaming calls)",
                  _if_succeeded("ttft")),
    HistogramSpec(sc.CLIENT_CHARS_PER_SECOND, f"{CHARACTER_UNIT}/s", RATE_BUCKETS,
                  "Output characters over the call's duration (tokenizer-independent)",
                  lambda s: s.output_characters_per_second),
)
# One value per chunk after the first, for every successful streamed call: recorded as the stream's bucket
# counts (``ClientSummary.gaps``), not through ``HistogramSpec.value``.
TIME_PER_OUTPUT_CHUNK = HistogramSpec(
    sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK, "s", DURATION_BUCKETS,
    "Time between consecutive chunks after the first, every chunk of every successful streamed call",
    attrgetter("gaps"))
CLIENT_METRICS = MetricSet(CLIENT_HISTOGRAMS, sc.METRIC_CLIENT_TOKEN_USAGE, sc.CLIENT_REQUESTS, sc.CLIENT_GOOD_REQUESTS,
                           noun="call", inter_token=TIME_PER_OUTPUT_CHUNK)


# -- the latest experimental conventions (OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental) -----------
# Inference operations (chat, text_completion) on gen_ai.client.inference.*; embeddings, not an inference, keep
# gen_ai.client.operation.duration and record no inference metric. Token usage: a counter per kind of token,
# labelled gen_ai.token.modality (``unknown``: OpenAI-compatible servers report no modality breakdown for
# text), and the per-operation histograms.
def _inference(get: Callable[[RequestSummary], float | None]) -> Callable[[RequestSummary], float | None]:
    return lambda s: None if s.operation == sc.OPERATION_EMBEDDINGS else get(s)


def _embeddings(get: Callable[[RequestSummary], float | None]) -> Callable[[RequestSummary], float | None]:
    return lambda s: get(s) if s.operation == sc.OPERATION_EMBEDDINGS else None


LATEST_HISTOGRAMS: tuple[HistogramSpec, ...] = (
    HistogramSpec(sc.METRIC_INFERENCE_DURATION, "s", DURATION_BUCKETS,
                  "Duration of the client's inference call (chat, text_completion), to the last chunk for streams",
                  _inference(attrgetter("e2e"))),
    HistogramSpec(sc.METRIC_CLIENT_DURATION, "s", DURATION_BUCKETS,
                  "Duration of the client's embeddings call", _embeddings(attrgetter("e2e"))),
    HistogramSpec(sc.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK, "s", DURATION_BUCKETS,
                  "Time from issuing the request to the first chunk of the response (successful streaming calls)",
                  _inference(_if_succeeded("ttft"))),
    HistogramSpec(sc.METRIC_OPERATION_INPUT_TOKENS, TOKEN_UNIT, TOKEN_BUCKETS,
                  "Input tokens per inference call, where the server reported usage",
                  _inference(attrgetter("input_tokens"))),
    HistogramSpec(sc.METRIC_OPERATION_OUTPUT_TOKENS, TOKEN_UNIT, TOKEN_BUCKETS,
                  "Output tokens per inference call, where the server reported usage",
                  _inference(attrgetter("output_tokens"))),
    CLIENT_HISTOGRAMS[-1],  # ours: characters per second
)
INFERENCE_TIME_PER_OUTPUT_CHUNK = HistogramSpec(
    sc.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK, "s", DURATION_BUCKETS, TIME_PER_OUTPUT_CHUNK.description,
    attrgetter("gaps"))
_UNKNOWN_MODALITY = ((sc.TOKEN_MODALITY, sc.TOKEN_MODALITY_UNKNOWN),)


def _usage(name: str, description: str, get: Callable[[RequestSummary], int | None]) -> UsageSpec:
    return UsageSpec(InstrumentSpec(name, TOKEN_UNIT, description, kind="counter", attributes=(sc.TOKEN_MODALITY,)),
                     _inference(get), _UNKNOWN_MODALITY)  # type: ignore[arg-type]


LATEST_USAGE: tuple[UsageSpec, ...] = (
    _usage(sc.METRIC_USAGE_INPUT_TOKENS, "Input tokens of inference calls, cached ones included",
           attrgetter("input_tokens")),
    _usage(sc.METRIC_USAGE_OUTPUT_TOKENS, "Output tokens of inference calls, reasoning ones included",
           attrgetter("output_tokens")),
    _usage(sc.METRIC_USAGE_CACHE_READ_INPUT_TOKENS, "Input tokens the server read from its cache "
           "(prompt_tokens_details.cached_tokens)", attrgetter("prefix_cache_hit_tokens")),
    _usage(sc.METRIC_USAGE_REASONING_OUTPUT_TOKENS, "Output tokens spent reasoning "
           "(completion_tokens_details.reasoning_tokens)", lambda s: getattr(s, "reasoning_tokens", None)),
)
CLIENT_METRICS_LATEST = MetricSet(LATEST_HISTOGRAMS, None, sc.CLIENT_REQUESTS, sc.CLIENT_GOOD_REQUESTS, noun="call",
                                  inter_token=INFERENCE_TIME_PER_OUTPUT_CHUNK, usage=LATEST_USAGE)


def client_metric_set(latest: bool) -> MetricSet:
    """The client's metric set in the conventions' default or latest experimental version."""
    return CLIENT_METRICS_LATEST if latest else CLIENT_METRICS


class ClientMetrics(RequestMetrics):
    """The client's metric set; calls are labelled with the server they went to. Which version of the
    conventions it records is chosen once, here (``latest``; by default ``OTEL_SEMCONV_STABILITY_OPT_IN``'s)."""

    def __init__(self, meter: Meter, slos: SLOTable, latest: bool | None = None) -> None:
        self.latest = genai_latest() if latest is None else latest
        self.metric_set = client_metric_set(self.latest)
        super().__init__(meter, slos, self.metric_set)

    def tpot_limit(self, model: str | None) -> float | None:
        return self._slos.for_model(model).tpot

    def record(self, s: RequestSummary, server: tuple[str | None, int | None] = (None, None),  # type: ignore[override]
               context: Context | None = None) -> bool:
        host, port = server
        extra = ((sc.SERVER_ADDRESS, host),) if host else ()
        if port is not None:
            extra += ((sc.SERVER_PORT, port),)
        return super().record(s, context, extra)
