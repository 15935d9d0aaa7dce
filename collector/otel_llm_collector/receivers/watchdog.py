"""Deadlines on blocking socket reads: when one passes, the socket is shut down, so the read returns.

A per-read socket timeout cannot stop a client that sends one byte every few seconds (each byte
restarts it). One thread keeps every armed deadline in a heap and shuts down the sockets whose
deadline passed: the blocked reader then sees end-of-stream and the handler ends, whatever the
client's pace. Disarming is O(1) (the entry is dropped when it reaches the top, or at a compaction).
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from typing import Callable


class Deadline:
    __slots__ = ("when", "sock", "reason", "armed", "expired")

    def __init__(self, when: float, sock: socket.socket, reason: str) -> None:
        self.when, self.sock, self.reason = when, sock, reason
        self.armed = True
        self.expired: str | None = None  # the reason, once it fired


class Watchdog:
    def __init__(self, clock: Callable[[], float] = time.monotonic, name: str = "otlp-http-deadlines") -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._armed = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def arm(self, sock: socket.socket, seconds: float, reason: str) -> Deadline:
        d = Deadline(self._clock() + seconds, sock, reason)
        with self._cond:
            heapq.heappush(self._heap, (d.when, next(self._seq), d))
            self._armed += 1
            if self._heap[0][2] is d:
                self._cond.notify()
        return d

    def disarm(self, d: Deadline) -> None:
        with self._cond:
            if d.armed:
                d.armed = False
                self._armed -= 1
                if len(self._heap) > 64 and len(self._heap) > 4 * self._armed:  # many disarmed: compact
                    self._heap = [e for e in self._heap if e[2].armed]
                    heapq.heapify(self._heap)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(5)

    def _run(self) -> None:
        with self._cond:
            while not self._stopping:
                while self._heap and not self._heap[0][2].armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - self._clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                d = heapq.heappop(self._heap)[2]
                d.armed, d.expired = False, d.reason
                self._armed -= 1
                try:  # the plain socket's shutdown (an SSLSocket's would unwrap under its reader's feet)
                    socket.socket.shutdown(d.sock, socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed
