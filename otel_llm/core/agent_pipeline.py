"""The frontend's half of a pipeline whose work an agent process does (otel_llm/agent).

A ``RequestPipeline`` (core/pipeline.py) that keeps each in-flight request's timeline for the hot path
and hands the agent its start and its finish, nothing else: the agent runs the ``Pipeline`` (decision,
verdict, spans, metrics) and reads the engine's step records itself.
"""

from __future__ import annotations

from typing import Protocol

from opentelemetry.metrics import Meter

from ..guard import Guard
from . import self_metrics
from .config import Config
from .diagnosis.anatomy import EngineFacts
from .finish_facts import FinishFacts
from .pipeline import Counts, admit
from .sampling import Decision, Verdict
from .summary import RequestSummary
from .timeline import RequestTimeline, StepRecord

AGENT_DECIDES = Decision(Verdict.NOT_SAMPLED, "agent")  # decided in the agent process, not here


class Remote(Protocol):
    """An agent process that does a pipeline's work (otel_llm/agent/link.py's ``AgentLink``)."""

    def request_started(self, t: RequestTimeline) -> None: ...
    def request_finished(self, request_id: str, t: RequestTimeline | None, s: RequestSummary) -> None: ...
    def request_settled(self, facts: FinishFacts) -> None: ...
    def engine(self, facts: EngineFacts) -> None: ...
    def flush(self, timeout: float) -> bool: ...
    def stats(self, counts: Counts) -> dict[str, int]: ...
    def release(self) -> None: ...


class AgentPipeline:
    """``remote`` does the work. ``meter``: where this process's errors are counted (``otel_llm.errors``);
    None where a pipeline built earlier for the same owner counts them already. The request counts are
    the agent's (its own meter reports them): not twice."""

    def __init__(self, config: Config, remote: Remote, guard: Guard, engine: str = "vllm",
                 meter: Meter | None = None) -> None:
        self.config = config
        self.engine = engine
        self.guard = guard
        self.remote = remote
        self.counts = Counts()  # what this frontend handed over (the agent's miss what a full channel refused)
        self.requests: dict[str, RequestTimeline] = {}
        if meter is not None:
            self_metrics.register_errors(meter, guard)

    def start(self, timeline: RequestTimeline) -> bool:
        if not admit(self, timeline):
            return False
        self.counts.requests_started += 1
        self.remote.request_started(timeline)
        return True

    def add_step(self, step: StepRecord) -> None:
        """Nothing: the agent reads the engine's step records itself."""

    def finish_facts(self, facts: FinishFacts) -> Decision:
        """The engine's own numbers, to the agent as they are (the summary is made there)."""
        self.requests.pop(facts.request_id, None)
        self.counts.requests_finished += 1
        self.remote.request_settled(facts)
        return AGENT_DECIDES

    def finish(self, request_id: str, s: RequestSummary) -> Decision:
        t = self.requests.pop(request_id, None)
        self.counts.requests_finished += 1
        self.remote.request_finished(request_id, t, s)
        return AGENT_DECIDES

    def engine_built(self, facts: EngineFacts) -> None:
        """The step diagnosis is set up in the agent (and its NVIDIA GPU sampler with it: never here)."""
        self.remote.engine(facts)

    def stats(self) -> dict[str, int]:
        return self.remote.stats(self.counts)

    def flush(self, timeout: float | None = 10.0) -> bool:
        return self.remote.flush(timeout if timeout is not None else 10.0)

    def close(self, timeout: float = 5.0) -> None:
        """The agent outlives an instrumentation (its owner closes it at exit): flushed and released."""
        self.remote.flush(timeout)
        self.remote.release()
