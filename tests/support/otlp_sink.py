"""An in-process OTLP/HTTP receiver for tests: ``POST /v1/traces`` and ``/v1/metrics`` (protobuf, or gzip'd).

Collects spans from any number of processes (each one's OTLP exporter pointed at
``sink.endpoint``) as plain ``SinkSpan`` records, so tests can assemble one trace across a
client and a server; metric data points as ``SinkPoint`` records. ``/v1/logs`` is accepted and counted.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                       ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from otel_llm import semconv as sc

_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


@dataclass
class SinkSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str  # INTERNAL | SERVER | CLIENT ...
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: str  # UNSET | OK | ERROR
    status_message: str
    service: str | None
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def readable(self) -> Any:
        """As the SDK's ReadableSpan, so helpers written for in-memory spans read OTLP-received ones."""
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

        def ctx(trace_hex: str, span_hex: str) -> SpanContext:
            return SpanContext(int(trace_hex, 16), int(span_hex, 16), False)

        return ReadableSpan(
            name=self.name, context=ctx(self.trace_id, self.span_id),
            parent=ctx(self.trace_id, self.parent_span_id) if self.parent_span_id else None,
            kind=SpanKind[self.kind] if self.kind in SpanKind.__members__ else SpanKind.INTERNAL,
            attributes=self.attributes, events=[Event(n, a, ts) for n, ts, a in self.events],
            links=[Link(ctx(t, s)) for t, s in self.links], start_time=self.start_ns, end_time=self.end_ns,
            status=Status(StatusCode[self.status], self.status_message or None))


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def decode(body: bytes) -> list[SinkSpan]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        service = resource.get(sc.SERVICE_NAME)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(SinkSpan(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex(),
                    name=s.name, kind=_KINDS.get(s.kind, str(s.kind)), start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano, attributes=_attrs(s.attributes),
                    status=_STATUS.get(s.status.code, str(s.status.code)), status_message=s.status.message,
                    service=service,
                    events=[(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events],
                    links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links], resource=resource))
    return out


@dataclass
class SinkPoint:
    """One exported metric data point: a sum's or gauge's ``value``, a histogram's ``count`` and ``sum``."""

    name: str
    attributes: dict[str, Any]
    value: float | None
    count: int | None
    sum: float | None
    time_ns: int
    resource: dict[str, Any]
    explicit_bounds: tuple[float, ...] = ()


def decode_metrics(body: bytes) -> list[SinkPoint]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    req = ExportMetricsServiceRequest()
    req.ParseFromString(body)
    out = []
    for rm in req.resource_metrics:
        resource = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                which = m.WhichOneof("data")
                for p in getattr(m, which).data_points:
                    if which == "histogram":
                        out.append(SinkPoint(m.name, _attrs(p.attributes), None, p.count, p.sum,
                                             p.time_unix_nano, resource, tuple(p.explicit_bounds)))
                    else:
                        value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                        out.append(SinkPoint(m.name, _attrs(p.attributes), value, None, None, p.time_unix_nano,
                                             resource))
    return out


class OTLPSink:
    """``with OTLPSink() as sink: ...``; point exporters at ``sink.endpoint`` (OTLP/HTTP, protobuf)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._spans: list[SinkSpan] = []
        self._metrics: list[SinkPoint] = []
        self.requests = {"traces": 0, "metrics": 0, "logs": 0}
        self.errors: list[str] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                signal = self.path.rstrip("/").rsplit("/", 1)[-1]
                try:
                    if signal == "traces":
                        spans = decode(body)
                        with sink._lock:
                            sink._spans.extend(spans)
                    elif signal == "metrics":
                        exported = decode_metrics(body)
                        with sink._lock:
                            sink._metrics.extend(exported)
                    with sink._lock:
                        sink.requests[signal] = sink.requests.get(signal, 0) + 1
                except Exception as exc:  # a malformed export: answer 400, remember why
                    sink.errors.append(repr(exc))
                    self.send_response(400)
                    self.end_headers()
                    return
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-sink", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "OTLPSink":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "OTLPSink":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def spans(self, trace_id: str | None = None) -> list[SinkSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()
            self._metrics.clear()

    def metric_points(self, name: str | None = None) -> list[SinkPoint]:
        """Every exported data point (of ``name``), in the order they arrived."""
        with self._lock:
            return [p for p in self._metrics if name is None or p.name == name]

    def wait_for(self, predicate: Callable[[list[SinkSpan]], bool], timeout: float = 30.0,
                 trace_id: str | None = None) -> list[SinkSpan]:
        """Poll until ``predicate(spans)`` holds (exporters batch); returns the spans either way."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans(trace_id)
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)
