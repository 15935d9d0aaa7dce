"""Sends spans we encoded ourselves (otlp_wire, wire_tracer) to the OTLP endpoints the tracer provider exports to.

Full detail is one span per generated token, and an engine step links every request it served.
Through the SDK each span pays for a ReadableSpan, the batch queue and the SDK's Python protobuf
encoder, all on the serving process's CPU; written as wire bytes it pays for little more than
the bytes (benchmarks/decode_detail.py compares the two paths). Spans built here are retroactive
and complete when written, so nothing is lost by skipping the SDK's live-span machinery.

It is used only when what the provider would do with those spans is known exactly (sdk_bridge): every
span processor is the SDK's ``BatchSpanProcessor`` or ``SimpleSpanProcessor`` around the
SDK's OTLP exporter (HTTP/protobuf or gRPC), as ``OTEL_*`` configuration and
``opentelemetry-instrument`` set up. Each exporter's own client sends our bytes, so
endpoint, headers, TLS, compression, timeout and retries are the user's. Any other
processor (one that filters, redacts or enriches spans, or a non-OTLP exporter) would be
bypassed, so then nothing is sent directly and every span takes the SDK path.
The option ``direct_export`` (``OTEL_LLM_DIRECT_EXPORT=false``) turns this off.

Like the SDK's batch processor: a bounded buffer (full: spans dropped, counted), one
background sender, a schedule delay, flush on ``flush()`` and at exit.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

from opentelemetry.instrumentation.utils import suppress_instrumentation

from ..guard import Guard
from . import sdk_bridge
from .encode import RequestFrame

_log = logging.getLogger(__name__)

Send = Callable[[bytes], bool]


@dataclass
class DirectCounts:
    spans_sent: int = 0
    spans_dropped: int = 0  # buffer full, or every attempt to send failed
    requests_failed: int = 0  # export requests that failed to at least one destination


class DirectExport:
    def __init__(self, senders: list[Send], frame: RequestFrame, *, max_batch_bytes: int = 1 << 20,
                 max_buffer_bytes: int = 16 << 20, schedule_delay: float = 5.0, guard: Guard | None = None) -> None:
        self._senders = senders
        self._guard = guard if guard is not None else Guard()  # the owner's: a send that raises is counted there
        self._frame = frame
        self._max_batch = max_batch_bytes
        self._max_buffer = max_buffer_bytes
        self._delay = schedule_delay
        self._chunks: list[bytes] = []  # each: encoded spans of one request, concatenated
        self._counts_pending: list[int] = []
        self._frames: list[RequestFrame | None] = []  # the resource each chunk goes under (None: the default)
        self._bytes = 0
        self._cv = threading.Condition()
        self._sending = False
        self._closed = False
        self._wake = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        self.counts = DirectCounts()  # flushed at exit by its owner (Pipeline), after the spans are built

    @classmethod
    def for_tracer(cls, tracer: Any, guard: Guard) -> "DirectExport | None":
        """One for an SDK tracer whose provider only batches to OTLP exporters; else None."""
        senders = sdk_bridge.senders_of(tracer, guard)  # a moved SDK internal: None, with one warning
        if senders is None:
            return None
        try:
            frame = RequestFrame.for_tracer(tracer.resource, sdk_bridge.instrumentation_scope(tracer))
        except Exception as exc:  # the SDK's encoder or scope not as tested: the SDK path still works
            _log.warning("otel-llm direct export unavailable: %s", exc)
            return None
        return cls(list(senders.sends), frame, schedule_delay=senders.schedule_delay, guard=guard)

    def add(self, spans: bytes, count: int, frame: RequestFrame | None = None) -> bool:
        """Buffer ``count`` encoded spans (as otlp_wire.SiblingSpans wrote them), to be sent under
        ``frame``'s resource and scope (default: the tracer's); False if dropped."""
        with self._cv:
            if self._closed or self._bytes + len(spans) > self._max_buffer:
                self.counts.spans_dropped += count
                return False
            self._chunks.append(spans)
            self._counts_pending.append(count)
            self._frames.append(frame)
            self._bytes += len(spans)
            if self._thread is None or self._pid != os.getpid():  # first use, or after a fork
                self._start()
            if self._bytes >= self._max_batch:
                self._wake = True
                self._cv.notify_all()
        return True

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Send everything buffered; False if that took longer than ``timeout``."""
        with self._cv:
            if self._thread is None:
                return True
            self._wake = True
            self._cv.notify_all()
            return self._cv.wait_for(lambda: not self._chunks and not self._sending, timeout)

    def close(self, timeout: float = 5.0) -> bool:
        done = self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        return done

    def _start(self) -> None:
        self._pid = os.getpid()
        self._sending = False
        self._thread = threading.Thread(target=self._run, name="otel-llm-direct-export", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._sending = False
                self._cv.notify_all()  # flush() waiters
                self._cv.wait_for(lambda: self._wake or self._closed, self._delay)
                self._wake = False
                if not self._chunks:
                    if self._closed:
                        return
                    continue
                chunks, counts, frames = self._take()
                self._sending = True
            try:
                # as the SDK's processors do around their exporters: an HTTP-client instrumentation
                # (requests, urllib3, grpc) must not trace our own exports, or report them back to us
                with suppress_instrumentation():
                    self._send(chunks, counts, frames)
            except Exception as exc:
                self._guard.failed("direct span export", exc)

    def _take(self) -> tuple[list[bytes], list[int], list[RequestFrame | None]]:
        """Up to one batch's worth of the buffer, oldest first (caller holds the lock)."""
        size, n = 0, 0
        while n < len(self._chunks) and (n == 0 or size + len(self._chunks[n]) <= self._max_batch):
            size += len(self._chunks[n])
            n += 1
        chunks, counts, frames = self._chunks[:n], self._counts_pending[:n], self._frames[:n]
        del self._chunks[:n], self._counts_pending[:n], self._frames[:n]
        self._bytes -= size
        if self._chunks:
            self._wake = True  # more than one batch was waiting: go again at once
        return chunks, counts, frames

    def _send(self, chunks: list[bytes], counts: list[int], frames: list[RequestFrame | None]) -> None:
        groups: dict[int, tuple[RequestFrame, list[bytes]]] = {}
        for chunk, frame in zip(chunks, frames):
            f = frame or self._frame
            groups.setdefault(id(f), (f, []))[1].append(chunk)
        # one ResourceSpans per resource; repeated fields concatenate, so the requests do too
        payload = b"".join(f.request(group) for f, group in groups.values())
        spans = sum(counts)
        ok = [send(payload) for send in self._senders]
        with self._cv:
            if all(ok):
                self.counts.spans_sent += spans
            else:
                self.counts.requests_failed += 1
                if not any(ok):
                    self.counts.spans_dropped += spans
