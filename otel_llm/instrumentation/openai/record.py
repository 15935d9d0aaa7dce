"""One client call's record: the hot path appends O(1) state per chunk; ``finish`` explains, once.

Timing is on the client's monotonic clock (``time.perf_counter``), stamped right after each
chunk is read. The span's start is stamped on the wall clock at the same moment as the
monotonic start; every later time is converted with that one offset (``wall_ns``), so span
times and the latency attributes never disagree.
"""

from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_right
from operator import sub
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from ... import semconv as sc
from ...core.client_metrics import TIME_PER_OUTPUT_CHUNK, ClientSummary
from ...core.inter_token import sorted_gap_summary
from .messages import Output, dumps

if TYPE_CHECKING:
    from .telemetry import ClientState

# Output kinds, as bits on the hot path and names on the span (``llm.client.output.kinds``).
TEXT, TOOL_CALL, REFUSAL, REASONING, OTHER = 1, 2, 4, 8, 16
KIND_NAMES = ((TEXT, "text"), (TOOL_CALL, "tool_call"), (REFUSAL, "refusal"), (REASONING, "reasoning"),
              (OTHER, "other"))
NOT_A_CHUNK = -1  # what a chunk reader returns for a lifecycle event or the usage-only chunk

COMPLETE, CLOSED, ABANDONED, ERROR = "complete", "closed", "abandoned", "error"


class CallRecord:
    """State of one call. Per chunk only ``chunk`` runs; everything else runs once."""

    __slots__ = ("owner", "span", "operation", "model", "stream", "server", "start", "start_wall_ns",
                 "stamps", "_sorted_gaps", "first_content", "chars", "kinds", "tpot_limit",
                 "response_id", "response_model", "finish_reasons", "input_tokens", "output_tokens", "usage",
                 "output", "read_output", "failure", "dimensions", "input_messages", "system_instructions",
                 "done", "borrowed", "__weakref__")

    def __init__(self, owner: "ClientState", span: Span, operation: str, model: str | None, stream: bool,
                 server: tuple[str | None, int | None], start_wall_ns: int, capture: bool) -> None:
        self.owner = owner
        self.span = span
        self.operation = operation
        self.model = model
        self.stream = stream
        self.server = server
        self.start_wall_ns = start_wall_ns
        self.start = time.perf_counter()
        # arrival time of every output chunk (8 bytes each): the hot path appends, ``finish`` explains
        self.stamps = array("d")
        self._sorted_gaps: list[float] = []  # the gaps between stamps, sorted: computed once they are read
        self.first_content: float | None = None  # the first chunk with generated content
        self.chars = 0
        self.kinds = 0
        limit = owner.metrics.tpot_limit(model)
        self.tpot_limit = limit if limit is not None else math.inf
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.usage: Any = None  # the response's usage object, for its token details
        self.output: Output | None = Output() if capture else None
        self.read_output = False  # a response body or stream was read (output facts are known)
        self.failure: str | None = None  # an in-band failure the client did not raise (Responses ``error``)
        self.dimensions: int | None = None
        self.input_messages: str | None = None
        self.system_instructions: str | None = None
        self.done = False
        self.borrowed = False  # the span is an upstream instrumentation's (coexist.py): add to it, never end it

    # -- hot path ------------------------------------------------------------------------------

    def chunk(self, now: float, chars: int) -> None:
        """A chunk arrived at ``now`` carrying ``chars`` characters of generated content
        (``NOT_A_CHUNK`` for lifecycle events and the usage-only chunk, which are not timed).
        The chunk readers inline this for their common case (ops.py: ``Chat.chunk``'s fast path)."""
        if chars < 0:
            return
        self.stamps.append(now)
        if chars:
            if not self.chars:
                self.first_content = now
            self.chars += chars

    # -- cold path: the gap profile, read from the stamps ---------------------------------------

    @property
    def n(self) -> int:
        return len(self.stamps)

    @property
    def first(self) -> float | None:
        """The first output chunk (the conventions' time to first chunk)."""
        return self.stamps[0] if self.stamps else None

    @property
    def last(self) -> float | None:
        return self.stamps[-1] if self.stamps else None

    def sorted_gaps(self) -> list[float]:
        """The gaps between consecutive chunks, sorted (a C-level sort, not a Python loop per chunk);
        sorted again only when chunks arrived since the last call."""
        s = self.stamps
        if len(self._sorted_gaps) != max(len(s) - 1, 0):
            self._sorted_gaps = sorted(map(sub, s[1:], s[:-1]))
        return self._sorted_gaps

    def gaps(self) -> tuple[float, int]:
        """The largest gap between consecutive chunks and how many gaps exceed the TPOT SLO."""
        gaps = self.sorted_gaps()
        if not gaps:
            return 0.0, 0
        limit = self.tpot_limit
        return gaps[-1], (len(gaps) - bisect_right(gaps, limit)) if limit != math.inf else 0

    @property
    def max_gap(self) -> float:
        return self.gaps()[0]

    @property
    def over(self) -> int:
        return self.gaps()[1]

    def wall_ns(self, t: float) -> int:
        return self.start_wall_ns + int((t - self.start) * 1e9)

    def abandon(self) -> None:
        """The caller dropped a stream it never finished or closed: end at the last thing we saw."""
        self.finish(ABANDONED, at=self.stamps[-1] if self.stamps else self.start)

    def finish(self, how: str, exc: BaseException | None = None, at: float | None = None) -> None:
        """End the span and record the metrics; runs once, whatever calls it (and never raises)."""
        if self.done:
            return
        self.done = True
        end = time.perf_counter() if at is None else at
        try:
            self._finish(how, exc, end)
        except Exception as err:
            self.owner.guard.failed("openai finish", err)
            if not self.borrowed:
                try:
                    self.span.end(end_time=self.wall_ns(end))
                except Exception:
                    pass
        finally:
            self.owner = None  # type: ignore[assignment]  # drop the back-reference early

    def _finish(self, how: str, exc: BaseException | None, end: float) -> None:
        # characters only when there were some: a call without text records no rate (not a rate of 0)
        s = ClientSummary(model=self.model, operation=self.operation, provider=self.owner.provider,
                          input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                          output_characters=self.chars or None, e2e=end - self.start,
                          ttft_required=self.stream)
        if self.usage is not None:
            s.prefix_cache_hit_tokens, s.reasoning_tokens = token_details(self.usage)
        if self.finish_reasons:
            s.finish_reason = self.finish_reasons[0]
        if exc is not None:
            s.error_type = error_type(exc)
        elif self.failure is not None:
            s.error_type = self.failure
        stamps = self.stamps
        if self.stream and stamps:
            s.ttft = stamps[0] - self.start
            if len(stamps) > 1:
                s.time_per_output_chunk = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
                if s.error_type is None:  # the conventions' per-chunk histogram: successful streams only
                    s.gaps = sorted_gap_summary(self.sorted_gaps(), stamps[-1] - stamps[0],
                                                TIME_PER_OUTPUT_CHUNK.buckets)
            tokens = self.output_tokens
            # vLLM's benchmark definition: (e2e - ttft) / (output tokens - 1); else per chunk.
            s.tpot = (s.e2e - s.ttft) / (tokens - 1) if tokens and tokens > 1 else s.time_per_output_chunk
        span = self.span
        context = trace.set_span_in_context(span)
        breached = self.owner.metrics.breaches(s)
        if self.borrowed:
            self._add_extras(s, how, breached)
            return
        good = self.owner.metrics.record(s, self.server, context=context)
        if span.is_recording():
            span.set_attributes(self._attributes(s, how, good, breached))
            if exc is not None:
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:512]))
            elif self.failure is not None:
                span.set_status(Status(StatusCode.ERROR, f"in-band error: {self.failure}"[:512]))
        span.end(end_time=self.wall_ns(end))

    def _add_extras(self, s: ClientSummary, how: str, breached: tuple[str, ...]) -> None:
        """Onto an upstream instrumentation's span: only what it lacks (its span, status and metrics are its own)."""
        if self.span.is_recording():
            good = not s.failed and not breached
            self.span.set_attributes({k: v for k, v in self._attributes(s, how, good, breached).items()
                                      if k.startswith("llm.") or k == sc.RESPONSE_TIME_TO_FIRST_CHUNK})

    def _attributes(self, s: ClientSummary, how: str, good: bool, breached: tuple[str, ...]) -> dict[str, Any]:
        a: dict[str, Any] = {sc.CLIENT_DURATION: s.e2e, sc.CLIENT_SLO_MET: good}
        if self.read_output:
            a[sc.CLIENT_OUTPUT_CHARACTERS] = self.chars
        if breached:
            a[sc.CLIENT_SLO_BREACHED] = breached
        for key, value in ((sc.RESPONSE_ID, self.response_id), (sc.RESPONSE_MODEL, self.response_model),
                           (sc.USAGE_INPUT_TOKENS, self.input_tokens), (sc.USAGE_OUTPUT_TOKENS, self.output_tokens),
                           (sc.USAGE_CACHE_READ_INPUT_TOKENS, s.prefix_cache_hit_tokens),
                           (sc.USAGE_REASONING_OUTPUT_TOKENS, s.reasoning_tokens),
                           (sc.ERROR_TYPE, s.error_type), (sc.CLIENT_CHARS_PER_SECOND, s.output_characters_per_second),
                           (sc.EMBEDDINGS_DIMENSION_COUNT, self.dimensions)):
            if value is not None:
                a[key] = value
        if self.finish_reasons:
            a[sc.RESPONSE_FINISH_REASONS] = tuple(self.finish_reasons)
        if self.kinds:
            a[sc.CLIENT_OUTPUT_KINDS] = tuple(name for bit, name in KIND_NAMES if self.kinds & bit)
        if self.stream:
            a[sc.CLIENT_STREAM_END] = how
            a[sc.CLIENT_CHUNKS] = len(self.stamps)
            if s.ttft is not None:
                a[sc.RESPONSE_TIME_TO_FIRST_CHUNK] = s.ttft
            if self.first_content is not None:
                a[sc.CLIENT_TIME_TO_FIRST_CONTENT] = self.first_content - self.start
            if s.time_per_output_chunk is not None:
                a[sc.CLIENT_TIME_PER_OUTPUT_CHUNK] = s.time_per_output_chunk
                max_gap, over = self.gaps()
                a[sc.CLIENT_CHUNK_GAP_MAX] = max_gap
                if self.tpot_limit != math.inf:
                    a[sc.CLIENT_CHUNK_GAPS_OVER_SLO] = over
            if s.tpot is not None:
                a[sc.CLIENT_TIME_PER_OUTPUT_TOKEN] = s.tpot
        if self.output is not None:  # content capture is on
            if self.input_messages is not None:
                a[sc.INPUT_MESSAGES] = self.input_messages
            if self.system_instructions is not None:
                a[sc.SYSTEM_INSTRUCTIONS] = self.system_instructions
            if self.read_output and self.operation != sc.OPERATION_EMBEDDINGS:
                a[sc.OUTPUT_MESSAGES] = dumps(self.output.render(self.finish_reasons))
        return a


# where a usage object carries its token details: chat/completions (prompt_tokens_details.cached_tokens,
# completion_tokens_details.reasoning_tokens) and Responses (input_tokens_details, output_tokens_details)
_CACHED = (("prompt_tokens_details", "cached_tokens"), ("input_tokens_details", "cached_tokens"))
_REASONING = (("completion_tokens_details", "reasoning_tokens"), ("output_tokens_details", "reasoning_tokens"))


def _detail(usage: Any, paths: tuple[tuple[str, str], ...]) -> int | None:
    for outer, inner in paths:
        value = getattr(getattr(usage, outer, None), inner, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def token_details(usage: Any) -> tuple[int | None, int | None]:
    """(cache-read input tokens, reasoning output tokens) of a response's usage, each ``None`` where the
    server did not report it (vLLM reports cached tokens only with ``--enable-prompt-tokens-details``)."""
    return _detail(usage, _CACHED), _detail(usage, _REASONING)


def error_type(exc: BaseException) -> str:
    """The exception's class name (``APIConnectionError``, ``NotFoundError``, ``APITimeoutError``...)."""
    return type(exc).__name__
