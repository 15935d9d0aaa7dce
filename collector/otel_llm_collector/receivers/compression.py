"""Inflating compressed request bodies with an output cap, so a gzip bomb costs at most the cap.

Both receivers inflate here, not in their libraries: the HTTP server does not inflate at all, and gRPC's
own inflation refuses a bomb before any handler sees it (uncounted, and racing the handler's own abort).
The gRPC receiver turns gRPC's inflation off and recognises a compressed message by its header: a gzip
member starts with 1f 8b, which can never begin an OTLP request (wire type 7 does not exist); a zlib
stream (gRPC's ``deflate``) with a valid header is tried and, if it does not inflate, read as protobuf.
"""

from __future__ import annotations

import zlib


class InflateError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


GZIP_WBITS = 16 + zlib.MAX_WBITS
ZLIB_WBITS = zlib.MAX_WBITS


def inflate(body: bytes, limit: int, wbits: int = GZIP_WBITS) -> bytes:
    """Inflate ``body`` (gzip by default); ``InflateError`` (``gzip_too_large``, ``bad_gzip``) otherwise."""
    d = zlib.decompressobj(wbits=wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InflateError("bad_gzip", f"body is not valid gzip: {exc}") from None
    if len(out) > limit:
        raise InflateError("gzip_too_large", f"compressed body inflates beyond the limit of {limit} bytes")
    if not d.eof:
        raise InflateError("bad_gzip", "compressed body is truncated")
    return out


def inflate_message(message: bytes, limit: int) -> bytes:
    """A gRPC message as received with gRPC's inflation off: inflated if it is a gzip or zlib stream."""
    if message[:2] == b"\x1f\x8b":
        return inflate(message, limit)
    if len(message) >= 2 and message[0] & 0x0F == 8 and (message[0] << 8 | message[1]) % 31 == 0:
        try:
            return inflate(message, limit, ZLIB_WBITS)
        except InflateError as exc:
            if exc.reason == "gzip_too_large":
                raise
    return message
