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

from .config import BearerTokenConfig

log = logging.getLogger("otel_llm_collector")


class BearerAuth:
    def __init__(self, cfg: BearerTokenConfig) -> None:
        self.header = cfg.header
        self._tokens = cfg.tokens
        self._prefix = (cfg.scheme + " ").encode() if cfg.scheme else b""

    def check(self, value: str | bytes | None) -> bool:
        """Whether a header value carries one of the tokens."""
        if value is None:
            return False
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        prefix = self._prefix
        # the scheme is matched case-insensitively, as HTTP auth schemes are
        if prefix and raw[:len(prefix)].lower() != prefix.lower():
            return False
        presented = raw[len(prefix):].strip()
        ok = False
        for token in self._tokens:  # every token compared: no early exit on a match
            ok |= hmac.compare_digest(presented, token)
        return ok


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_open(what: str, host: str, tls: bool, token: bool) -> bool:
    """Log a warning when ``what`` listens beyond loopback with neither TLS nor a token; True if it did."""
    if is_loopback(host) or tls or token:
        return False
    log.warning("%s listens on %s with neither TLS nor a bearer token: anyone who can reach it can send or "
                "read telemetry (set tls and/or auth: {authenticator: bearertokenauth})", what, host)
    return True
