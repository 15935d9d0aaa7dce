"""One client call's record: the hot path appends O(1) state per chunk; ``finish`` explains, once.

Timing is on the client's monotonic clock (``time.perf_counter``), stamped right after each
chunk is read. The span's start is stamped on the wall clock at the same moment as the
monotonic start; every later time is converted with that one offset (``wall_ns``), so span
times and the latency attributes never disagree.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from ...core import semconv as sc
from ...core.guard import GUARD
from ...core.client_metrics import ClientSummary
from ...core.content import output_messages

if TYPE_CHECKING:
    from .wrappers import ClientTelemetry

# Ours: client-side attributes (README trace contract, client span)
CHUNKS = "llm.client.chunks"
TIME_PER_OUTPUT_CHUNK = "llm.client.time_per_output_chunk"
TIME_PER_OUTPUT_TOKEN = "llm.client.time_per_output_token"
CHUNK_GAP_MAX = "llm.client.chunk_gap.max"
CHUNK_GAPS_OVER_SLO = "llm.client.chunk_gap.over_slo"
DURATION = "llm.client.duration"
OUTPUT_CHARACTERS = "llm.client.output_characters"
CHARS_PER_SECOND = "llm.client.output.characters_per_second"
STREAM_END = "llm.client.stream.end"  # complete | closed | abandoned | error
SLO_MET = "llm.client.slo.met"
SLO_BREACHED = "llm.client.slo.breached"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"

COMPLETE, CLOSED, ABANDONED, ERROR = "complete", "closed", "abandoned", "error"


class CallRecord:
    """State of one call. Per chunk only ``chunk`` runs; everything else runs once."""

    __slots__ = ("owner", "span", "operation", "model", "stream", "server", "start", "start_wall_ns",
                 "first", "last", "n", "max_gap", "over", "chars", "tpot_limit",
                 "response_id", "response_model", "finish_reasons", "input_tokens", "output_tokens",
                 "texts", "input_messages", "system_instructions", "done", "__weakref__")

    def __init__(self, owner: "ClientTelemetry", span: Span, operation: str, model: str | None, stream: bool,
                 server: tuple[str | None, int | None], start_wall_ns: int, capture: bool) -> None:
        self.owner = owner
        self.span = span
        self.operation = operation
        self.model = model
        self.stream = stream
        self.server = server
        self.start_wall_ns = start_wall_ns
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.n = 0
        self.max_gap = 0.0
        self.over = 0
        self.chars = 0
        limit = owner.metrics.tpot_limit(model)
        self.tpot_limit = limit if limit is not None else math.inf
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.texts: dict[int, list[str]] | None = {} if capture else None
        self.input_messages: str | None = None
        self.system_instructions: str | None = None
        self.done = False

    # -- hot path ------------------------------------------------------------------------------

    def chunk(self, now: float, text_len: int) -> None:
        """A chunk arrived at ``now``; only chunks that carry output text count for timing."""
        if not text_len:
            return
        last = self.last
        if last is None:
            self.first = now
        else:
            gap = now - last
            if gap > self.max_gap:
                self.max_gap = gap
            if gap > self.tpot_limit:
                self.over += 1
        self.last = now
        self.n += 1
        self.chars += text_len

    def add_text(self, index: int, text: str) -> None:
        """Content capture only (``texts`` is ``None`` otherwise)."""
        texts = self.texts
        if texts is not None:
            texts.setdefault(index, []).append(text)

    # -- cold path -----------------------------------------------------------------------------

    def wall_ns(self, t: float) -> int:
        return self.start_wall_ns + int((t - self.start) * 1e9)

    def abandon(self) -> None:
        """The caller dropped a stream it never finished or closed: end at the last thing we saw."""
        self.finish(ABANDONED, at=self.last if self.last is not None else self.start)

    def finish(self, how: str, exc: BaseException | None = None, at: float | None = None) -> None:
        """End the span and record the metrics; runs once, whatever calls it (and never raises)."""
        if self.done:
            return
        self.done = True
        end = time.perf_counter() if at is None else at
        try:
            self._finish(how, exc, end)
        except Exception as err:
            GUARD.failed("openai finish", err)
            try:
                self.span.end(end_time=self.wall_ns(end))
            except Exception:
                pass
        finally:
            self.owner = None  # type: ignore[assignment]  # drop the back-reference early

    def _finish(self, how: str, exc: BaseException | None, end: float) -> None:
        s = ClientSummary(model=self.model, operation=self.operation, provider=self.owner.provider,
                          input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                          output_characters=self.chars if self.chars or exc is None else None,
                          e2e=end - self.start)
        if self.finish_reasons:
            s.finish_reason = self.finish_reasons[0]
        if exc is not None:
            s.error_type = error_type(exc)
        if self.stream and self.first is not None:
            s.ttft = self.first - self.start
            if self.n > 1:
                s.time_per_output_chunk = (self.last - self.first) / (self.n - 1)  # type: ignore[operator]
            tokens = self.output_tokens
            # vLLM's benchmark definition: (e2e - ttft) / (output tokens - 1); else per chunk.
            s.tpot = (s.e2e - s.ttft) / (tokens - 1) if tokens and tokens > 1 else s.time_per_output_chunk
        span = self.span
        context = trace.set_span_in_context(span)
        breached = self.owner.metrics.breaches(s)
        good = self.owner.metrics.record(s, self.server, context=context)
        if span.is_recording():
            span.set_attributes(self._attributes(s, how, good, breached))
            if exc is not None:
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:512]))
        span.end(end_time=self.wall_ns(end))

    def _attributes(self, s: ClientSummary, how: str, good: bool, breached: tuple[str, ...]) -> dict[str, Any]:
        a: dict[str, Any] = {DURATION: s.e2e, SLO_MET: good}
        if s.output_characters is not None:
            a[OUTPUT_CHARACTERS] = s.output_characters
        if breached:
            a[SLO_BREACHED] = breached
        for key, value in ((sc.RESPONSE_ID, self.response_id), (sc.RESPONSE_MODEL, self.response_model),
                           (sc.USAGE_INPUT_TOKENS, self.input_tokens), (sc.USAGE_OUTPUT_TOKENS, self.output_tokens),
                           (sc.ERROR_TYPE, s.error_type), (CHARS_PER_SECOND, s.output_characters_per_second)):
            if value is not None:
                a[key] = value
        if self.finish_reasons:
            a[sc.RESPONSE_FINISH_REASONS] = tuple(self.finish_reasons)
        if self.stream:
            a[STREAM_END] = how
            a[CHUNKS] = self.n
            if s.ttft is not None:
                a[sc.RESPONSE_TIME_TO_FIRST_CHUNK] = s.ttft
            if s.time_per_output_chunk is not None:
                a[TIME_PER_OUTPUT_CHUNK] = s.time_per_output_chunk
                a[CHUNK_GAP_MAX] = self.max_gap
                if self.tpot_limit != math.inf:
                    a[CHUNK_GAPS_OVER_SLO] = self.over
            if s.tpot is not None:
                a[TIME_PER_OUTPUT_TOKEN] = s.tpot
        if self.texts is not None:  # content capture is on
            if self.input_messages is not None:
                a[sc.INPUT_MESSAGES] = self.input_messages
            if self.system_instructions is not None:
                a[SYSTEM_INSTRUCTIONS] = self.system_instructions
            a[sc.OUTPUT_MESSAGES] = output_messages(self.texts, self.finish_reasons)
        return a


def error_type(exc: BaseException) -> str:
    """The exception's class name (``APIConnectionError``, ``NotFoundError``, ``APITimeoutError``...)."""
    return type(exc).__name__
