"""KV hand-off records from a spawned EngineCore to the frontends that own the requests.

One small datagram per hand-off (at most two a request: a load and a save), JSON-encoded, on Unix
sockets in the frontends' step directory (``step_transport.STEP_DIR_ENV``): every frontend that builds an
engine with a KV connector binds ``<dir>/<pid>.kv`` there before the engine is spawned. The records
are per request, not per step: no shared-memory ring, no fixed layout. Sends never block: a record a
frontend cannot take is dropped and counted (``HandoffSink.dropped``).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Callable

from ...guard import Guard
from ...core.handoff import KVHandoff
from .step_transport import _unlink

SUFFIX = ".kv"  # not ".sock": the step sinks connect to every ``*.sock`` in the same directory
MAX_DATAGRAM = 1 << 16


class HandoffSink:
    """EngineCore side: each record to every frontend's ``*.kv`` socket in ``directory``."""

    RESCAN_S = 1.0

    def __init__(self, directory: str, clock: Callable[[], float]) -> None:
        self.directory = directory
        self.clock = clock
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.paths: list[str] = []
        self.scanned = float("-inf")
        self.dropped = 0

    def __call__(self, record: KVHandoff) -> None:
        now = self.clock()
        if now - self.scanned > self.RESCAN_S:
            self.scanned = now
            try:
                self.paths = [os.path.join(self.directory, f) for f in sorted(os.listdir(self.directory))
                              if f.endswith(SUFFIX)]
            except OSError:
                self.paths = []
        data = json.dumps(record.to_wire(), separators=(",", ":")).encode()
        for path in self.paths:
            try:
                self.sock.sendto(data, path)
            except OSError:
                self.dropped += 1  # a frontend that lags (buffer full) or is gone: telemetry is what we lose

    def close(self) -> None:
        self.sock.close()


class HandoffReceiver:
    """Frontend side: this process's ``<pid>.kv`` socket, drained with the step records."""

    def __init__(self, directory: str, guard: Guard | None = None) -> None:
        self.guard = guard if guard is not None else Guard()  # the instrumentor's: a malformed record is counted there
        self.path = os.path.join(directory, f"{os.getpid()}{SUFFIX}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _unlink(self.path)  # a stale one of a dead process that had our pid
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.malformed = 0

    def drain(self, deliver: Callable[[KVHandoff], None]) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, OSError):
                return
            try:
                record = KVHandoff.from_wire(json.loads(data))
            except (ValueError, TypeError) as exc:  # json's errors are ValueErrors
                self.malformed += 1
                self.guard.failed("kv hand-off record wire", exc)
                continue
            deliver(record)

    def close(self) -> None:
        self.sock.close()
        _unlink(self.path)
