"""What one ``instrument()`` of vLLM builds, and one ``uninstrument()`` undoes whole.

Its options, the providers it built (or was given), its pipeline, its wrappers and the KV connectors'
wrapper; the process's runtime (runtime.py) outlives it, and hands it the step sockets and the agent.

Its pipeline (a ``core.pipeline.RequestPipeline``) is chosen once: the agent-backed one
(``core.agent_pipeline.AgentPipeline``) where this process's agent takes the work, else the in-process
``Pipeline``. The agent starts with the first engine client it fits (a spawned EngineCore whose token
times come from its steps), so where it is not running at ``instrument()`` the choice is made there, before
that engine's first request; it is never undone (a request the in-process pipeline holds still finishes
there, and it is flushed and closed with the instrumentation).
"""

from __future__ import annotations

import logging
from typing import Any

import wrapt

from ...core.agent_pipeline import AgentPipeline
from ...core.config import Config
from ...core.pipeline import Pipeline, RequestPipeline
from ...core.providers import METER_PROVIDER, TRACER_PROVIDER, providers_from
from ...lifecycle import TELEMETRY
from ...otlp.routes import Router
from ...semconv import SCHEMA_URL
from ...version import __version__
from ..wraps import Target, WrapTable
from . import kv_connector, step_hooks
from .process_roles import in_engine_process
from .runtime import VLLMRuntime
from .wrappers import VLLMWrappers

logger = logging.getLogger("otel_llm")
_TELEMETRY = "telemetry"  # the pipeline's flush, in the runtime's Lifecycle
AGENT_MODULE = "otel_llm.instrumentation.vllm.agent_process"  # the agent's entry (python -m), with vLLM's step reader


class VLLMInstrumentation:
    """One ``instrument()``'s work: built by it, closed by ``uninstrument()``; nothing of it outlives that."""

    def __init__(self, runtime: VLLMRuntime, config: Config, tracer_provider: Any = None,
                 meter_provider: Any = None) -> None:
        self.runtime = runtime
        self.guard = guard = runtime.guard
        self.config = config
        owned = runtime.lifecycle
        tp, mp = providers_from(tracer_provider, meter_provider, owned)
        tracer = tp.get_tracer("otel_llm.vllm", __version__, schema_url=SCHEMA_URL)
        meter = mp.get_meter("otel_llm.vllm", __version__, schema_url=SCHEMA_URL)
        self.agent_config = self._agent_setup(config, tp, mp)
        self._closed = False
        # the in-process pipeline, where one was built: it stays until the instrumentation closes
        self.local: Pipeline | None = None
        agent = runtime.agent  # an engine built under an earlier instrumentation sends its steps to it
        if agent is not None and self.agent_config is None:  # this one cannot use it: its steps come here again
            runtime.close_agent()
            runtime.open_receiver()
            agent = None
        if agent is not None:
            agent.configure(self.agent_config)
            self.telemetry: RequestPipeline = AgentPipeline(config, agent, guard, meter=meter)
        else:
            self.telemetry = self.local = Pipeline(config, tracer, meter, engine="vllm", router=Router, guard=guard)
        # at exit: build what is queued and send it, before the providers it goes through shut down
        owned.add(_TELEMETRY, lambda: self.flush(2.0), TELEMETRY)
        self.wrappers = w = VLLMWrappers(
            self.telemetry, open_receiver=runtime.open_receiver, open_kv_receiver=runtime.open_kv_receiver,
            engine_built=runtime.engine_built, open_agent=self.open_agent if self.agent_config is not None else None)
        w.agent = agent
        w.fence = runtime.fence
        self.kv_wrapper: kv_connector.ConnectorWrapper | None = None
        if not in_engine_process():  # a spawned EngineCore's connectors are the plugin's
            self.kv_wrapper = kv_connector.ConnectorWrapper(w.kv_book.add, fence=runtime.fence, guard=guard)
            self.kv_wrapper.arm()
        engine = runtime.last_engine
        if engine is not None:  # an engine built under an earlier instrumentation (with an agent: the agent's)
            try:
                self.telemetry.engine_built(engine)
            except Exception as exc:
                guard.failed("vllm step diagnosis set-up", exc)
        if config.engine_steps:
            # once vLLM is imported (now, if it is): nothing of vLLM's is imported for a process that
            # only has it installed
            wrapt.register_post_import_hook(lambda _m: self._arm_steps(), "vllm")
        self.table = WrapTable([
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
        ], guard)
        self.table.wrap()

    def _arm_steps(self) -> None:
        if self._closed:  # instrumented again (or not at all) since
            return
        if in_engine_process():
            # auto-instrumented (opentelemetry-instrument) EngineCore: its steps belong to the
            # frontend that spawned it, reached through the plugin and the inherited socket path
            return
        w = self.wrappers
        try:
            # Spawned EngineCores report to the frontends' sockets in the step directory (ours is bound when
            # we build an engine client, see engine_init). In-process engines report straight to us.
            self.runtime.arm_steps(lambda payload: w.telemetry.add_step(step_hooks.decode(payload)))
            w.steps_armed = True
            w.receiver = self.runtime.step_receiver
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

    def open_agent(self) -> Any:
        """The process's agent (started at the first engine client an eligible instrumentation builds), handed
        this instrumentation's work: from now on its pipeline is the agent-backed one. None (warned) if it
        could not start (the in-process pipeline goes on)."""
        agent = self.runtime.open_agent(AGENT_MODULE)
        if agent is None or self._closed or self.agent_config is None or isinstance(self.telemetry, AgentPipeline):
            return agent
        agent.configure(self.agent_config)
        # the in-process pipeline's meter counts this instrumentation's errors already
        self.telemetry = self.wrappers.telemetry = AgentPipeline(self.config, agent, self.guard)
        return agent

    def flush(self, timeout: float) -> bool:
        done = self.local.flush(timeout) if self.local is not None and self.local is not self.telemetry else True
        return self.telemetry.flush(timeout) and done

    def close(self) -> None:
        """Undo this instrumentation: its wrappers, its hooks' target, its pipeline, its providers. The
        runtime's sockets and agent stay for the process."""
        self._closed = True
        self.table.unwrap()
        self.wrappers.restore()  # the engines whose output batches went straight to vLLM: hooked again
        if self.kv_wrapper is not None:
            self.kv_wrapper.disarm()
            self.kv_wrapper = None
        self.runtime.disarm_steps()
        for pipeline in dict.fromkeys((self.telemetry, self.local)):
            if pipeline is None:
                continue
            try:
                pipeline.close()  # spans of requests already finished still go out
            except Exception as exc:
                self.guard.failed("vllm uninstrument", exc)
        owned = self.runtime.lifecycle
        owned.discard(_TELEMETRY)
        owned.close(TRACER_PROVIDER)
        owned.close(METER_PROVIDER)
