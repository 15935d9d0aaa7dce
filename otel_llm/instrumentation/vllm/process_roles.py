"""Which of vLLM's processes this is, from the names vLLM gives the processes it spawns."""

from __future__ import annotations

import multiprocessing


def in_api_server_process() -> bool:
    """Whether this is one of the API server processes of ``vllm serve --api-server-count N``."""
    return multiprocessing.current_process().name.startswith("ApiServer")


def in_engine_process() -> bool:
    """Whether this is an EngineCore process vLLM spawned (``EngineCore``, ``EngineCore_DP<n>``)."""
    return multiprocessing.current_process().name.startswith("EngineCore")


def in_worker_process() -> bool:
    """Whether this is a worker process of vLLM's multiprocess executor (``VllmWorker-<rank>``)."""
    return multiprocessing.current_process().name.startswith("VllmWorker")
