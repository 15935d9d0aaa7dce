"""A bounded send queue with retry and backoff, drained by one worker thread per exporter.

``submit`` never blocks: when the queue is full the batch is dropped and counted, so a slow
or dead backend sheds data instead of stalling the receivers. Failed sends are retried with
exponential backoff (retryable errors only) until ``max_elapsed_time``, then dropped and counted.
Spans a backend refuses inside an accepted request (``partial_success``) are counted as dropped
(``reason="rejected"``), not as sent. ``close`` returns how many spans it could not deliver in time
(queued or being retried when the grace ran out), counted as ``reason="shutdown"``.

With ``sending_queue: {storage: <file_storage>}`` the queue is also a ``storage.DurableLog``: a batch is
written before it is queued (a batch the disk budget cannot take is dropped, ``reason="disk_full"``), and
acknowledged once sent or given up on (in order: one worker sends them FIFO). At start the batches not
acknowledged are queued again (a batch being sent at a crash is sent again: at least once). At shutdown
what was not delivered stays on disk for the next start instead of being dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import struct

from ..config import ExporterConfig
from ..storage import DurableLog, Position, StorageFull
from ..telemetry import TRACES, GatewayMetrics
from .senders import PermanentError, Sender

log = logging.getLogger("otel_llm_collector")

Clock = Callable[[], float]
Sleep = Callable[[float], bool]  # waits; returns True if the exporter is stopping


@dataclass(frozen=True, slots=True)
class Batch:
    payload: bytes  # an encoded ExportTraceServiceRequest
    spans: int
    position: Position | None = None  # where it is in the durable log, if any


_SPANS = struct.Struct("<I")  # a logged batch: its span count, then its payload


def wait_drained(q: queue.Queue, timeout: float) -> bool:
    """Wait until every item put on ``q`` was processed (``task_done``); False on timeout."""
    with q.all_tasks_done:
        return q.all_tasks_done.wait_for(lambda: q.unfinished_tasks == 0, timeout)


def stop_worker(q: queue.Queue, stop: threading.Event, worker: threading.Thread, timeout: float) -> None:
    """Stop a queue's worker thread: flag it, wake it with the ``None`` sentinel, and give a send in progress
    a moment (at most a second) to end."""
    stop.set()
    try:
        q.put_nowait(None)
    except queue.Full:
        pass
    worker.join(min(timeout, 1.0) if timeout > 0 else 0.1)


class QueuedExporter:
    def __init__(self, cfg: ExporterConfig, sender: Sender, telemetry: GatewayMetrics,
                 clock: Clock = time.monotonic, sleep: Sleep | None = None, log: DurableLog | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._sender = sender
        self._t = telemetry
        self._clock = clock
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        # unbounded as a structure: ``submit`` (one producer, under the pipeline lock) keeps it to queue_size,
        # and what a durable log replays at start is queued whatever its length
        self._q: queue.Queue[Batch | None] = queue.Queue()
        self._log = log
        if log is not None:
            for position, record in log.replay():
                spans = _SPANS.unpack_from(record)[0] if len(record) >= _SPANS.size else 0
                self._q.put_nowait(Batch(record[_SPANS.size:], spans, position))
            self._t.set("storage_bytes", log.size, storage=self.storage)
        # upstream's queue series, in memory or on disk alike (a durable queue starts with what it replays)
        self._t.set("otelcol_exporter_queue_capacity", cfg.queue_size, exporter=self.name, data_type=TRACES)
        self._t.set("exporter_queue_size", self._q.qsize(), exporter=self.name)
        self._current: Batch | None = None  # the batch being sent or retried
        self._lost = 0  # spans given up on at shutdown
        self._warned_rejected = False
        self._worker = threading.Thread(target=self._run, name=f"exporter-{cfg.name}", daemon=True)
        self._worker.start()

    @property
    def storage(self) -> str:
        return f"exporter/{self.name}"

    def submit(self, payload: bytes, spans: int) -> bool:
        if self._q.qsize() >= self.cfg.queue_size:
            self._t.inc("exporter_dropped_spans", spans, exporter=self.name, reason="queue_full")
            return False
        position = None
        if self._log is not None:
            try:
                position = self._log.append(_SPANS.pack(spans) + payload)
            except StorageFull:
                self._t.inc("exporter_dropped_spans", spans, exporter=self.name, reason="disk_full")
                return False
            self._t.set("storage_bytes", self._log.size, storage=self.storage)
        self._q.put_nowait(Batch(payload, spans, position))
        self._t.set("exporter_queue_size", self._q.qsize(), exporter=self.name)
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued batch was sent or dropped; False on timeout."""
        return wait_drained(self._q, timeout)

    def close(self, timeout: float = 5.0) -> int:
        """Deliver what is queued within ``timeout``, then stop; returns the spans not delivered."""
        self.flush(timeout)
        stop_worker(self._q, self._stop, self._worker, timeout)
        lost = self._lost
        current = self._current
        if self._worker.is_alive() and current is not None:  # stuck in a send: its spans are not delivered
            lost += self._undelivered(current)
        while True:  # batches the worker never reached
            try:
                batch = self._q.get_nowait()
            except queue.Empty:
                break
            if batch is not None:
                lost += self._undelivered(batch)
        self._sender.close()
        if self._log is not None:
            self._log.close()
        return lost

    def _undelivered(self, batch: Batch) -> int:
        """A batch not delivered at shutdown: kept on disk for the next start when the queue is durable
        (0 lost), else dropped and counted."""
        if batch.position is not None:
            return 0
        self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="shutdown")
        return batch.spans

    def _run(self) -> None:
        while True:
            batch = self._q.get()
            try:
                if batch is None or self._stop.is_set():
                    if batch is not None:  # stopping: what is left is counted by close()
                        self._lost += self._undelivered(batch)
                    if batch is None:
                        return
                    continue
                self._current = batch
                if self._send(batch) and batch.position is not None and self._log is not None:
                    self._log.ack(batch.position)  # sent or given up on: done (in order)
                    self._t.set("storage_bytes", self._log.size, storage=self.storage)
                self._current = None
            finally:
                self._q.task_done()
                self._t.set("exporter_queue_size", self._q.qsize(), exporter=self.name)

    def _send(self, batch: Batch) -> bool:
        """Send with retries; True when the batch is done (sent, or given up on and counted), False when
        shutdown came first (it is not delivered)."""
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
                return True
            except PermanentError:
                self._t.inc("exporter_send_failures", exporter=self.name)
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="permanent_error")
                return True
            except Exception:  # noqa: BLE001 - any transport error is retryable here
                self._t.inc("exporter_send_failures", exporter=self.name)
            if self._stop.is_set():
                return self._shutdown_loss(batch)
            if not retry.enabled or self._clock() - started + delay > retry.max_elapsed_time:
                self._t.inc("exporter_dropped_spans", batch.spans, exporter=self.name, reason="retries_exhausted")
                return True
            if self._sleep(delay):  # shutdown came while waiting to retry
                return self._shutdown_loss(batch)
            delay = min(delay * 2, retry.max_interval)

    def _shutdown_loss(self, batch: Batch) -> bool:
        self._lost += self._undelivered(batch)
        return False
