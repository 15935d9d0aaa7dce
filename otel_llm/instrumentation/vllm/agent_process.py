"""``python -m otel_llm.instrumentation.vllm.agent_process FD``: the agent process of a vLLM frontend.

The engine-agnostic agent (otel_llm/agent/process.py) with vLLM's reader of engine steps: the
frontend's step socket in the step directory (``OTEL_LLM_STEP_DIR``, inherited), bound here in the
frontend's place, so that the EngineCore's sink hands this process the shared-memory ring of records.
Started by the instrumentor (``VLLMRuntime.open_agent``, runtime.py) through ``otel_llm.agent.link.AgentLink``.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from ...agent import process
from ...guard import Guard
from .step_transport import STEP_DIR_ENV, StepReceiver


# The agent frees what it reads (records, steps, timelines) by reference count; what the cyclic collector
# scans is mostly what it holds on purpose (the held steps, the exporters' queues, the modules). At the
# default pace (a young collection every 700 objects allocated more than freed, a full one every 100 young
# ones) that scanning was a measurable part of the agent's CPU (docs/costs.md). A larger young generation,
# and what start-up made frozen (``gc.freeze``: never scanned), leave it little to do; a cycle waits longer
# to be freed.
GC_THRESHOLD = (10_000, 10, 10)


def tune_gc() -> None:
    """The agent process's collector: what exists now frozen, the young generation ``GC_THRESHOLD``."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def open_steps(guard: Guard) -> Any:
    directory = os.environ.get(STEP_DIR_ENV)
    return StepReceiver(directory, guard) if directory else None


if __name__ == "__main__":
    tune_gc()
    sys.exit(process.main(sys.argv, open_steps))
