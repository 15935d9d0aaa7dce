"""OTLP/HTTP receiver: ``POST /v1/traces``, protobuf or JSON, optionally gzip, on a threading HTTP server.

Bad input gets a 4xx with a ``google.rpc.Status`` body (in the request's content type)
saying why, and is counted by reason. The body size is checked before reading it, and
gzip is inflated incrementally with an output cap, so neither a large body nor a gzip
bomb can take more than ``max_request_body_size`` of memory. A semaphore bounds
concurrent requests (503 + Retry-After beyond it) and a socket timeout drops slow clients.

With ``tls`` the port is HTTPS only (TLS >= 1.2; ``client_ca_file`` makes a client certificate
mandatory). The handshake runs on the connection's own thread, never in the accept loop, so a
plaintext client, a failed handshake or a client that never finishes one costs one thread for
at most the socket timeout; each is counted as ``receiver_bad_requests{reason="tls"}``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ContextManager

from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTracePartialSuccess,
                                                                     ExportTraceServiceRequest,
                                                                     ExportTraceServiceResponse)

from ..config import HttpReceiverConfig, TLSServerConfig
from otel_llm.otlp_json import OtlpJsonError, parse_request, to_dict
from ..telemetry import SelfTelemetry
from . import Ingest

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SOCKET_TIMEOUT_S = 10.0


class BadRequest(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def inflate(body: bytes, limit: int) -> bytes:
    """gunzip with an output cap (gzip-bomb safe)."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequest(400, "bad_gzip", f"body is not valid gzip: {exc}") from None
    if len(out) > limit:
        raise BadRequest(413, "gzip_too_large", f"gzip body inflates beyond the limit of {limit} bytes")
    if not d.eof:
        raise BadRequest(400, "bad_gzip", "gzip body is truncated")
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    tls: ssl.SSLContext | None = None
    telemetry: SelfTelemetry | None = None

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = super().get_request()
        if self.tls is not None:  # no handshake here: this is the accept loop, one slow client would stall it
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if isinstance(request, ssl.SSLSocket):  # on the connection's thread
            try:
                request.settimeout(SOCKET_TIMEOUT_S)
                request.do_handshake()
            except (OSError, ValueError):  # SSLError is an OSError: plaintext client, no or bad client cert, timeout
                if self.telemetry is not None:
                    self.telemetry.inc("receiver_bad_requests", transport="http", reason="tls")
                return  # the caller (process_request_thread) closes the socket
        super().finish_request(request, client_address)


def server_context(tls: TLSServerConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=tls.client_ca_file)
    return ctx


class HttpReceiver:
    def __init__(self, cfg: HttpReceiverConfig, ingest: Ingest, telemetry: SelfTelemetry,
                 serial: ContextManager[object] | None = None) -> None:
        """``serial``: held around decompressing, parsing and ingesting a body (the gateway's pipeline lock)."""
        self.cfg = cfg
        self.ingest = ingest
        self.serial = serial if serial is not None else contextlib.nullcontext()
        self.telemetry = telemetry
        self.slots = threading.BoundedSemaphore(cfg.max_concurrent_requests)
        receiver = self

        class Handler(_Handler):
            owner = receiver

        tls = server_context(cfg.tls) if cfg.tls is not None else None  # before binding: a bad cert binds nothing
        self._server = _Server((cfg.host, cfg.port), Handler)
        self._server.tls, self._server.telemetry = tls, telemetry
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    owner: HttpReceiver
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S
    server_version = "otel-llm-collector"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # counted in telemetry instead of one stderr line per request

    def _reply(self, status: int, content_type: str, body: bytes, close: bool = False,
               extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, err: BadRequest, json_reply: bool, close: bool = False) -> None:
        self.owner.telemetry.inc("receiver_bad_requests", transport="http", reason=err.reason)
        status = Status(code=_GRPC_CODE.get(err.status, 3), message=err.message)
        if json_reply:
            body, ctype = json.dumps(to_dict(status)).encode(), JSON
        else:
            body, ctype = status.SerializeToString(), PROTOBUF
        extra = {"Retry-After": "1"} if err.status == 503 else None
        self._reply(err.status, ctype, body, close, extra)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """A request we answer without reading its body: close the connection afterwards."""
        self._error(BadRequest(status, reason, message), json_reply=JSON in (self.headers.get("Content-Type") or ""),
                    close=True)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._refuse(405, "method", f"use POST {PATH}")

    do_PUT = do_DELETE = do_PATCH = do_GET

    def do_POST(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] != PATH:
            return self._refuse(404, "path", f"unknown path {self.path[:100]!r}; traces go to {PATH}")
        if not self.owner.slots.acquire(blocking=False):
            return self._refuse(503, "busy", "too many concurrent requests; retry later")
        try:
            self._post()
        finally:
            self.owner.slots.release()

    def _post(self) -> None:
        cfg = self.owner.cfg
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        is_json = ctype == JSON
        if ctype not in (PROTOBUF, JSON):
            return self._refuse(415, "content_type",
                                f"unsupported Content-Type {ctype!r}; use {PROTOBUF} or {JSON}")
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip", "none"):
            return self._refuse(415, "content_encoding", f"unsupported Content-Encoding {encoding!r}; use gzip")
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length") is None:
            return self._refuse(411, "length_required", "a Content-Length is required (chunked bodies are refused)")
        try:
            length = int(self.headers["Content-Length"])
            if length < 0:
                raise ValueError
        except ValueError:
            return self._refuse(400, "bad_length", "Content-Length is not a non-negative integer")
        if length > cfg.max_body_bytes:
            self._drain(length)  # so the client reads our 413 rather than a reset connection
            return self._refuse(413, "too_large", f"body of {length} bytes exceeds the limit of {cfg.max_body_bytes}")
        try:
            body = self.rfile.read(length)
        except OSError:
            self.owner.telemetry.inc("receiver_bad_requests", transport="http", reason="read_timeout")
            self.close_connection = True
            return
        try:
            if len(body) < length:
                raise BadRequest(400, "truncated", f"body ended after {len(body)} of {length} bytes")
            with self.owner.serial:
                if encoding == "gzip":
                    body = inflate(body, cfg.max_body_bytes)
                request = self._parse(body, is_json)
                rejected = self.owner.ingest(request, "http", None if is_json else body)
        except BadRequest as err:
            return self._error(err, is_json)
        except Exception as exc:  # noqa: BLE001 - a processing bug must not take the receiver down
            return self._error(BadRequest(500, "internal", f"processing failed: {type(exc).__name__}"), is_json)
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.CopyFrom(ExportTracePartialSuccess(
                rejected_spans=rejected, error_message="spans without a valid 16-byte trace id were refused"))
        if is_json:
            self._reply(200, JSON, json.dumps(to_dict(response)).encode())
        else:
            self._reply(200, PROTOBUF, response.SerializeToString())

    def _drain(self, length: int, cap: int = 64 << 20) -> None:
        """Discard up to ``cap`` bytes of an unwanted body in small chunks (constant memory)."""
        left = min(length, cap)
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    @staticmethod
    def _parse(body: bytes, is_json: bool) -> ExportTraceServiceRequest:
        if is_json:
            try:
                return parse_request(body)
            except OtlpJsonError as exc:
                raise BadRequest(400, "malformed_json", str(exc)) from None
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError, ValueError) as exc:
            raise BadRequest(400, "malformed_protobuf",
                             f"malformed ExportTraceServiceRequest: {exc or 'cannot decode protobuf'}") from None
        return request


# HTTP status -> google.rpc.Code, for the Status body
_GRPC_CODE = {400: 3, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 500: 13, 503: 14}
