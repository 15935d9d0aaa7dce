"""The model runner's time for each engine step: forward + sampling, timed where the model runs.

The model runner runs in the EngineCore process (UniProcExecutor) or in worker processes
(MultiprocExecutor: vLLM's default on CPU, and with tensor parallelism). Either way the time of a
step's forward + sampling is attached to the ModelRunnerOutput it returns, as one attribute
(``MODEL_TIME_ATTR``): the object is pickled to the EngineCore (its __dict__ travels with it) and
handed to ``update_from_output``, where the step record picks it up (step_hooks.py). An asynchronous
output (vLLM's async scheduling) is resolved later: in-process its time waits in ``model`` under the
step's key. CUDA events on a GPU, wall time on CPU.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ...guard import Guard
from ..wraps import Target, WrapTable
from .worker_facts import WORKER_FACTS_ATTR, WorkerFacts

MODEL_TIME_ATTR = "_otel_llm_model_s"
_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"  # the CPU model runner inherits both methods


class ModelTimer:
    """The model-runner hooks of one owner (the EngineCore's ``StepHooks``, or the plugin in a
    multiprocess executor's worker), with the times they keep until the step's output is handed on."""

    __slots__ = ("timing", "in_engine", "model", "current_model_step", "cuda_events", "event_pool", "clock",
                 "facts", "_table", "guard")

    def __init__(self, guard: Guard | None = None) -> None:
        self.guard = guard = guard if guard is not None else Guard()  # its owner's (alone, as in tests: its own)
        self.timing = False  # the runner hooks on: in the EngineCore (with a sink) or in a worker (plugin)
        self.in_engine = False  # timing for the EngineCore's own step hooks (else for a worker process)
        self.model: dict[int, Any] = {}  # id(scheduler_output) -> seconds (CPU) or [(start, end) CUDA events]
        self.current_model_step = 0  # id of the scheduler output whose forward ran last (sample_tokens follows)
        self.cuda_events: Any = None  # torch.cuda.Event once a CUDA model runner was seen; False: CPU
        self.event_pool: list[Any] = []  # read CUDA events, reused (creating them costs more than recording)
        self.clock: Callable[[], float] = time.monotonic
        # LoRA adapter loads and the drafter's time, hung on the step's output with the model time
        self.facts = WorkerFacts(guard)
        self._table = WrapTable([
            # plain: called on every step, wrapt's call costs more (wraps.Target)
            Target(_RUNNER_MODULE, "GPUModelRunner.execute_model", self.execute_model, plain=True),
            Target(_RUNNER_MODULE, "GPUModelRunner.sample_tokens", self.sample_tokens, plain=True),
        ], guard)

    def enable(self, in_engine: bool = False) -> None:
        """Time the model runner in this process: for the EngineCore's step hooks (``in_engine``), or in a
        vLLM worker process."""
        self.timing = True
        self.in_engine = in_engine
        self.cuda_events = None  # decided again at the next model runner's first call (a new engine may differ)
        self._table.wrap()
        self.facts.arm()

    def disable(self) -> None:
        self.timing = False
        self._table.unwrap()
        self.facts.disarm()
        self.model.clear()

    def execute_model(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return self._time_model(False, wrapped, instance, args, kwargs)

    def sample_tokens(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return self._time_model(True, wrapped, instance, args, kwargs)

    def _time_model(self, sample: bool, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if not self.timing:
            return wrapped(*args, **kwargs)
        if self.cuda_events is None:
            self._pick_timer(instance)
            if not self.timing:
                return wrapped(*args, **kwargs)
        model = self.model
        if sample:
            key = self.current_model_step
        else:
            key = self.current_model_step = id(args[0] if args else kwargs.get("scheduler_output"))
            if len(model) > 64:  # outputs that never reached update_from_output (errors): don't grow
                model.clear()
        if self.cuda_events:
            out = self._time_cuda(key, wrapped, args, kwargs)
        else:
            clock = self.clock
            t = clock()
            try:
                out = wrapped(*args, **kwargs)
            finally:
                spent = clock() - t
                model[key] = model.get(key, 0.0) + spent
        if out is None:
            return out
        try:
            if getattr(out, "req_ids", None) and hasattr(out, "__dict__"):
                spent = model.pop(key, None)  # a ModelRunnerOutput with requests: this step's, done
                if spent is not None and spent.__class__ is not float:
                    spent = self.cuda_seconds(spent)
                if spent is not None:
                    setattr(out, MODEL_TIME_ATTR, spent)
                if self.facts.pending:  # an adapter loaded, the drafter ran: this step's
                    setattr(out, WORKER_FACTS_ATTR, self.facts.take_plain())
        except Exception as exc:
            self.guard.failed("model runner timer", exc)
        return out

    def _pick_timer(self, runner: Any) -> None:
        """CUDA events where the runner's device is a CUDA device, wall time otherwise; decided once.
        A CPU model runner in the EngineCore's own thread (UniProcExecutor) is not timed: the step's
        execute time is the same wall time there, and the EngineCore's loop is spared the timers."""
        try:
            device = getattr(runner, "device", None)
            if getattr(device, "type", None) == "cuda":
                import torch
                self.cuda_events = torch.cuda.Event
            else:
                self.cuda_events = False
                if self.in_engine:
                    self.timing = False
        except Exception as exc:
            self.cuda_events = False
            self.guard.failed("model timer", exc)

    def _time_cuda(self, key: int, wrapped: Any, args: tuple, kwargs: dict) -> Any:
        """Events on the current stream around the call: the device's time for it. They are read once
        the step's sampled tokens reached the host (a synchronising copy), so reading never waits."""
        pool, make = self.event_pool, self.cuda_events
        begin = pool.pop() if pool else make(enable_timing=True)
        begin.record()
        try:
            return wrapped(*args, **kwargs)
        finally:
            finish = pool.pop() if pool else make(enable_timing=True)
            finish.record()
            events = self.model.get(key)
            if events is None or events.__class__ is float:
                self.model[key] = events = []
            events.append((begin, finish))

    def cuda_seconds(self, events: list) -> float | None:
        total = 0.0
        for begin, finish in events:
            if not finish.query():  # not done yet: report nothing rather than wait (and drop these events)
                return None
            total += begin.elapsed_time(finish) / 1e3
        if len(self.event_pool) < 64:  # read: reusable
            for pair in events:
                self.event_pool.extend(pair)
        return total
