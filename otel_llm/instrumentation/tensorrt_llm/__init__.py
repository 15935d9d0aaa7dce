"""OpenTelemetry instrumentation for TensorRT-LLM's LLM API (both engine flavours) and ``trtllm-serve``.

Built from the public source of TensorRT-LLM release 1.2.1 (``contract.PINNED_RELEASE``) and never run
against a live engine (it needs CUDA and NVIDIA's package index, neither of which the machines it
was written on have): before wrapping, the installed package's signatures are compared with that
release, and on any difference nothing is wrapped (logged once, counted). Registered under the
``opentelemetry_instrumentor`` entry point as ``tensorrt_llm``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Collection

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from ...core.config import Config
from ...guard import GuardOwner
from ...core.pipeline import Pipeline
from ...core.providers import providers_from
from ...lifecycle import TELEMETRY, Lifecycle
from ...otlp.routes import Router
from ...semconv import SCHEMA_URL
from ...version import __version__
from ..gate import LibraryGate
from ..wraps import Target, WrapTable, first_installed
from . import contract
from .contract import LLM_MODULE, RESULT_MODULE, SERVER_MODULE
from .iterations import IterationLedger
from .wrappers import TRTLLMWrappers

__all__ = ["TensorRTLLMInstrumentor"]

_DISTRIBUTIONS = ("tensorrt_llm", "tensorrt-llm")


def installed_distribution() -> str | None:
    return first_installed(_DISTRIBUTIONS)


def _importable(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


class TRTLLMPipeline(Pipeline):
    """The core pipeline, plus the ledger that holds finished requests until their iterations arrive:
    ``flush`` and ``close`` release what it holds first."""

    ledger: IterationLedger

    def flush(self, timeout: float | None = 10.0) -> bool:
        try:
            self.ledger.flush(timeout)
        except Exception as exc:
            self.guard.failed("tensorrt_llm iteration ledger", exc)
        return super().flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.ledger.close(timeout)
        except Exception as exc:
            self.guard.failed("tensorrt_llm iteration ledger", exc)
        super().close(timeout)

    def stats(self) -> dict[str, int]:
        out = super().stats()
        out["iterations_dropped"] = self.ledger.dropped_iterations
        out["requests_released_early"] = self.ledger.released_early
        out["requests_waiting_for_iterations"] = len(self.ledger.waiting)
        out["iteration_stats_dropped"] = self.ledger.stats_dropped
        return out


class TensorRTLLMInstrumentor(LibraryGate, GuardOwner, BaseInstrumentor):  # type: ignore[misc]
    """``guard``: this process's errors of the TensorRT-LLM instrumentation, kept across instrument cycles."""
    telemetry: TRTLLMPipeline | None = None
    # what this instrumentation closes at exit (the telemetry's flush, the providers it built), or at uninstrument
    lifecycle: Lifecycle | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        # No version range: the signature contract (contract.py) is the real gate, a range would only
        # guess. Installed: require that distribution. Not installed but importable (a source checkout on
        # sys.path): nothing to check. Neither: require it, so the launcher's check skips us.
        name = installed_distribution()
        if name:
            return (name,)
        return () if _importable("tensorrt_llm") else ("tensorrt_llm",)

    def _instrument(self, **kwargs: Any) -> None:
        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        config = kwargs.pop("config", None) or Config.resolve(kwargs)
        self.lifecycle = owned = Lifecycle(self.guard)
        tp, mp = providers_from(tracer_provider, meter_provider, owned)
        tracer = tp.get_tracer("otel_llm.tensorrt_llm", __version__, schema_url=SCHEMA_URL)
        meter = mp.get_meter("otel_llm.tensorrt_llm", __version__, schema_url=SCHEMA_URL)
        self.telemetry = telemetry = TRTLLMPipeline(config, tracer, meter, engine="tensorrt_llm", router=Router,
                                                       guard=self.guard)
        owned.add("telemetry", lambda: telemetry.flush(2.0), TELEMETRY)  # the ledger's held requests too
        telemetry.ledger = IterationLedger(telemetry.add_step, telemetry.finish, max_steps=config.max_steps,
                                           max_waiting=config.max_requests, wait_s=config.iteration_wait,
                                           guard=self.guard)
        w = TRTLLMWrappers(telemetry, telemetry.ledger)
        self._engine_table = WrapTable([
            Target(LLM_MODULE, "BaseLLM.generate_async", w.generate_async),
            Target(LLM_MODULE, "BaseLLM._prepare_sampling_params", w.prepare_sampling_params),
            Target(LLM_MODULE, "BaseLLM.get_stats", w.get_stats),
            Target(RESULT_MODULE, "DetokenizedGenerationResultBase._handle_response", w.handle_response),
            Target(RESULT_MODULE, "GenerationResultBase.record_stats", w.record_stats),
            Target(RESULT_MODULE, "GenerationResult.abort", w.abort),
            Target(RESULT_MODULE, "IterationResult.__anext__", w.iteration_anext),
        ], self.guard)
        self._server_table = WrapTable([
            Target(SERVER_MODULE, "OpenAIServer.openai_chat", w.serving("chat")),
            Target(SERVER_MODULE, "OpenAIServer.chat_harmony", w.serving("chat")),
            Target(SERVER_MODULE, "OpenAIServer.openai_completion", w.serving("text_completion")),
            Target(SERVER_MODULE, "OpenAIServer.openai_responses", w.serving("chat")),
        ], self.guard)
        # Checked and wrapped once llm.py is imported (it imports executor/result.py first); the server
        # module on its own import. Nothing of TensorRT-LLM is imported by instrumenting.
        self.refused: dict[str, list[str]] = {}
        wrapt.register_post_import_hook(lambda _m: self._arm(telemetry, server=False), LLM_MODULE)
        wrapt.register_post_import_hook(lambda _m: self._arm(telemetry, server=True), SERVER_MODULE)

    def _arm(self, telemetry: TRTLLMPipeline, server: bool) -> None:
        if self.telemetry is not telemetry:  # uninstrumented (or instrumented again) since
            return
        part, table = ("trtllm-serve", self._server_table) if server else ("the LLM API", self._engine_table)
        try:
            if not server:  # the modules llm.py reads from, imported by it already: make sure
                for name in (RESULT_MODULE, contract.METRICS_MODULE, contract.SAMPLING_MODULE):
                    importlib.import_module(name)
            differences = contract.check(server=server)
        except Exception as exc:
            differences = [f"the check itself failed: {exc!r}"]
        if differences:
            self.refused[part] = differences
            contract.refuse(part, differences, self.guard)
            return
        table.wrap()

    def _uninstrument(self, **kwargs: Any) -> None:
        self._engine_table.unwrap()
        self._server_table.unwrap()
        if self.lifecycle is not None:
            self.lifecycle.discard("telemetry")  # closed here instead: what is held goes out now
        if self.telemetry is not None:
            try:
                self.telemetry.close()
            except Exception as exc:
                self.guard.failed("tensorrt_llm uninstrument", exc)
        self.telemetry = None
        if self.lifecycle is not None:  # the providers it built
            self.lifecycle.close_all()
            self.lifecycle = None
