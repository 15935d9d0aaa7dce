"""Exporters: a bounded queue and retry loop (``queue.py``) in front of one sender per protocol."""

from __future__ import annotations

from ..config import ExporterConfig
from ..telemetry import GatewayMetrics
from .queue import Clock, QueuedExporter, Sleep
from .senders import FileSender, GrpcSender, HttpSender, Sender


def make_exporter(cfg: ExporterConfig, telemetry: GatewayMetrics) -> QueuedExporter:
    sender: Sender
    if cfg.type in ("otlp", "otlp_grpc"):  # upstream's new name for its OTLP/gRPC exporter, and the old one
        sender = GrpcSender(cfg)
    elif cfg.type == "otlphttp":
        sender = HttpSender(cfg)
    elif cfg.type == "file":
        sender = FileSender(cfg)
    else:
        raise ValueError(f"unknown exporter type {cfg.type!r}")
    telemetry.set("otelcol_exporter_queue_capacity", cfg.queue_size, exporter=cfg.name, data_type="traces")
    return QueuedExporter(cfg, sender, telemetry)


__all__ = ["make_exporter", "QueuedExporter", "Sender", "GrpcSender", "HttpSender", "FileSender", "Clock", "Sleep"]
