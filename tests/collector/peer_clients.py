"""Loopback clients with their own source addresses (127.0.0.2, 127.0.0.3, ...): a connection squatter, a
gRPC call squatter's route (a forwarder whose upstream side is bound to an address), an honest exporter,
many keep-alive exporters on one address.

Every loop here is bounded in count and in time; everything stops on ``close()``. Used by
tests/collector/test_fairness.py and benchmarks/gateway_hardening.py.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time
from typing import Callable

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class ConnectionSquatter:
    """Holds ``n`` idle TCP connections from ``source`` and reopens each one the server closes (at most
    ``max_reopens`` in all, one round every ``pause`` s, for at most ``max_seconds``). ``before_reopen`` runs
    before each reopen (a test advances its fake clock there: time passes as the squatter churns). With
    ``run=False`` no thread churns: the caller reopens one cut connection at a time (``reopen_one``), so the
    churn interleaves with its own requests in the order it chooses."""

    def __init__(self, port: int, source: str, n: int = 300, max_reopens: int = 50_000, pause: float = 0.02,
                 max_seconds: float = 120.0, send: bytes = b"",
                 before_reopen: Callable[[], None] | None = None, run: bool = True) -> None:
        self.port, self.source, self.n, self.send = port, source, n, send
        self.before_reopen = before_reopen
        self.max_reopens, self.pause, self.max_seconds = max_reopens, pause, max_seconds
        self.opened = 0
        self.reopens = 0
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        for _ in range(n):
            self._open()
        self._thread: threading.Thread | None = None
        if run:
            self._thread = threading.Thread(target=self._run, name="squatter", daemon=True)
            self._thread.start()

    def _open(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(self.source, 0))
            if self.send:
                s.sendall(self.send)
            s.setblocking(False)
            self._socks.append(s)
            self.opened += 1
        except OSError:
            pass

    def _run(self) -> None:
        end = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < end:
            readable = select.select(self._socks, [], [], self.pause)[0] if self._socks else []
            for s in readable:
                self._drop_if_cut(s)
            while len(self._socks) < self.n and self.reopens < self.max_reopens and not self._stop.is_set():
                self._reopen()
            self._stop.wait(self.pause)

    def _drop_if_cut(self, s: socket.socket) -> bool:
        """A readable connection the server answered (a 503) or closed: close ours, True."""
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if data and not data.startswith(b"HTTP/1.1 503"):
            return False
        self._socks.remove(s)
        s.close()
        return True

    def _reopen(self) -> None:
        self.reopens += 1
        if self.before_reopen is not None:
            self.before_reopen()
        self._open()

    def reopen_one(self, timeout: float = 10.0) -> bool:
        """Wait (at most ``timeout`` s) for one connection the server cut (a 503, or closed), close it, run
        ``before_reopen`` and open a new one; False when none was cut in time."""
        end = time.monotonic() + timeout
        while self._socks and time.monotonic() < end:
            for s in select.select(self._socks, [], [], min(0.05, max(0.0, end - time.monotonic())))[0]:
                if self._drop_if_cut(s):
                    self._reopen()
                    return True
        return False

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for s in self._socks:
            s.close()
        self._socks.clear()


class Forwarder:
    """A TCP forwarder on 127.0.0.1 whose connections reach ``port`` from ``source``: a gRPC channel to
    ``endpoint`` is seen by the gateway as a peer at ``source`` (the Python gRPC client cannot bind one)."""

    def __init__(self, port: int, source: str) -> None:
        self.port, self.source = port, source
        self._listen = socket.create_server(("127.0.0.1", 0))
        self._listen.settimeout(0.2)
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="forwarder", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self._listen.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listen.accept()
            except OSError:
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                                    source_address=(self.source, 0))
            except OSError:
                client.close()
                continue
            self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        a.settimeout(None)
        try:
            while not self._stop.is_set():
                data = a.recv(1 << 16)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._listen.close()
        self._thread.join(5)
        for s in self._socks:
            s.close()


def http_export(port: int, body: bytes, source: str = "127.0.0.1", token: str | None = None,
                content_type: str = "application/x-protobuf", timeout: float = 10.0) -> int:
    """One export on its own connection from ``source``; the status, or 0 when the connection failed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status
    except OSError:
        return 0
    finally:
        conn.close()


def keep_alive_clients(port: int, body: bytes, source: str, clients: int = 100, rounds: int = 3,
                       timeout: float = 30.0) -> tuple[list[int], list[float]]:
    """``clients`` keep-alive connections from ``source`` (a host running many instrumented processes), opened
    together, ``rounds`` exports each: the exports each client got through (one entry a client that finished)
    and every export's seconds."""
    oks: list[int] = []
    times: list[float] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients)

    def client() -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
        ok, mine = 0, []
        try:
            ready.wait(60)  # all connections are open together
            for _ in range(rounds):
                t = time.perf_counter()
                try:
                    c.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
                    r = c.getresponse()
                    r.read()
                    ok += r.status == 200
                except (OSError, http.client.HTTPException):
                    c.close()
                mine.append(time.perf_counter() - t)
        finally:
            c.close()
            with lock:
                oks.append(ok)
                times.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t_ in threads:
        t_.start()
    for t_ in threads:
        t_.join(4 * timeout)
    return oks, times
