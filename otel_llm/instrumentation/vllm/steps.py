"""Engine steps as vLLM's scheduler sees them, shipped to the frontend that owns the requests.

The scheduler lives in the EngineCore process (its own process by default, or the
caller's with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Our ``vllm.general_plugins`` entry
point installs two hooks there: ``Scheduler.schedule`` (batch composition, captured
at schedule time, as vLLM's maintainers advise for async scheduling) and
``Scheduler.update_from_output`` (the step's end: the same stamp vLLM gives its
outputs). Each step becomes one small record:

* in-process, handed straight to the frontend's ``Telemetry``;
* across processes, one datagram per frontend on Unix sockets in a directory that the
  first frontend created and named in ``OTEL_LLM_STEP_DIR`` before the engine was spawned.
  Every frontend process that builds an engine client binds ``<dir>/<pid>.sock`` there:
  with ``vllm serve --api-server-count N`` the N API server processes share one EngineCore
  and each gets every step (each keeps the shares of its own requests). Sends never block:
  if a frontend lags and its socket buffer is full, the record is dropped and counted.

The datagram is sent before the step's outputs leave the EngineCore, so the frontend
always holds a step's record before it sees the step's tokens.
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import logging
import os
import pickle
import socket
import tempfile
import time
from typing import Any, Callable

from ...core.guard import GUARD
from ...core.timeline import (BLOCKED_KV_CACHE, BLOCKED_MAX_SEQS, BLOCKED_NONE, BLOCKED_OTHER,
                               BLOCKED_TOKEN_BUDGET, StepRecord)
from ..wraps import Target, WrapTable

STEP_DIR_ENV = "OTEL_LLM_STEP_DIR"
logger = logging.getLogger("otel_llm")

_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"


class SocketSink:
    """EngineCore side: one non-blocking datagram per step to each frontend socket in ``directory``."""

    RESCAN_S = 1.0  # API servers start after the engine: look for new frontends this often

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.dropped = 0
        self._targets: list[str] = []
        self._scanned = float("-inf")

    def __call__(self, payload: tuple) -> None:
        now = time.monotonic()
        if now - self._scanned > self.RESCAN_S:
            self._rescan(now)
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        for path in self._targets:
            try:
                self.sock.sendto(data, path)
            except (ConnectionRefusedError, FileNotFoundError):
                self.dropped += 1  # that frontend is gone: forget it (and its stale socket file)
                self._forget(path)
            except OSError:
                self.dropped += 1  # lagging (buffer full) or otherwise unreachable: telemetry is what we lose

    def _rescan(self, now: float) -> None:
        self._scanned = now
        try:
            self._targets = [os.path.join(self.directory, f) for f in sorted(os.listdir(self.directory))
                             if f.endswith(".sock")]
        except OSError:
            self._targets = []

    def _forget(self, path: str) -> None:
        self._targets = [p for p in self._targets if p != path]
        try:
            os.unlink(path)
        except OSError:
            pass


class StepReceiver:
    """Frontend side: this process's socket in the step directory, drained before each batch of
    outputs is processed."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, f"{os.getpid()}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            pass
        try:
            os.unlink(self.path)  # a stale one of a dead process that had our pid
        except OSError:
            pass
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.malformed = 0

    def drain(self, deliver: Callable[[StepRecord], None]) -> None:
        recv = self.sock.recv
        while True:
            try:
                data = recv(1 << 20)
            except (BlockingIOError, OSError):
                return
            try:
                deliver(decode(pickle.loads(data)))
            except Exception as exc:
                self.malformed += 1
                GUARD.failed("step record", exc)

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def decode(payload: tuple) -> StepRecord:
    step_id, start, end, running, waiting, preempted, kv, shares, blocked = payload
    return StepRecord(step_id, start, end, shares, running, waiting, preempted, kv, queue_blocked=blocked)


_dir: str | None = None
_receiver: StepReceiver | None = None


def step_dir() -> str:
    """This process's step directory, named in ``OTEL_LLM_STEP_DIR`` for the EngineCores it spawns.

    An API server process vLLM spawned (``ApiServer_<n>``) joins the directory of the process that
    spawned it, and with it that process's EngineCore; any other process makes its own (an inherited
    variable there names some parent's, e.g. the test process that started a server)."""
    global _dir
    if _dir is None:
        inherited = os.environ.get(STEP_DIR_ENV)
        if inherited and in_api_server_process() and os.path.isdir(inherited):
            _dir = inherited
        else:
            _dir = tempfile.mkdtemp(prefix="otel-llm-steps-")
            os.environ[STEP_DIR_ENV] = _dir
            atexit.register(_remove_if_empty, _dir)
    return _dir


def shared_receiver() -> StepReceiver:
    """The process's one receiver, bound when it builds an engine client. It outlives
    instrument/uninstrument cycles because an EngineCore spawned earlier keeps sending to it."""
    global _receiver
    if _receiver is None:
        _receiver = StepReceiver(step_dir())
        atexit.register(_receiver.close)
    return _receiver


def current_receiver() -> StepReceiver | None:
    return _receiver


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # sockets of other frontends still in it: the last one out removes it, or the OS's tmp cleanup


# -- the scheduler hooks (whichever process the scheduler runs in) ---------------------------

_sink: Callable[[tuple], None] | None = None
_pending: dict[int, tuple] = {}
_counter = itertools.count(1)
_prefix = 0


def set_sink(sink: Callable[[tuple], None] | None) -> None:
    global _sink, _prefix
    _sink = sink
    _prefix = os.getpid() << 32  # step ids stay unique when several engines report to one frontend
    if sink is not None:
        _HOOKS.wrap()


def _schedule(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _sink is None:
        return wrapped(*args, **kwargs)
    start = time.monotonic()
    out = wrapped(*args, **kwargs)
    try:
        requests = instance.requests
        shares = []
        for req_id, n in out.num_scheduled_tokens.items():
            req = requests.get(req_id)
            if req is None:
                continue
            # num_computed_tokens has already advanced by this step's n. A request is
            # prefilling until its prompt is computed (it has no output yet), or, when it
            # recomputes after a preemption, until all but its last sampled token are.
            before = req.num_computed_tokens - n
            todo = req.num_tokens - 1 if req.num_output_tokens else req.num_tokens
            shares.append((req_id, n, before < todo))
        preempted = getattr(out, "preempted_req_ids", None)
        kv = instance.kv_cache_manager.usage
        if len(_pending) > 64:  # update_from_output never came (engine error): don't grow
            _pending.clear()
        running, waiting, n_preempted = len(instance.running), len(instance.waiting), len(preempted) if preempted else 0
        _pending[id(out)] = (start, running, waiting, n_preempted, float(kv), shares,
                             _queue_blocked(instance, out, running, waiting, n_preempted) if waiting else BLOCKED_NONE)
    except Exception as exc:
        GUARD.failed("scheduler.schedule hook", exc)
    return out


def _queue_blocked(scheduler: Any, out: Any, running: int, waiting: int, preempted: int) -> int:
    """Why requests stayed waiting after this ``schedule()``: the first limit its admission loop hits
    (vLLM 0.32 ``Scheduler.schedule``), read from the scheduler's state right after it ran."""
    if preempted:
        return BLOCKED_KV_CACHE  # a step that preempts admits nobody: the running requests outgrew the KV cache
    if running >= getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs):
        return BLOCKED_MAX_SEQS
    if out.total_num_scheduled_tokens >= scheduler.max_num_scheduled_tokens:
        return BLOCKED_TOKEN_BUDGET
    try:
        head = scheduler.waiting.peek_request()
        # admission needs the head's whole remaining sequence in free blocks (scheduler_reserve_full_isl)
        need = -(-(head.num_tokens - head.num_computed_tokens) // scheduler.block_size)
        if need > scheduler.kv_cache_manager.block_pool.get_num_free_blocks():
            return BLOCKED_KV_CACHE
    except (AttributeError, IndexError):  # another vLLM's internals: the step record is worth more than this
        pass
    return BLOCKED_OTHER  # a limit we do not model (LoRA slots, remote KV, grammar, encoder budget)


def _update_from_output(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _sink is None:
        return wrapped(*args, **kwargs)
    result = wrapped(*args, **kwargs)
    try:
        scheduler_output = kwargs.get("scheduler_output", args[0] if args else None)
        pending = _pending.pop(id(scheduler_output), None)
        if pending is not None and pending[5]:
            start, running, waiting, preempted, kv, shares, blocked = pending
            end = next((o.timestamp for o in result.values()), None) if result else None
            _sink((_prefix | next(_counter), start, end if end else time.monotonic(),
                   running, waiting, preempted, kv, shares, blocked))
    except Exception as exc:
        GUARD.failed("scheduler.update_from_output hook", exc)
    return result


_HOOKS = WrapTable([
    Target(_SCHEDULER_MODULE, "Scheduler.schedule", _schedule),
    Target(_SCHEDULER_MODULE, "Scheduler.update_from_output", _update_from_output),
])


def remove_hooks() -> None:
    global _sink
    _sink = None
    _HOOKS.unwrap()
    _pending.clear()


def in_api_server_process() -> bool:
    """Whether this is one of the API server processes of ``vllm serve --api-server-count N``."""
    return multiprocessing.current_process().name.startswith("ApiServer")


def in_engine_process() -> bool:
    """Whether this is an EngineCore process vLLM spawned (``EngineCore``, ``EngineCore_DP<n>``)."""
    return multiprocessing.current_process().name.startswith("EngineCore")


def plugin() -> None:
    """``vllm.general_plugins`` entry point: runs in every vLLM process, first thing in EngineCore.

    Only a spawned EngineCore reports, to the frontends of the directory it inherited. A
    frontend, and an engine running inside it, is fed by ``instrument()`` directly.
    """
    directory = os.environ.get(STEP_DIR_ENV)
    if not directory or not in_engine_process():
        return
    try:
        set_sink(SocketSink(directory))
    except Exception as exc:
        GUARD.failed("vllm plugin", exc)
