"""One sender per protocol: deliver an encoded ExportTraceServiceRequest, or raise.

``PermanentError`` means retrying cannot help (the backend rejected the data); any other
exception is treated as transient and retried by the queue.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
from typing import Protocol

import grpc
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                     ExportTraceServiceResponse)

from ..config import ExporterConfig
from otel_llm.otlp_json import to_dict

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_RETRYABLE_GRPC = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                   grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.OUT_OF_RANGE,
                   grpc.StatusCode.DATA_LOSS}
_RETRYABLE_HTTP = {429, 502, 503, 504}  # the OTLP spec's list


class PermanentError(Exception):
    pass


class Sender(Protocol):
    def send(self, payload: bytes) -> None: ...
    def close(self) -> None: ...


class GrpcSender:
    def __init__(self, cfg: ExporterConfig) -> None:
        target = cfg.endpoint.removeprefix("http://")
        self._channel = grpc.insecure_channel(target)
        # identity serializer: the payload is already encoded, once, for every exporter
        self._call = self._channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                               response_deserializer=ExportTraceServiceResponse.FromString)
        self._timeout = cfg.timeout
        self._metadata = tuple((k.lower(), v) for k, v in cfg.headers.items())
        self._compression = grpc.Compression.Gzip if cfg.compression == "gzip" else None

    def send(self, payload: bytes) -> None:
        try:
            self._call(payload, timeout=self._timeout, metadata=self._metadata, compression=self._compression)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code in _RETRYABLE_GRPC:
                raise
            raise PermanentError(f"gRPC {code}: {exc.details() if hasattr(exc, 'details') else exc}") from None

    def close(self) -> None:
        self._channel.close()


class HttpSender:
    def __init__(self, cfg: ExporterConfig) -> None:
        url = cfg.endpoint if "://" in cfg.endpoint else f"http://{cfg.endpoint}"
        self._url = url if url.rstrip("/").endswith("/v1/traces") else url.rstrip("/") + "/v1/traces"
        self._session = requests.Session()
        self._timeout = cfg.timeout
        self._headers = {**cfg.headers, "Content-Type": "application/x-protobuf"}
        self._gzip = cfg.compression == "gzip"
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"

    def send(self, payload: bytes) -> None:
        body = gzip.compress(payload, 1) if self._gzip else payload
        r = self._session.post(self._url, data=body, headers=self._headers, timeout=self._timeout)
        if r.status_code // 100 == 2:
            return
        if r.status_code in _RETRYABLE_HTTP:
            raise ConnectionError(f"HTTP {r.status_code} (retryable)")
        raise PermanentError(f"HTTP {r.status_code}: {r.text[:200]}")

    def close(self) -> None:
        self._session.close()


class FileSender:
    """OTLP/JSON lines, one ExportTraceServiceRequest per line (the upstream file exporter's format)."""

    def __init__(self, cfg: ExporterConfig) -> None:
        self._path = cfg.path
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(cfg.path)), exist_ok=True)

    def send(self, payload: bytes) -> None:
        line = json.dumps(to_dict(ExportTraceServiceRequest.FromString(payload)), separators=(",", ":"))
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def close(self) -> None:
        pass
