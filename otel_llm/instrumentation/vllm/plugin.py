"""The ``vllm.general_plugins`` entry point: the step hooks in the processes vLLM spawns."""

from __future__ import annotations

import os

from ...guard import GUARD
from .model_timing import ModelTimer
from .process_roles import in_engine_process, in_worker_process
from .engine_errors import ErrorReporter, worker_errors
from .step_hooks import StepHooks
from .step_transport import STEP_DIR_ENV, SocketSink


def plugin() -> None:
    """Runs in every vLLM process, first thing in EngineCore.

    Only a spawned EngineCore reports, to the frontends of the directory it inherited. A
    frontend, and an engine running inside it, is fed by ``instrument()`` directly.
    """
    global _plugin_hooks
    directory = os.environ.get(STEP_DIR_ENV)
    if not directory or _plugin_hooks is not None:
        return
    try:
        if in_engine_process():
            hooks = StepHooks()
            sink = SocketSink(directory)
            # errors caught here reach the frontends' stats() (engine_errors.py)
            reporter = ErrorReporter(sink.send_control)
            hooks.on_error = sink.on_rescan = reporter.changed
            # the bound method: calling it skips the instance-call slot lookup, once a step
            hooks.arm(sink.__call__)
            _plugin_hooks = hooks
        elif in_worker_process():  # the model runs here (multiprocess executor): time it
            worker_errors(directory)  # its errors reach the frontends' stats() (engine_errors.py)
            timer = ModelTimer()
            timer.enable()
            _plugin_hooks = timer
    except Exception as exc:
        GUARD.failed("vllm plugin", exc)


# The plugin's hooks: armed once in a spawned EngineCore or worker, for the life of that process
# (vLLM calls the plugin once per process; there is no instrumentor there to own them).
_plugin_hooks: StepHooks | ModelTimer | None = None
