"""OTLP/JSON lines files: one ``ExportTraceServiceRequest`` per line.

The format the upstream Collector's file exporter writes and its ``otlpjsonfile`` receiver reads,
so a file can be replayed into Jaeger or Tempo later (see docs/views.md). Two writers share ``json_line``:
the SDK-side span exporter below and the collector's ``file`` exporter (which holds encoded requests).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .json_codec import to_dict


def json_line(request: Any) -> str:
    """One line of the file (no newline): an ``ExportTraceServiceRequest``, or its protobuf bytes."""
    if isinstance(request, (bytes, bytearray, memoryview)):
        from .messages import ExportTraceServiceRequest

        request = ExportTraceServiceRequest.FromString(bytes(request))
    return json.dumps(to_dict(request), separators=(",", ":"))


class OTLPJsonFileExporter(SpanExporter):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json_line(encode_spans(spans))
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
