"""``python -m otel_llm.instrumentation.vllm.agent_process FD``: the agent process of a vLLM frontend.

The engine-agnostic agent (otel_llm/agent/process.py) with vLLM's reader of engine steps: the
frontend's step socket in the step directory (``OTEL_LLM_STEP_DIR``, inherited), bound here in the
frontend's place, so that the EngineCore's sink hands this process the shared-memory ring of records.
Started by the instrumentor (``VLLMRuntime.open_agent``, runtime.py) through ``otel_llm.agent.link.AgentLink``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ...agent import process
from ...guard import Guard
from .step_transport import STEP_DIR_ENV, StepReceiver


def open_steps(guard: Guard) -> Any:
    directory = os.environ.get(STEP_DIR_ENV)
    return StepReceiver(directory, guard) if directory else None


if __name__ == "__main__":
    sys.exit(process.main(sys.argv, open_steps))
