"""Engine steps as vLLM's scheduler sees them, shipped to the frontend that owns the requests.

The scheduler lives in the EngineCore process (its own process by default, or the
caller's with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Our ``vllm.general_plugins`` entry
point installs two hooks there: ``Scheduler.schedule`` (batch composition, captured
at schedule time, as vLLM's maintainers advise for async scheduling) and
``Scheduler.update_from_output`` (the step's end: the same stamp vLLM gives its
outputs). Each step becomes one small record:

* in-process, handed straight to the frontend's ``Telemetry``;
* across processes, one datagram on a Unix socket that the frontend bound and named in
  ``OTEL_LLM_STEP_SOCKET`` before the engine was spawned. Sends never block: if the
  frontend lags and the socket buffer is full, the record is dropped and counted.

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
from ...core.timeline import StepRecord
from ..wraps import Target, WrapTable

STEP_SOCKET_ENV = "OTEL_LLM_STEP_SOCKET"
logger = logging.getLogger("otel_llm")

_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"


class SocketSink:
    """EngineCore side: one non-blocking datagram per step."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.dropped = 0

    def __call__(self, payload: tuple) -> None:
        try:
            self.sock.sendto(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL), self.path)
        except (BlockingIOError, FileNotFoundError, ConnectionRefusedError, OSError):
            self.dropped += 1  # the frontend is gone or lagging: telemetry is what we lose


class StepReceiver:
    """Frontend side: the bound socket, drained before each batch of outputs is processed."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="otel-llm-")
        self.path = os.path.join(self.dir, "steps.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
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
        for p in (self.path, self.dir):
            try:
                os.unlink(p) if p == self.path else os.rmdir(p)
            except OSError:
                pass


def decode(payload: tuple) -> StepRecord:
    step_id, start, end, running, waiting, preempted, kv, shares = payload
    return StepRecord(step_id, start, end, shares, running, waiting, preempted, kv)


_receiver: StepReceiver | None = None


def shared_receiver() -> StepReceiver:
    """The process's one receiver. It outlives instrument/uninstrument cycles because an
    EngineCore spawned earlier keeps sending to the path it inherited."""
    global _receiver
    if _receiver is None:
        _receiver = StepReceiver()
        os.environ[STEP_SOCKET_ENV] = _receiver.path
        atexit.register(_receiver.close)
    return _receiver


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
        _pending[id(out)] = (start, len(instance.running), len(instance.waiting),
                             len(preempted) if preempted else 0, float(kv), shares)
    except Exception as exc:
        GUARD.failed("scheduler.schedule hook", exc)
    return out


def _update_from_output(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _sink is None:
        return wrapped(*args, **kwargs)
    result = wrapped(*args, **kwargs)
    try:
        scheduler_output = kwargs.get("scheduler_output", args[0] if args else None)
        pending = _pending.pop(id(scheduler_output), None)
        if pending is not None and pending[5]:
            start, running, waiting, preempted, kv, shares = pending
            end = next((o.timestamp for o in result.values()), None) if result else None
            _sink((_prefix | next(_counter), start, end if end else time.monotonic(),
                   running, waiting, preempted, kv, shares))
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


def in_engine_process() -> bool:
    """Whether this is an EngineCore process vLLM spawned (``EngineCore``, ``EngineCore_DP<n>``)."""
    return multiprocessing.current_process().name.startswith("EngineCore")


def plugin() -> None:
    """``vllm.general_plugins`` entry point: runs in every vLLM process, first thing in EngineCore.

    Only a spawned EngineCore reports over the socket its frontend named. A frontend, and an
    engine running inside it, is fed by ``instrument()`` directly; an inherited variable there
    names some *parent's* socket (a server started by an instrumented test, say) and is ignored.
    """
    path = os.environ.get(STEP_SOCKET_ENV)
    if not path or not in_engine_process():
        return
    try:
        set_sink(SocketSink(path))
    except Exception as exc:
        GUARD.failed("vllm plugin", exc)
