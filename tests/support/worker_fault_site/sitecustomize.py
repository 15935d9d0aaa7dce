"""Test-only: on PYTHONPATH, makes our model-runner timer fail in vLLM worker processes (``VllmWorker-<rank>``)
and nowhere else, as a bug of ours would: the attribute name it sets on each step's output becomes a number,
so ``setattr`` raises inside the timer's guard. Each worker that got the fault leaves a mark in
OTEL_LLM_TEST_MARKS (a folder: one file per process), so the test knows it happened in a worker."""

import multiprocessing
import os


def _break(module) -> None:
    if not multiprocessing.current_process().name.startswith("VllmWorker"):
        return
    module.MODEL_TIME_ATTR = 0  # setattr(output, 0, ...): TypeError, counted by the worker's guard
    marks = os.environ.get("OTEL_LLM_TEST_MARKS")
    if marks:
        open(os.path.join(marks, f"{multiprocessing.current_process().name}-{os.getpid()}"), "w").close()


import wrapt  # noqa: E402

wrapt.register_post_import_hook(_break, "otel_llm.instrumentation.vllm.model_timing")
