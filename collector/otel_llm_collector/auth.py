"""Bearer-token authentication (the upstream ``bearertokenauth`` extension's server side), and the
start-up warning for a receiver open to the network with neither TLS nor a token.

A request presents ``<scheme> <token>`` in its ``authorization`` header (gRPC: metadata). The token is
compared with every configured one by ``hmac.compare_digest`` (constant time for equal lengths, and no
early exit across tokens), so response timing does not reveal how much of a guess was right.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from typing import TYPE_CHECKING

from .config import BearerTokenConfig

if TYPE_CHECKING:
    from .config import CollectorConfig

log = logging.getLogger("otel_llm_collector")


class BearerAuth:
    def __init__(self, cfg: BearerTokenConfig) -> None:
        self.header = cfg.header
        self._tokens = cfg.tokens
        self._prefix = (cfg.scheme + " ").encode() if cfg.scheme else b""
        self._tenants = tuple(cfg.tenant(i) for i in range(len(cfg.tokens)))

    def check(self, value: str | bytes | None) -> bool:
        """Whether a header value carries one of the tokens."""
        return self.tenant(value) is not None

    def tenant(self, value: str | bytes | None) -> str | None:
        """The tenant whose token a header value carries; None when it carries none of them."""
        if value is None:
            return None
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        prefix = self._prefix
        # the scheme is matched case-insensitively, as HTTP auth schemes are
        if prefix and raw[:len(prefix)].lower() != prefix.lower():
            return None
        presented = raw[len(prefix):].strip()
        found = -1
        for i, token in enumerate(self._tokens):  # every token compared: no early exit on a match
            if hmac.compare_digest(presented, token):
                found = i
        return self._tenants[found] if found >= 0 else None


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unprotected_listeners(cfg: "CollectorConfig") -> list[str]:
    """The listeners that bind beyond loopback with neither TLS nor a bearer token (warned about at start)."""
    out = []
    if cfg.grpc is not None and not (is_loopback(cfg.grpc.host) or cfg.grpc.tls or cfg.grpc.auth):
        out.append(f"OTLP/gRPC receiver on {cfg.grpc.host}:{cfg.grpc.port}")
    if cfg.http is not None and not (is_loopback(cfg.http.host) or cfg.http.tls or cfg.http.auth):
        out.append(f"OTLP/HTTP receiver on {cfg.http.host}:{cfg.http.port}")
    if cfg.prometheus is not None and not (is_loopback(cfg.prometheus[0]) or cfg.prometheus_auth):
        out.append(f"Prometheus endpoint on {cfg.prometheus[0]}:{cfg.prometheus[1]}")
    return out


def warn_unprotected(cfg: "CollectorConfig") -> list[str]:
    found = unprotected_listeners(cfg)
    for what in found:
        log.warning("%s: neither TLS nor a bearer token; anyone who can reach it can send or read telemetry "
                    "(set tls, or auth: {authenticator: bearertokenauth})", what)
    return found
