"""One exit hook per owner, closing what it owns stage by stage; uninstrument undoes what instrument added."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from otel_llm.guard import Guard
from otel_llm.lifecycle import DIRECTORIES, PROVIDERS, SOCKETS, TELEMETRY, Lifecycle


def test_closers_run_stage_by_stage_in_the_order_added_and_one_failing_leaves_the_others():
    closed: list[str] = []
    guard = Guard()
    owned = Lifecycle(guard)
    owned.add("directory", lambda: closed.append("directory"), DIRECTORIES)
    owned.add("socket", lambda: closed.append("socket"), SOCKETS)
    owned.add("tracer provider", lambda: closed.append("tracer provider"), PROVIDERS)
    owned.add("broken", lambda: 1 / 0, PROVIDERS)
    owned.add("meter provider", lambda: closed.append("meter provider"), PROVIDERS)
    owned.add("telemetry", lambda: closed.append("telemetry"), TELEMETRY)
    owned.close_all()
    assert closed == ["telemetry", "tracer provider", "meter provider", "socket", "directory"]
    assert guard.errors == {"closing broken": 1}  # counted in the owner's guard
    owned.close_all()  # nothing left: nothing closes twice
    assert len(closed) == 5


def test_closing_or_discarding_by_name():
    closed: list[str] = []
    owned = Lifecycle(Guard())
    owned.add("telemetry", lambda: closed.append("telemetry"), TELEMETRY)
    owned.add("provider", lambda: closed.append("provider"), PROVIDERS)
    owned.discard("telemetry")
    assert "telemetry" not in owned and "provider" in owned
    owned.close("provider")
    owned.close("provider")  # closed once
    assert closed == ["provider"]
    with pytest.raises(ValueError):
        owned.add("x", lambda: None, 7)


def test_one_exit_hook_closes_what_is_left_and_what_was_closed_before_exit_stays_closed():
    code = textwrap.dedent("""
        from otel_llm.guard import Guard
        from otel_llm.lifecycle import PROVIDERS, SOCKETS, TELEMETRY, Lifecycle
        owned = Lifecycle(Guard())
        owned.add("socket", lambda: print("socket"), SOCKETS)
        owned.add("provider", lambda: print("provider"), PROVIDERS)
        owned.add("telemetry", lambda: print("telemetry"), TELEMETRY)
        done = Lifecycle(Guard())
        done.add("early", lambda: print("early"), TELEMETRY)
        done.close_all()
        print("exit")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["early", "exit", "telemetry", "provider", "socket"]


def test_the_instrumentor_owns_the_providers_it_built_and_uninstrument_closes_them(monkeypatch):
    """No provider given and none global: it builds its own from OTEL_* (with no exit hook of their own),
    shut down at uninstrument after the telemetry was closed; its exit hook goes with them."""
    pytest.importorskip("vllm")
    from opentelemetry.sdk.trace import SpanProcessor

    from otel_llm.core.providers import METER_PROVIDER, TRACER_PROVIDER
    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    class Told(SpanProcessor):
        shut = False

        def shutdown(self) -> None:
            self.shut = True

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    inst = VLLMInstrumentor()
    assert not inst.is_instrumented_by_opentelemetry
    inst.instrument(engine_steps=False)
    try:
        owned = inst.runtime.lifecycle
        assert TRACER_PROVIDER in owned and METER_PROVIDER in owned and "telemetry" in owned
        tracer_provider = owned._closers[TRACER_PROVIDER][1].provider
        meter_provider = owned._closers[METER_PROVIDER][1].provider
        told = Told()
        tracer_provider.add_span_processor(told)
        assert tracer_provider._atexit_handler is None and meter_provider._atexit_handler is None
    finally:
        inst.uninstrument()
    assert told.shut and meter_provider._shutdown
    # left for the exit hook: only what the process keeps across instrumentations (an earlier one's sockets)
    assert set(owned._closers) <= {"step directory", "step receiver", "kv hand-off receiver"}


def test_the_vllm_runtime_outlives_each_instrumentation_and_the_class_holds_no_state(monkeypatch):
    """Two objects of two lifetimes: the process's runtime (made once, kept across cycles) and one
    instrumentation per instrument() (gone with uninstrument, its exit work with it); the instrumentor's
    class holds methods and properties only."""
    pytest.importorskip("vllm")
    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    state = [name for name, value in vars(VLLMInstrumentor).items()
             if not name.startswith("__") and not callable(value) and not hasattr(value, "__get__")]
    assert set(state) <= {"_instance", "_abc_impl"}  # BaseInstrumentor's singleton, the ABC machinery
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    inst = VLLMInstrumentor()
    if inst.is_instrumented_by_opentelemetry:
        pytest.skip("instrumented by another test")
    inst.instrument(engine_steps=False, sample_rate=0.5)
    try:
        runtime, first, pipeline = inst.runtime, inst.instrumentation, inst.telemetry
        assert first.runtime is runtime and first.telemetry is pipeline and pipeline.config.sample_rate == 0.5
        assert "telemetry" in runtime.lifecycle
        assert inst.agent is runtime.agent is None  # (otel_llm.stats() reads the agent's errors through it)
    finally:
        inst.uninstrument()
    assert inst.instrumentation is None and inst.telemetry is None and "telemetry" not in runtime.lifecycle
    inst.instrument(engine_steps=False, sample_rate=0.25)
    try:
        assert inst.runtime is runtime and inst.instrumentation is not first
        assert inst.telemetry is not pipeline and inst.telemetry.config.sample_rate == 0.25
        assert inst.instrumentation.table.targets[0].wrapper.__self__ is inst.instrumentation.wrappers
        assert inst.instrumentation.wrappers is not first.wrappers
    finally:
        inst.uninstrument()
