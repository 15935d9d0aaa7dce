"""What the vLLM adapter holds once per process, for the life of the process, across instrument() cycles.

A spawned EngineCore keeps sending its step records to the socket it found for as long as it runs, an
agent process keeps running once started, and vLLM's modules are fenced once as they are imported: none of
that may go with an ``uninstrument()``. What one ``instrument()`` builds (options, providers, pipeline,
wrappers) is ``instrumentation.VLLMInstrumentation``'s, and goes with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import wrapt

from ...core.diagnosis.anatomy import EngineFacts
from ...guard import Guard
from ...lifecycle import DIRECTORIES, SOCKETS, Lifecycle
from . import contract, kv_channel, step_hooks, step_transport

if TYPE_CHECKING:
    from ...agent.link import AgentLink

logger = logging.getLogger("otel_llm")
AGENT = "agent"
STEP_RECEIVER = "step receiver"


class VLLMRuntime:
    """This process's step machinery and agent, made at the first ``instrument()`` and kept:

    * ``fence``: vLLM's symbols we rely on, checked once as their modules are imported (contract.py);
    * ``step_hooks``: the scheduler hooks of an engine running in this process (a spawned EngineCore's
      are the plugin's, see ``plugin.plugin``), armed by the instrumentation of the day;
    * ``step_receiver``: the socket for the step records of spawned EngineCores, bound when the first
      engine client is built (none while an agent reads them);
    * ``kv_receiver``: the socket for the KV hand-off records of spawned EngineCores;
    * ``step_directory``: where those sockets live (``OTEL_LLM_STEP_DIR``, inherited by EngineCores);
    * ``agent``: the agent process that does the telemetry's work (otel_llm/agent), once started;
    * ``last_engine``: the shape of the last engine built here, for the roofline of a later instrumentation;
    * ``lifecycle``: what is closed at exit, in order: an instrumentation's flush and providers (it adds and
      removes those itself), the sockets and the agent, the step directory made here.
    """

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.lifecycle = Lifecycle(guard)
        self.fence = self._check_contract()
        self.step_hooks: step_hooks.StepHooks | None = None
        self.step_receiver: step_transport.StepReceiver | None = None
        self.kv_receiver: kv_channel.HandoffReceiver | None = None
        self.step_directory: step_transport.StepDir | None = None
        self.agent: AgentLink | None = None
        self.last_engine: EngineFacts | None = None

    def _check_contract(self) -> contract.Contract:
        """The release against the tested range now, each module's symbols when it is imported (now, if it
        is): the hooks stay for the process, so the contract says each thing once."""
        fence = contract.Contract(guard=self.guard)
        try:
            fence.check_version()
            for name in dict.fromkeys(e.module for e in fence.entries):
                wrapt.register_post_import_hook(lambda _m, name=name: fence.check_module(name), name)
        except Exception as exc:
            self.guard.failed("vllm contract", exc)
        return fence

    def engine_built(self, engine: EngineFacts) -> None:
        self.last_engine = engine

    def arm_steps(self, add: Callable[[bytes], None]) -> None:
        """An engine in this process reports its steps to ``add`` (the current instrumentation's)."""
        self.step_dir()
        if self.step_hooks is None:
            self.step_hooks = step_hooks.StepHooks(self.fence, self.guard)
        self.step_hooks.arm(add)

    def disarm_steps(self) -> None:
        if self.step_hooks is not None:
            self.step_hooks.disarm()

    def step_dir(self) -> str:
        """This process's step directory, opened once (a directory made here is removed at exit, when empty).
        It is inherited by EngineCore processes spawned later: their plugin reports to the sockets in it."""
        if self.step_directory is None:
            self.step_directory = opened = step_transport.open_step_dir()
            if opened.made:
                self.lifecycle.add("step directory", lambda: step_transport.remove_if_empty(opened.path),
                                   DIRECTORIES)
        return self.step_directory.path

    def open_receiver(self) -> step_transport.StepReceiver:
        """This process's step socket: kept across instrument/uninstrument cycles, closed at exit."""
        if self.step_receiver is None:
            self.step_receiver = receiver = step_transport.StepReceiver(self.step_dir(), self.guard)
            self.lifecycle.add(STEP_RECEIVER, receiver.close, SOCKETS)
        return self.step_receiver

    def open_kv_receiver(self) -> kv_channel.HandoffReceiver:
        if self.kv_receiver is None:
            self.kv_receiver = receiver = kv_channel.HandoffReceiver(self.step_dir(), self.guard)
            self.lifecycle.add("kv hand-off receiver", receiver.close, SOCKETS)
        return self.kv_receiver

    def open_agent(self, module: str) -> AgentLink | None:
        """This process's agent, started once (``python -m module``); None (warned) if it could not start.
        It binds the step socket in place of ours: a receiver bound for an earlier engine is closed, and its
        EngineCore finds the agent's at its next rescan."""
        if self.agent is None:
            from ...agent.link import AgentLink

            link = AgentLink(self.guard, module)
            if not link.start():
                self.guard.warn_once("agent start", "otel-llm: the agent process did not start; the telemetry's "
                                     "work stays in vLLM's frontend process (see otel_llm.stats()['errors'])")
                return None
            self.agent = link
            self.lifecycle.add(AGENT, link.close, SOCKETS)
            if self.step_receiver is not None:
                self.step_receiver.close()
                self.step_receiver = None
                self.lifecycle.discard(STEP_RECEIVER)
        return self.agent

    def close_agent(self) -> None:
        """An instrumentation that cannot use the agent: its engines' steps come to this process again (the
        sink finds our socket at its rescan)."""
        if self.agent is not None:
            self.agent.close()
            self.agent = None
            self.lifecycle.discard(AGENT)
