"""One sender per protocol: deliver an encoded ExportTraceServiceRequest, or raise.

``send`` returns how many spans the backend refused in an accepted request (OTLP ``partial_success``:
counted as dropped, never as sent). ``PermanentError`` means retrying cannot help (the backend rejected
the data); any other exception is treated as transient and retried by the queue.

TLS (``ExporterConfig.tls``, validated in config.py): gRPC reads its PEM files once, here, into channel
credentials. requests takes paths (``verify=``, ``cert=``) and urllib3 loads them for each new connection
(connections are kept alive and reused). A failed handshake is a transient error, retried then dropped and
counted like any unreachable backend.
"""

from __future__ import annotations

import gzip
import os
import threading
from typing import Protocol

import grpc
import requests
from requests.adapters import HTTPAdapter

from otel_llm.otlp import messages
from otel_llm.otlp.file import json_line

from ..config import ExporterConfig, TLSClientConfig, read_pem

EXPORT_METHOD = messages.EXPORT_METHOD
_RETRYABLE_GRPC = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                   grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.OUT_OF_RANGE,
                   grpc.StatusCode.DATA_LOSS}
_RETRYABLE_HTTP = {429, 502, 503, 504}  # the OTLP spec's list


class PermanentError(Exception):
    pass


class Sender(Protocol):
    def send(self, payload: bytes) -> "Rejected": ...
    def close(self) -> None: ...


class Rejected(tuple):
    """(spans the backend refused, its message): a response's ``partial_success``."""

    @property
    def spans(self) -> int:
        return self[0]

    @property
    def message(self) -> str:
        return self[1]


ACCEPTED = Rejected((0, ""))


def _partial(rejected: tuple[int, str]) -> Rejected:
    """A response's ``partial_success`` (``messages.read_response``)."""
    return Rejected(rejected) if rejected[0] else ACCEPTED


class GrpcSender:
    def __init__(self, cfg: ExporterConfig) -> None:
        target = cfg.endpoint.removeprefix("http://").removeprefix("https://")
        self._channel = grpc.insecure_channel(target) if cfg.tls is None else _secure_channel(target, cfg.tls)
        # identity serializer: the payload is already encoded, once, for every exporter
        self._call = self._channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                               response_deserializer=messages.read_response)
        self._timeout = cfg.timeout
        self._metadata = tuple((k.lower(), v) for k, v in cfg.headers.items())
        self._compression = grpc.Compression.Gzip if cfg.compression == "gzip" else None

    def send(self, payload: bytes) -> Rejected:
        try:
            return _partial(self._call(payload, timeout=self._timeout, metadata=self._metadata,
                                       compression=self._compression))
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code in _RETRYABLE_GRPC:
                raise
            raise PermanentError(f"gRPC {code}: {exc.details() if hasattr(exc, 'details') else exc}") from None

    def close(self) -> None:
        self._channel.close()


def _secure_channel(target: str, tls: TLSClientConfig) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=read_pem(tls.ca_file),
                                               private_key=read_pem(tls.key_file),
                                               certificate_chain=read_pem(tls.cert_file))
    options = [("grpc.ssl_target_name_override", tls.server_name_override)] if tls.server_name_override else []
    return grpc.secure_channel(target, credentials, options=options)


class _ServerNameAdapter(HTTPAdapter):
    """Connects to the endpoint's address but sends ``name`` as SNI and checks the certificate against it."""

    def __init__(self, name: str) -> None:
        self._name = name  # before super().__init__, which builds the pool manager
        super().__init__()

    def init_poolmanager(self, *args: object, **kwargs: object) -> None:
        kwargs.update(server_hostname=self._name, assert_hostname=self._name)
        super().init_poolmanager(*args, **kwargs)  # type: ignore[arg-type]


class HttpSender:
    def __init__(self, cfg: ExporterConfig) -> None:
        tls = cfg.tls
        url = cfg.endpoint if "://" in cfg.endpoint else f"{'http' if tls is None else 'https'}://{cfg.endpoint}"
        self._url = url if url.rstrip("/").endswith("/v1/traces") else url.rstrip("/") + "/v1/traces"
        self._session = requests.Session()
        # passed with every post rather than set on the session: requests lets REQUESTS_CA_BUNDLE replace a
        # session's verify (even False or a CA path), not a request's explicit one
        self._verify: bool | str = True
        self._cert: tuple[str, str] | None = None
        if tls is not None:
            self._verify = False if tls.insecure_skip_verify else (tls.ca_file or True)
            self._cert = (tls.cert_file, tls.key_file) if tls.cert_file and tls.key_file else None
            if tls.server_name_override:
                self._session.mount("https://", _ServerNameAdapter(tls.server_name_override))
        self._timeout = cfg.timeout
        self._headers = {**cfg.headers, "Content-Type": "application/x-protobuf"}
        self._gzip = cfg.compression == "gzip"
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"

    def send(self, payload: bytes) -> Rejected:
        body = gzip.compress(payload, 1) if self._gzip else payload
        r = self._session.post(self._url, data=body, headers=self._headers, timeout=self._timeout,
                               verify=self._verify, cert=self._cert)
        if r.status_code // 100 == 2:
            return _http_partial(r)
        if r.status_code in _RETRYABLE_HTTP:
            raise ConnectionError(f"HTTP {r.status_code} (retryable)")
        raise PermanentError(f"HTTP {r.status_code}: {r.text[:200]}")

    def close(self) -> None:
        self._session.close()


def _http_partial(r: requests.Response) -> Rejected:
    """An OTLP/HTTP success response's ``partial_success`` (protobuf or JSON body; empty: all accepted)."""
    if not r.content:
        return ACCEPTED
    ctype = r.headers.get("Content-Type", "")
    try:
        if "json" in ctype:
            return _partial(messages.read_json_response(r.content))
        return _partial(messages.read_response(r.content))
    except messages.RESPONSE_ERRORS:
        return ACCEPTED  # a 2xx whose body we cannot read: the request was accepted


class FileSender:
    """OTLP/JSON lines, one ExportTraceServiceRequest per line (the upstream file exporter's format)."""

    def __init__(self, cfg: ExporterConfig) -> None:
        self._path = cfg.path
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(cfg.path)), exist_ok=True)

    def send(self, payload: bytes) -> Rejected:
        line = json_line(payload)
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        return ACCEPTED

    def close(self) -> None:
        pass
