"""The guard: our errors counted and the once-only warnings given, per owner. A guard is an instance its
owner holds (each instrumentor; the vLLM plugin's EngineSide in a process vLLM spawned), never module state;
``otel_llm.stats()`` sums the owners' guards."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

import otel_llm
import otel_llm.guard
from otel_llm.guard import Guard, total

PACKAGE = Path(otel_llm.__file__).resolve().parent


def test_a_warning_is_given_once_per_key_and_guards_keep_their_own(caplog):
    guard, other = Guard(), Guard()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        assert guard.warn_once("feature", "otel-llm: %s is off", "feature")
        assert not guard.warn_once("feature", "otel-llm: %s is off", "feature")
        assert guard.warn_once("another", "otel-llm: another is off")
        assert other.warn_once("feature", "otel-llm: %s is off", "feature")  # its own record of what it told
    assert [r.getMessage() for r in caplog.records] == ["otel-llm: feature is off", "otel-llm: another is off",
                                                        "otel-llm: feature is off"]


def _guards_built_outside_a_function(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``Guard()`` called in a module's or a class's body (state shared by every owner), not in a function."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return  # made when its owner runs: an instance attribute, a local
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and \
                (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "Guard":
            found.append(f"{path.relative_to(root)}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def test_no_guard_lives_in_a_module_or_a_class():
    assert not [k for k, v in vars(otel_llm.guard).items() if isinstance(v, Guard)]
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the walk sees the package (so the check cannot pass by reading nothing)
    assert [f for path in files for f in _guards_built_outside_a_function(path)] == []


def test_the_reader_finds_a_module_or_class_guard_and_not_a_function_one(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from otel_llm.guard import Guard\nGUARD = Guard()\nclass A:\n    g = Guard()\n"
                       "def f():\n    return Guard()\n", encoding="utf-8")
    assert _guards_built_outside_a_function(planted, tmp_path) == ["planted.py:2", "planted.py:4"]


def test_total_sums_site_by_site():
    a, b = Guard(), Guard()
    a.errors["x"] += 2
    b.errors["x"] += 1
    b.errors["y"] += 4
    assert total([a, b]) == {"x": 3, "y": 4}
    assert total([]) == {}


@pytest.fixture
def owners(monkeypatch):
    """The openai and TensorRT-LLM instrumentors (singletons), each with a fresh guard for this test, seen
    by stats() as installed (neither needs its library to hold a guard or be asked for stats)."""
    from otel_llm.instrumentation.openai import OpenAIInstrumentor
    from otel_llm.instrumentation.tensorrt_llm import TensorRTLLMInstrumentor

    found = otel_llm._available
    monkeypatch.setattr(otel_llm, "_available", lambda p: p in ("openai", "tensorrt_llm") or found(p))
    out = []
    for inst in (OpenAIInstrumentor(), TensorRTLLMInstrumentor()):
        monkeypatch.setitem(inst.__dict__, "guard", Guard())
        out.append(inst)
    return out


def test_two_instrumentors_count_apart_and_stats_sums_them(owners):
    openai_inst, trt_inst = owners
    assert openai_inst.guard is not trt_inst.guard
    assert openai_inst.guard is openai_inst.guard  # made once, kept for the owner's life
    site = "a test site"
    openai_inst.guard.failed(site, RuntimeError("ours"))
    assert trt_inst.guard.errors[site] == 0  # counted by its own owner only
    trt_inst.guard.failed(site, RuntimeError("ours"))
    trt_inst.guard.failed(site, RuntimeError("again"))
    assert openai_inst.guard.errors[site] == 1 and trt_inst.guard.errors[site] == 2
    assert otel_llm.stats()["errors"][site] == 3  # what the user sees: one count per site, as before


def test_stats_adds_the_vllm_plugins_engine_side(owners, monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    from otel_llm.instrumentation.vllm import plugin

    side = plugin.EngineSide(str(tmp_path))  # not armed: only its guard is read
    monkeypatch.setattr(plugin, "_engine_side", side)
    site = "scheduler.schedule hook"
    before = otel_llm.stats()["errors"].get(site, 0)  # the frontend's own, if any
    side.guard.failed(site, RuntimeError("ours"))
    assert plugin.engine_side() is side
    assert otel_llm.stats()["errors"][site] == before + 1


def test_what_an_instrumentor_builds_counts_in_its_guard(owners, monkeypatch):
    """The pipeline, its exit hooks and its wrap table are handed the instrumentor's guard, not one of their own."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from otel_llm.instrumentation import gate

    # TensorRT-LLM is not installed here: let the library gate pass it, as it would where it is
    monkeypatch.setattr(gate, "get_dependency_conflicts", lambda dependencies: None)

    _, trt_inst = owners
    if trt_inst.is_instrumented_by_opentelemetry:
        pytest.skip("instrumented by another test: its pipeline was built with the guard it had then")
    # (nothing of TensorRT-LLM is imported by instrumenting: its wrap tables wait for its modules)
    trt_inst.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider(), skip_dep_check=True)
    try:
        guard = trt_inst.guard
        telemetry = trt_inst.telemetry
        assert telemetry.guard is guard and telemetry.materializer._guard is guard
        assert trt_inst.lifecycle.guard is guard
        assert trt_inst._engine_table.guard is guard and trt_inst._server_table.guard is guard
        assert telemetry.diagnosis.guard is guard
    finally:
        trt_inst.uninstrument()


def test_the_vllm_instrumentor_hands_its_guard_to_what_it_builds(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from otel_llm.instrumentation.vllm import VLLMInstrumentor, step_transport

    inst = VLLMInstrumentor()
    runtime = inst.runtime  # the process's: its sockets outlive every instrumentation
    if inst.is_instrumented_by_opentelemetry or runtime.step_receiver is not None:
        pytest.skip("instrumented by another test")
    # a step directory of this test's (the process's own would be named in the environment)
    monkeypatch.setattr(runtime, "step_directory", step_transport.StepDir(str(tmp_path), made=False))
    inst.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider(), engine_steps=False)
    try:
        guard = inst.guard
        now = inst.instrumentation
        assert inst.telemetry.guard is guard and runtime.fence.guard is guard and runtime.lifecycle.guard is guard
        assert now.table.guard is guard and inst.telemetry.spans._router._guard is guard
        if now.kv_wrapper is not None:
            assert now.kv_wrapper.guard is guard
        monkeypatch.setattr(runtime, "step_receiver", None)  # put back as it was (none) afterwards
        receiver = runtime.open_receiver()  # as an engine client's build opens it
        assert receiver.guard is guard and receiver.engine_errors.guard is guard
        runtime.lifecycle.close("step receiver")
    finally:
        inst.uninstrument()


def test_the_openai_instrumentor_counts_its_errors_on_its_own_meter(owners):
    pytest.importorskip("openai")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from support.metrics import points_by_name

    openai_inst, _ = owners
    if openai_inst.is_instrumented_by_opentelemetry:
        pytest.skip("instrumented by another test: its meter was bound then")
    reader = InMemoryMetricReader()
    openai_inst.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        guard = openai_inst.guard
        assert openai_inst.telemetry.guard is guard and openai_inst.lifecycle.guard is guard
        assert openai_inst._table.guard is guard
        guard.failed("a test site", RuntimeError("ours"))
        (point,) = points_by_name(reader.get_metrics_data())["otel_llm.errors"]
        assert point.value == 1 and dict(point.attributes) == {"otel_llm.site": "a test site"}
    finally:
        openai_inst.uninstrument()
