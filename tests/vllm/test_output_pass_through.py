"""An engine whose agent reads its steps: its output batches go straight to vLLM's ``process_outputs``.

The real engine's case is in test_vllm_agent.py; here, on a stand-in class, what the pass-through may and
may not skip: only our own wrapper, never another library's above it, and ``restore`` hooks it again.
"""

from __future__ import annotations

import sys
import types

import wrapt
from opentelemetry.metrics import NoOpMeter
from opentelemetry.trace import NoOpTracer

from otel_llm.core.config import Config
from otel_llm.core.pipeline import Pipeline
from otel_llm.guard import Guard
from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers
from otel_llm.instrumentation.wraps import Target, WrapTable


def _processor_module() -> types.ModuleType:
    mod = types.ModuleType("otel_llm_test_output_processor")

    class OutputProcessor:
        def process_outputs(self, outputs):
            return ["vllm", outputs]

    mod.OutputProcessor = OutputProcessor
    return mod


def _wrappers() -> VLLMWrappers:
    telemetry = Pipeline(Config.resolve({}, environ={}), NoOpTracer(), NoOpMeter("t"), engine="vllm")
    return VLLMWrappers(telemetry, open_receiver=lambda: None, open_kv_receiver=lambda: None)


class Hooked:
    """A stand-in ``OutputProcessor`` class with our ``process_outputs`` hook on it (a plain method, as the
    instrumentor wraps it), which passes its processor through as the real hook does with an agent."""

    def __init__(self) -> None:
        self.mod = _processor_module()
        self.w = _wrappers()
        self.calls: list = []

        def ours(wrapped, instance, args, kwargs):
            self.calls.append(args)
            self.w._pass_through(instance)
            return wrapped(*args, **kwargs)

        self.table = WrapTable([Target(self.mod.__name__, "OutputProcessor.process_outputs", ours, plain=True)],
                               Guard())

    def __enter__(self) -> "Hooked":
        sys.modules[self.mod.__name__] = self.mod
        self.table.wrap()
        return self

    def __exit__(self, *exc: object) -> None:
        self.table.unwrap()
        del sys.modules[self.mod.__name__]


def test_only_our_own_wrapper_is_passed_and_restore_hooks_it_again() -> None:
    with Hooked() as h:
        p = h.mod.OutputProcessor()
        assert p.process_outputs(1) == ["vllm", 1] and h.calls == [(1,)]
        assert p.process_outputs(2) == ["vllm", 2] and h.calls == [(1,)], "straight to vLLM's after the first"
        h.w.restore()
        assert "process_outputs" not in vars(p)
        assert p.process_outputs(3) == ["vllm", 3] and h.calls == [(1,), (3,)]
        assert not h.w.guard.errors


def test_another_librarys_wrapper_above_ours_keeps_running() -> None:
    def theirs(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) + ["theirs"]

    with Hooked() as h:
        wrapt.wrap_function_wrapper(h.mod.OutputProcessor, "process_outputs", theirs)  # on top of ours
        p = h.mod.OutputProcessor()
        assert p.process_outputs(1) == ["vllm", 1, "theirs"]
        assert p.process_outputs(2) == ["vllm", 2, "theirs"] and h.calls == [(1,), (2,)]
        assert "process_outputs" not in vars(p) and not h.w.guard.errors
