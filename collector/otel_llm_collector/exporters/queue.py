"""A bounded send queue with retry and backoff, drained by one worker thread per exporter.

``submit`` never blocks: when the queue is full the batch is dropped and counted, so a slow
or dead backend sheds data instead of stalling the receivers. Failed sends are retried with
exponential backoff (retryable errors only) until ``max_elapsed_time``, then dropped and counted.
Spans a backend refuses inside an accepted request (``partial_success``) are counted as dropped
(``reason="rejected"``), not as sent. ``close`` returns how many spans it could not deliver in time
(queued or being retried when the grace ran out), counted as ``reason="shutdown"``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..config import ExporterConfig
from ..telemetry import GatewayMetrics
from .senders import PermanentError, Sender

log = logging.getLogger("otel_llm_collector")

Clock = Callable[[], float]
Sleep = Callable[[float], bool]  # waits; returns True if the exporter is stopping


@dataclass(frozen=True, slots=True)
class Batch:
    payload: bytes  # an encoded ExportTraceServiceRequest
    spans: int


class QueuedExporter:
    def __init__(self, cfg: ExporterConfig, sender: Sender, telemetry: GatewayMetrics,
                 clock: Clock = time.monotonic, sleep: Sleep | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._sender = sender
        self._t = telemetry
        self._clock = clock
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._q: queue.Queue[Batch | None] = queue.Queue(maxsize=cfg.queue_size)
        self._current: Batch | None = None  # the batch being sent or retried
        self._lost = 0  # spans given up on at shutdown
        self._warned_rejected = False
        self._worker = threading.Thread(target=self._run, name=f"exporter-{cfg.name}", daemon=True)
        self._worker.start()

    def submit(self, payload: bytes, spans: int) -> bool:
        try:
            self._q.put_nowait(Batch(payload, spans))
        except queue.Full:
            self._t.inc("exporter_dropped_spans", spans, exporter=self.name, reason="queue_full")
            return False
        self._t.set("exporter_queue_size", self._q.qsize(), exporter=self.name)
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued batch was sent or dropped; False on timeout."""
        with self._q.all_tasks_done:
            return self._q.all_tasks_done.wait_for(lambda: self._q.unfinished_tasks == 0, timeout)

    def close(self, timeout: float = 5.0) -> int:
        """Deliver what is queued within ``timeout``, then stop; returns the spans not delivered."""
        self.flush(timeout)
        self._stop.set()
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._worker.join(min(timeout, 1.0) if timeout > 0 else 0.1)  # a send in progress gets a moment
        lost = self._lost
        current = self._current
        if self._worker.is_alive() and current is not None:  # stuck in a send: its spans are not delivered
            lost += current.spans
            self._t.inc("exporter_dropped_spans", current.spans, exporter=self.name, reason="shutdown")
        while True:  # batches the worker never reached
            try:
                batch = self._q.get_nowait()
            except queue.Empty:
                break
            if batch is not None:
                lost += batch.spans
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="shutdown")
        self._sender.close()
        return lost

    def _run(self) -> None:
        while True:
            batch = self._q.get()
            try:
                if batch is None or self._stop.is_set():
                    if batch is not None:  # stopping: what is left is counted by close()
                        self._lost += batch.spans
                        self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="shutdown")
                    if batch is None:
                        return
                    continue
                self._current = batch
                self._send(batch)
                self._current = None
            finally:
                self._q.task_done()
                self._t.set("exporter_queue_size", self._q.qsize(), exporter=self.name)

    def _send(self, batch: Batch) -> None:
        retry = self.cfg.retry
        started = self._clock()
        delay = retry.initial_interval
        while True:
            try:
                rejected = self._sender.send(batch.payload)
                refused = min(rejected[0], batch.spans) if rejected else 0
                if batch.spans - refused:
                    self._t.inc("exporter_sent_spans", batch.spans - refused, exporter=self.name)
                if refused:
                    self._t.inc("exporter_dropped_spans", refused, exporter=self.name, reason="rejected")
                    if not self._warned_rejected:  # once per exporter: the counter carries the rest
                        self._warned_rejected = True
                        log.warning("exporter %s: the backend refused %d of %d spans (partial_success): %s",
                                    self.name, refused, batch.spans, rejected[1][:200])
                return
            except PermanentError:
                self._t.inc("exporter_send_failures", exporter=self.name)
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="permanent_error")
                return
            except Exception:  # noqa: BLE001 - any transport error is retryable here
                self._t.inc("exporter_send_failures", exporter=self.name)
            if self._stop.is_set():
                return self._shutdown_loss(batch)
            if not retry.enabled or self._clock() - started + delay > retry.max_elapsed_time:
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="retries_exhausted")
                return
            if self._sleep(delay):  # shutdown came while waiting to retry
                return self._shutdown_loss(batch)
            delay = min(delay * 2, retry.max_interval)

    def _shutdown_loss(self, batch: Batch) -> None:
        self._lost += batch.spans
        self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="shutdown")
