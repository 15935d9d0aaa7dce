"""Errors caught in a spawned EngineCore, counted where the user looks: the frontend's ``otel_llm.stats()``.

Our hooks in the EngineCore catch their own errors (the guard of the plugin's ``EngineSide``) so that vLLM
runs on; but that process's counts are invisible to the frontend, and a step whose hook failed sends no step
record, so the loss would be silent. The EngineCore therefore sends a **control record** on the step socket
whenever its counts change (at most every ``ErrorReporter.MIN_INTERVAL_S``; a change held back is sent at
the next record or the sink's once-a-second rescan): its pid and its cumulative count per site, JSON after
one marker byte that no step record starts with (step_wire's first byte is its version, a small number). The frontend
(``ErrorRelay``) adds each site's increase to its instrumentor's guard as ``EngineCore: <site>``, so it
shows in ``otel_llm.stats()["errors"]`` and the ``otel_llm.errors`` counter. JSON, never pickle: a
frontend executes nothing that arrives on its socket; an unreadable control record is counted as malformed.

vLLM **worker** processes (the multiprocess executor's ``VllmWorker-<rank>``: tensor parallelism, or
``distributed_executor_backend="mp"``, which the CPU build runs with one worker too) host the model-runner
timer (model_timing.py) and the KV connector's worker side (kv_connector.py). Their errors take a channel of
their own (``WorkerErrors``): the same control record, marked ``"role": "worker"``, sent from a socket of
the worker's to every frontend socket in the inherited step directory, whenever the worker's guard
counts an error (``Guard.listeners``; a change held back by the interval is sent by a one-shot timer).
The frontend counts them as ``vLLM worker: <site>`` and warns once per site. A worker also checks the
contract's worker-side entries as their modules are imported (the frontend does not import the model
runner): a missing one is relayed too, as ``vLLM worker: vllm contract: <symbol>``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from ...guard import Guard

logger = logging.getLogger("otel_llm")

CONTROL = 0xC0  # the first byte of a control record (step records start with step_wire.VERSION)
MAX_SITES = 64  # sites per record, and per EngineCore in the frontend: bounded whatever a sender says
MAX_SITE_LEN = 200
# the EngineCore's own contract check: the frontend checks the same installation itself (contract.py)
_NOT_RELAYED = "vllm contract"
PREFIX = "EngineCore: "
WORKER = "worker"  # a control record's role: a vLLM worker process (else an EngineCore)
WORKER_PREFIX = "vLLM worker: "
_RELAYED = (PREFIX, WORKER_PREFIX)


def encode(pid: int, errors: dict[str, int], role: str | None = None, contract: bool = False) -> bytes:
    """A control record: ``pid``'s cumulative count per site (``contract``: the contract's sites too)."""
    sites = {k[:MAX_SITE_LEN]: int(v) for k, v in list(errors.items())[:MAX_SITES]
             if contract or not k.startswith(_NOT_RELAYED)}
    record: dict = {"pid": pid, "errors": sites}
    if role is not None:
        record["role"] = role
    return bytes((CONTROL,)) + json.dumps(record).encode()


class ErrorReporter:
    """EngineCore side: sends the error counts of ``guard`` (the EngineSide's) through ``send`` when they changed."""

    MIN_INTERVAL_S = 0.5

    def __init__(self, send: Callable[[bytes], None], clock: Callable[[], float] = time.monotonic,
                 role: str | None = None, later: Callable[[float, Callable[[], None]], None] | None = None,
                 guard: Guard | None = None) -> None:
        self.send = send
        self.guard = guard if guard is not None else Guard()
        self.clock = clock
        self.role = role  # None: an EngineCore's; WORKER: a worker's (its contract sites relayed too)
        self.later = later  # where nothing rescans (a worker): calls ``changed`` again after a delay
        self.sent: dict[str, int] = {}
        self.last = float("-inf")
        self._pending = False

    def changed(self) -> None:
        """Called after an error was caught (and at the sink's rescans): send if due."""
        contract = self.role == WORKER
        # this process's own sites: never ones relayed to it (a process that is both, or a test's shared guard)
        errors = {k: v for k, v in self.guard.errors.items()
                  if (contract or not k.startswith(_NOT_RELAYED)) and not k.startswith(_RELAYED)}
        if errors == self.sent:
            return
        now = self.clock()
        if now - self.last < self.MIN_INTERVAL_S:
            # held back: the next error after the interval or the next rescan sends it (or, in a worker, a timer)
            if self.later is not None and not self._pending:
                self._pending = True
                self.later(self.MIN_INTERVAL_S - (now - self.last), self._flush)
            return
        self.last = now
        try:
            self.send(encode(os.getpid(), errors, self.role, contract))
            self.sent = errors
        except Exception:  # the frontend may be gone; nothing here may reach vLLM
            pass

    def _flush(self) -> None:
        self._pending = False
        try:
            self.changed()
        except Exception:
            pass


def _timer(delay: float, call: Callable[[], None]) -> None:
    t = threading.Timer(max(delay, 0.0), call)
    t.daemon = True  # never keeps a worker from exiting
    t.start()


class WorkerErrors:
    """A vLLM worker's channel to the frontends: control records from a socket of its own to every
    ``*.sock`` in the step directory (rare: only when its error counts change), found afresh each time."""

    def __init__(self, directory: str, guard: Guard) -> None:
        self.directory = directory
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.dropped = 0
        self.reporter = ErrorReporter(self.send, role=WORKER, later=_timer, guard=guard)
        self.fence: Any = None  # the worker's contract (contract.Contract), shared by our hooks in this process

    def send(self, data: bytes) -> None:
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return
        for name in names:
            if name.endswith(".sock"):
                try:
                    self.sock.sendto(data, os.path.join(self.directory, name))
                except OSError:
                    self.dropped += 1  # a frontend gone or lagging: a count we lose, never an error

    def close(self) -> None:
        self.sock.close()


def worker_errors(directory: str, guard: Guard) -> WorkerErrors:
    """A worker process's channel, listening to ``guard`` (the plugin's ``EngineSide``'s, which makes it
    once a process and holds it), with the contract's worker-side entries checked as their modules are imported."""
    errors = WorkerErrors(directory, guard)
    guard.listeners.append(errors.reporter.changed)
    errors.fence = _check_worker_side(errors.reporter, guard)
    return errors


def _check_worker_side(reporter: ErrorReporter, guard: Guard) -> Any:
    import wrapt

    from . import contract

    fence = contract.Contract(guard=guard)

    def check(name: str) -> None:
        fence.check_module(name)
        reporter.changed()  # a missing symbol is counted in the guard by the contract, not through failed()

    for name in dict.fromkeys(e.module for e in contract.ENTRIES if e.side == contract.WORKER):
        wrapt.register_post_import_hook(lambda _m, name=name: check(name), name)
    return fence


class ErrorRelay:
    """Frontend side: each EngineCore's (and worker's) cumulative counts, their increases added to
    ``guard.errors`` (the instrumentor's); a worker's new site is also said once in this log (its own log may
    be far away)."""

    MAX_ENGINES = 16

    def __init__(self, guard: Guard | None = None) -> None:
        self.guard = guard if guard is not None else Guard()
        self.seen: dict[int, dict[str, int]] = {}  # EngineCore pid -> the counts it last reported

    def take(self, data: bytes) -> None:
        """A control record (raises ValueError on a malformed one: the receiver counts it)."""
        record = json.loads(data[1:].decode())
        pid, errors = int(record["pid"]), record["errors"]
        if not isinstance(errors, dict):
            raise ValueError("control record without an errors map")
        worker = record.get("role") == WORKER
        prefix = WORKER_PREFIX if worker else PREFIX
        before = self.seen.get(pid)
        if before is None:
            while len(self.seen) >= self.MAX_ENGINES:
                self.seen.pop(next(iter(self.seen)))
            before = {}
        now = {}
        for site, count in list(errors.items())[:MAX_SITES]:
            site, count = str(site)[:MAX_SITE_LEN], int(count)
            now[site] = count
            if count > before.get(site, 0):
                if worker:
                    self.guard.warn_once(prefix + site, "otel-llm: %s error(s) at %s in vLLM worker process %d "
                                         "(its log has the first one's traceback; further ones are counted in "
                                         "stats())", count, site, pid)
                self.guard.errors[prefix + site] += count - before.get(site, 0)
        self.seen[pid] = now
