"""Metrics and logs the gateway receives, passed on unchanged to the OTLP exporters their pipeline names.

The request bytes as received (an ``ExportMetricsServiceRequest`` / ``ExportLogsServiceRequest``) go to
the exporter's endpoint for that signal: OTLP/gRPC ``MetricsService/Export`` / ``LogsService/Export``,
OTLP/HTTP ``/v1/metrics`` / ``/v1/logs`` beside the configured ``/v1/traces``. Like the span exporters
(``queue.py``): a bounded queue that never blocks a receiver (full: dropped, counted), one worker, retry
with exponential backoff for retryable failures until ``max_elapsed_time``; counted in upstream's
``otelcol_exporter_{sent,send_failed,enqueue_failed}_{metric_points,log_records}{exporter}``.
"""

from __future__ import annotations

import gzip
import logging
import queue
import threading
from dataclasses import dataclass

import grpc
from otel_llm.otlp.signals import LOGS_SERVICE, METRICS_SERVICE

from ..config import ExporterConfig
from ..telemetry import GatewayMetrics
from .queue import stop_worker, wait_drained
from .senders import _RETRYABLE_GRPC, _RETRYABLE_HTTP, HttpSender, PermanentError, _secure_channel

log = logging.getLogger("otel_llm_collector")

_METHODS = {"metrics": f"/{METRICS_SERVICE}/Export", "logs": f"/{LOGS_SERVICE}/Export"}
_UNIT = {"metrics": "metric_points", "logs": "log_records"}


@dataclass(frozen=True, slots=True)
class SignalBatch:
    signal: str  # metrics | logs
    payload: bytes
    items: int  # data points or log records


class SignalExporter:
    def __init__(self, cfg: ExporterConfig, telemetry: GatewayMetrics) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._t = telemetry
        self._stop = threading.Event()
        self._q: queue.Queue[SignalBatch | None] = queue.Queue(maxsize=cfg.queue_size)
        if cfg.type == "otlphttp":
            self._http = HttpSender(cfg)  # its TLS, headers and compression; the path is the signal's
            self._base = self._http._url.removesuffix("/v1/traces")
            self._channel = None
        else:
            target = cfg.endpoint.removeprefix("http://").removeprefix("https://")
            self._channel = grpc.insecure_channel(target) if cfg.tls is None else _secure_channel(target, cfg.tls)
            self._calls = {s: self._channel.unary_unary(m, request_serializer=None, response_deserializer=None)
                           for s, m in _METHODS.items()}
        self._worker = threading.Thread(target=self._run, name=f"exporter-{cfg.name}-signals", daemon=True)
        self._worker.start()

    def submit(self, signal: str, payload: bytes, items: int) -> bool:
        try:
            self._q.put_nowait(SignalBatch(signal, payload, items))
            return True
        except queue.Full:
            self._t.inc(f"otelcol_exporter_enqueue_failed_{_UNIT[signal]}", items, exporter=self.name)
            return False

    def flush(self, timeout: float = 30.0) -> bool:
        return wait_drained(self._q, timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        stop_worker(self._q, self._stop, self._worker, timeout)
        if self._channel is not None:
            self._channel.close()
        else:
            self._http.close()

    def _run(self) -> None:
        while True:
            batch = self._q.get()
            try:
                if batch is None:
                    return
                unit = _UNIT[batch.signal]
                if self._stop.is_set() or not self._send(batch):
                    self._t.inc(f"otelcol_exporter_send_failed_{unit}", batch.items, exporter=self.name)
                else:
                    self._t.inc(f"otelcol_exporter_sent_{unit}", batch.items, exporter=self.name)
            finally:
                self._q.task_done()

    def _send(self, batch: SignalBatch) -> bool:
        retry, delay, waited = self.cfg.retry, self.cfg.retry.initial_interval, 0.0
        while True:
            try:
                self._send_once(batch)
                return True
            except PermanentError as exc:
                log.debug("exporter %s: %s refused: %s", self.name, batch.signal, exc)
                return False
            except Exception:  # noqa: BLE001 - transport errors are retryable
                pass
            if not retry.enabled or waited + delay > retry.max_elapsed_time or self._stop.wait(delay):
                return False
            waited += delay
            delay = min(delay * 2, retry.max_interval)

    def _send_once(self, batch: SignalBatch) -> None:
        cfg = self.cfg
        if self._channel is None:
            body = gzip.compress(batch.payload, 1) if cfg.compression == "gzip" else batch.payload
            r = self._http._session.post(f"{self._base}/v1/{batch.signal}", data=body, headers=self._http._headers,
                                         timeout=cfg.timeout, verify=self._http._verify, cert=self._http._cert)
            if r.status_code // 100 == 2:
                return
            if r.status_code in _RETRYABLE_HTTP:
                raise ConnectionError(f"HTTP {r.status_code} (retryable)")
            raise PermanentError(f"HTTP {r.status_code}: {r.text[:200]}")
        try:
            self._calls[batch.signal](batch.payload, timeout=cfg.timeout,
                                      metadata=tuple((k.lower(), v) for k, v in cfg.headers.items()),
                                      compression=grpc.Compression.Gzip if cfg.compression == "gzip" else None)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code in _RETRYABLE_GRPC:
                raise
            raise PermanentError(f"gRPC {code}") from None


__all__ = ["SignalExporter", "SignalBatch"]
