"""Exporters: a bounded queue and retry loop (``queue.py``) in front of one sender per protocol."""

from __future__ import annotations

from ..config import ExporterConfig, FileStorageConfig
from ..storage import DurableLog, log_directory
from ..telemetry import GatewayMetrics
from .queue import Clock, QueuedExporter, Sleep
from .senders import FileSender, GrpcSender, HttpSender, Sender


def make_exporter(cfg: ExporterConfig, telemetry: GatewayMetrics,
                  storage: FileStorageConfig | None = None) -> QueuedExporter:
    """``storage``: the ``file_storage`` extension its ``sending_queue.storage`` names (None: in memory)."""
    sender: Sender
    if cfg.type in ("otlp", "otlp_grpc"):  # upstream's new name for its OTLP/gRPC exporter, and the old one
        sender = GrpcSender(cfg)
    elif cfg.type == "otlphttp":
        sender = HttpSender(cfg)
    elif cfg.type == "file":
        sender = FileSender(cfg)
    else:
        raise ValueError(f"unknown exporter type {cfg.type!r}")
    log = None
    if storage is not None:
        log = DurableLog(log_directory(storage.directory, f"exporter_{cfg.name}"), storage.fsync, storage.max_bytes,
                         lambda outcome, n: telemetry.inc("storage_records", n, storage=f"exporter/{cfg.name}",
                                                          outcome=outcome))
    return QueuedExporter(cfg, sender, telemetry, log=log)


__all__ = ["make_exporter", "QueuedExporter", "Sender", "GrpcSender", "HttpSender", "FileSender", "Clock", "Sleep"]
