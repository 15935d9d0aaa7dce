"""OTLP/gRPC receiver: ``TraceService/Export`` on a thread-pool server.

The request arrives as raw bytes (identity deserializer) so that a malformed body becomes
a counted ``INVALID_ARGUMENT`` with the parser's reason, and an oversized one a counted
``RESOURCE_EXHAUSTED``, instead of an opaque transport error. gRPC itself enforces a hard
cap slightly above ours (and applies it after gzip decompression, so gzip bombs stop there).

With ``tls`` the port is TLS only (gRPC's own handshake; ``client_ca_file`` makes a client
certificate mandatory). gRPC completes or refuses handshakes before any handler runs, so TLS
failures are not counted in ``receiver_bad_requests`` here (the HTTP receiver counts them).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import ContextManager

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTracePartialSuccess,
                                                                     ExportTraceServiceRequest,
                                                                     ExportTraceServiceResponse)

from ..config import GrpcReceiverConfig, TLSServerConfig, read_pem
from ..telemetry import SelfTelemetry
from . import Ingest

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class GrpcReceiver:
    def __init__(self, cfg: GrpcReceiverConfig, ingest: Ingest, telemetry: SelfTelemetry,
                 serial: ContextManager[object] | None = None, workers: int = 8) -> None:
        """``serial``: held around parsing and ingesting a request (the gateway's pipeline lock)."""
        self._cfg = cfg
        self._ingest = ingest
        self._serial = serial if serial is not None else contextlib.nullcontext()
        self._t = telemetry
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
            maximum_concurrent_rpcs=workers * 8,  # beyond this clients get RESOURCE_EXHAUSTED, not a pile-up
            options=[("grpc.max_receive_message_length", cfg.max_message_bytes + (64 << 10)),
                     ("grpc.so_reuseport", 0)])
        handler = grpc.unary_unary_rpc_method_handler(self._export, request_deserializer=None,
                                                      response_serializer=None)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        address = f"{cfg.host}:{cfg.port}"
        self.port = (self._server.add_insecure_port(address) if cfg.tls is None
                     else self._server.add_secure_port(address, _credentials(cfg.tls)))
        if not self.port:
            raise OSError(f"cannot bind OTLP/gRPC receiver to {cfg.host}:{cfg.port}")

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait()

    def _bad(self, context: grpc.ServicerContext, code: grpc.StatusCode, reason: str, message: str) -> None:
        self._t.inc("receiver_bad_requests", transport="grpc", reason=reason)
        context.abort(code, message)

    def _export(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        if len(raw) > self._cfg.max_message_bytes:
            self._bad(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "too_large",
                      f"message of {len(raw)} bytes exceeds the limit of {self._cfg.max_message_bytes}")
        with self._serial:
            request = ExportTraceServiceRequest()
            try:
                request.ParseFromString(raw)
            except (DecodeError, RecursionError, ValueError) as exc:
                self._bad(context, grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                          f"malformed ExportTraceServiceRequest: {exc or 'cannot decode protobuf'}")
            try:
                rejected = self._ingest(request, "grpc", raw)
            except Exception as exc:  # noqa: BLE001 - a processing bug must not take the receiver down
                self._bad(context, grpc.StatusCode.INTERNAL, "internal", f"processing failed: {type(exc).__name__}")
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.CopyFrom(ExportTracePartialSuccess(
                rejected_spans=rejected, error_message="spans without a valid 16-byte trace id were refused"))
        return response.SerializeToString()


def _credentials(tls: TLSServerConfig) -> grpc.ServerCredentials:
    client_ca = read_pem(tls.client_ca_file)
    return grpc.ssl_server_credentials([(read_pem(tls.key_file), read_pem(tls.cert_file))],
                                       root_certificates=client_ca, require_client_auth=client_ca is not None)
