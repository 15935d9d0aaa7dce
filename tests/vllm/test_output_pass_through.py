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


def test_only_our_own_wrapper_is_passed_and_restore_hooks_it_again() -> None:
    mod = _processor_module()
    sys.modules[mod.__name__] = mod
    w = _wrappers()
    calls: list = []

    def ours(wrapped, instance, args, kwargs):
        calls.append(args)
        w._pass_through(instance)
        return wrapped(*args, **kwargs)

    table = WrapTable([Target(mod.__name__, "OutputProcessor.process_outputs", ours, plain=True)], Guard())
    try:
        table.wrap()
        p = mod.OutputProcessor()
        assert p.process_outputs(1) == ["vllm", 1] and calls == [(1,)]
        assert p.process_outputs(2) == ["vllm", 2] and calls == [(1,)], "straight to vLLM's after the first"
        w.restore()
        assert "process_outputs" not in vars(p)
        assert p.process_outputs(3) == ["vllm", 3] and calls == [(1,), (3,)]
        assert not w.guard.errors
    finally:
        table.unwrap()
        del sys.modules[mod.__name__]


def test_another_librarys_wrapper_above_ours_keeps_running() -> None:
    mod = _processor_module()
    sys.modules[mod.__name__] = mod
    w = _wrappers()
    calls: list = []

    def ours(wrapped, instance, args, kwargs):
        calls.append(args)
        w._pass_through(instance)
        return wrapped(*args, **kwargs)

    def theirs(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) + ["theirs"]

    table = WrapTable([Target(mod.__name__, "OutputProcessor.process_outputs", ours, plain=True)], Guard())
    try:
        table.wrap()
        wrapt.wrap_function_wrapper(mod.OutputProcessor, "process_outputs", theirs)  # on top of ours
        p = mod.OutputProcessor()
        assert p.process_outputs(1) == ["vllm", 1, "theirs"]
        assert p.process_outputs(2) == ["vllm", 2, "theirs"] and calls == [(1,), (2,)]
        assert "process_outputs" not in vars(p) and not w.guard.errors
    finally:
        table.unwrap()
        del sys.modules[mod.__name__]
