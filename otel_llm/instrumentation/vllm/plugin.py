"""The ``vllm.general_plugins`` entry point: what we arm in the processes vLLM spawns.

vLLM calls the plugin once per process, with nothing to hand back: there is no instrumentor in a
spawned EngineCore or worker. The plugin creates one ``EngineSide`` there, which owns everything it
arms for the life of that process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ...guard import Guard
from . import kv_channel, request_hooks
from .engine_errors import ErrorReporter, WorkerErrors, worker_errors
from .kv_connector import ConnectorWrapper
from .model_timing import ModelTimer
from .process_roles import in_engine_process, in_worker_process
from .step_hooks import StepHooks
from .step_transport import STEP_DIR_ENV, SocketSink


class EngineSide:
    """What a spawned EngineCore (or a multiprocess executor's worker) reports, and through what:

    * in the EngineCore: the scheduler hooks (``hooks``); where no Python frontend holds the requests (the
      Rust frontend, headless), the request hooks (``requests``: each request's start and finish); the sink that carries each step's record to
      the frontends of ``directory`` (``sink``, which carries the EngineCore's error counts too), and
      the KV connectors' scheduler side, whose hand-off records go to the same frontends;
    * in a worker, where the model runs: the model runner's timing (``timer``) and the connectors'
      worker side, whose figures ride on each step's output.

    Nothing here needs an exit hook: the process's sockets and shared memory go with it. ``guard`` counts
    the errors of everything it armed; they reach the frontends' stats() (engine_errors.py)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.guard = Guard()
        self.hooks: StepHooks | None = None
        self.requests: request_hooks.RequestHooks | None = None  # where it is its requests' source
        self.sink: SocketSink | None = None
        self.timer: ModelTimer | None = None
        self.connectors: ConnectorWrapper | None = None
        self.errors: WorkerErrors | None = None  # a worker's channel for its error counts
        self.fence: Any = None  # a worker's contract, checked as vLLM's worker modules are imported

    def arm_engine(self) -> None:
        try:
            self.hooks = hooks = StepHooks(guard=self.guard)
            self.sink = sink = SocketSink(self.directory, self.guard)
            # errors caught here reach the frontends' stats() (engine_errors.py)
            reporter = ErrorReporter(sink.send_control, guard=self.guard)
            hooks.on_error = sink.on_rescan = reporter.changed
            # the bound method: calling it skips the instance-call slot lookup, once a step
            hooks.arm(sink.__call__)
            hooks.on_idle = sink.idle  # what a full datagram socket held back goes before the engine waits
            if request_hooks.wanted():  # this EngineCore says its requests (request_hooks.py)
                self.requests = request_hooks.RequestHooks(sink.send_request, self.guard, clock=hooks.clock,
                                                           flush=sink.flush_requests)
                self.requests.arm()
        except Exception as exc:
            self.guard.failed("vllm plugin", exc)
        self._arm_connectors(kv_channel.HandoffSink(self.directory, time.monotonic))

    def arm_worker(self) -> None:
        try:
            # its errors reach the frontends' stats() (engine_errors.py); one contract for the process
            self.errors = worker_errors(self.directory, self.guard)
            self.fence = self.errors.fence
            self.timer = timer = ModelTimer(self.guard)
            timer.enable()
        except Exception as exc:
            self.guard.failed("vllm plugin", exc)
        self._arm_connectors(None, self.fence)

    def _arm_connectors(self, sink: kv_channel.HandoffSink | None, fence: Any = None) -> None:
        try:
            self.connectors = ConnectorWrapper(sink, spawned=True, fence=fence, guard=self.guard)
            self.connectors.arm()
        except Exception as exc:
            self.guard.failed("vllm kv connector plugin", exc)


def plugin() -> None:
    """Runs in every vLLM process, first thing in EngineCore.

    Only a spawned EngineCore, or its workers, report: to the frontends of the directory they
    inherited. A frontend, and an engine running inside it, is fed by ``instrument()`` directly.
    """
    global _engine_side
    directory = os.environ.get(STEP_DIR_ENV)
    if not directory or _engine_side is not None:
        return
    side = EngineSide(directory)  # kept only where it arms something; its guard counts what goes wrong here
    try:
        if in_engine_process():
            _engine_side = side
            side.arm_engine()
        elif in_worker_process():
            _engine_side = side
            side.arm_worker()
    except Exception as exc:
        side.guard.failed("vllm plugin", exc)


def engine_side() -> EngineSide | None:
    """The object the plugin made in this process, if any (``otel_llm.stats()`` adds its guard's errors)."""
    return _engine_side


# The one object the plugin made in this process (vLLM keeps no reference to what a plugin returns).
_engine_side: EngineSide | None = None
