"""OTLP/JSON bodies parsed in worker processes, so that a large one does not stall other clients.

Parsing OTLP/JSON (``json.loads`` and ``json_format``) holds the interpreter's lock for its whole
length - long for a body near the cap (benchmarks/gateway_hardening.py, section ``json_vs_grpc``) - and
every other receiving thread, gRPC's event loop included, waits for it. Here the body goes to a worker process (``forkserver``: a
clean process, not a fork of this multi-threaded one) which parses it and sends the request back as
protobuf bytes; the handler thread waits without holding the lock, and the gateway reads the bytes
like any protobuf body. At most ``4 x workers`` bodies wait or run at once (beyond:
``JsonWorkersBusy``, a 503); the HTTP receiver meters each peer's JSON bytes before handing them over
(``fairness.ByteBudgets``). A worker that dies (a parse that crashes the interpreter) is replaced and
that body refused.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

PARSE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ParsedJson:
    """A worker's answer: the request as protobuf bytes, or why the body was refused."""

    protobuf: bytes | None
    error: str | None
    pid: int  # the worker process that parsed it


class JsonWorkersBusy(Exception):
    pass


def parse_in_worker(body: bytes) -> ParsedJson:
    """In a worker process: OTLP/JSON -> protobuf bytes (the reasons are the receiver's own)."""
    from otel_llm.otlp.json_codec import OtlpJsonError, parse_request

    try:
        return ParsedJson(parse_request(body).SerializeToString(), None, os.getpid())
    except OtlpJsonError as exc:
        return ParsedJson(None, str(exc), os.getpid())
    except Exception as exc:  # noqa: BLE001 - whatever the body makes the parser or the encoder raise is the client's
        return ParsedJson(None, f"cannot parse OTLP/JSON: {type(exc).__name__}", os.getpid())


class JsonParser:
    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._pending = threading.BoundedSemaphore(4 * workers)
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None  # started on the first JSON body
        self.pids: set[int] = set()  # workers that parsed something (tests, logs); bounded by restarts
        self.restarts = 0

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("forkserver")
                # the server process imports only the parser (the default, ``__main__``, would re-run a script
                # without a main guard); it takes effect when the first forkserver starts
                ctx.set_forkserver_preload(["otel_llm.otlp.json_codec"])
                self._pool = ProcessPoolExecutor(self._workers, mp_context=ctx)
            return self._pool

    def parse(self, body: bytes) -> ParsedJson:
        if not self._pending.acquire(blocking=False):
            raise JsonWorkersBusy("too many OTLP/JSON bodies being parsed; retry later")
        try:
            pool = self._executor()
            try:
                done = pool.submit(parse_in_worker, body).result(PARSE_TIMEOUT_S)
            except BrokenProcessPool:
                self._replace(pool)
                return ParsedJson(None, "cannot parse OTLP/JSON: the parsing process died", -1)
            if len(self.pids) < 64:
                self.pids.add(done.pid)
            return done
        finally:
            self._pending.release()

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
                self.restarts += 1
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
