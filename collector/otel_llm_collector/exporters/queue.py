"""A bounded send queue with retry and backoff, drained by one worker thread per exporter.

``submit`` never blocks: when the queue is full the batch is dropped and counted, so a slow
or dead backend sheds data instead of stalling the receivers. Failed sends are retried with
exponential backoff (retryable errors only) until ``max_elapsed_time``, then dropped and counted.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..config import ExporterConfig
from ..telemetry import SelfTelemetry
from .senders import PermanentError, Sender

Clock = Callable[[], float]
Sleep = Callable[[float], bool]  # waits; returns True if the exporter is stopping


@dataclass(frozen=True, slots=True)
class Batch:
    payload: bytes  # an encoded ExportTraceServiceRequest
    spans: int


class QueuedExporter:
    def __init__(self, cfg: ExporterConfig, sender: Sender, telemetry: SelfTelemetry,
                 clock: Clock = time.monotonic, sleep: Sleep | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._sender = sender
        self._t = telemetry
        self._clock = clock
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._q: queue.Queue[Batch | None] = queue.Queue(maxsize=cfg.queue_size)
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

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        self._stop.set()
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._worker.join(timeout)
        self._sender.close()

    def _run(self) -> None:
        while True:
            batch = self._q.get()
            try:
                if batch is None:
                    return
                self._send(batch)
            finally:
                self._q.task_done()
                self._t.set("exporter_queue_size", self._q.qsize(), exporter=self.name)

    def _send(self, batch: Batch) -> None:
        retry = self.cfg.retry
        started = self._clock()
        delay = retry.initial_interval
        while True:
            try:
                self._sender.send(batch.payload)
                self._t.inc("exporter_sent_spans", batch.spans, exporter=self.name)
                return
            except PermanentError:
                self._t.inc("exporter_send_failures", exporter=self.name)
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="permanent_error")
                return
            except Exception:  # noqa: BLE001 - any transport error is retryable here
                self._t.inc("exporter_send_failures", exporter=self.name)
            if (not retry.enabled or self._stop.is_set()
                    or self._clock() - started + delay > retry.max_elapsed_time):
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="retries_exhausted")
                return
            if self._sleep(delay):
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="retries_exhausted")
                return
            delay = min(delay * 2, retry.max_interval)
