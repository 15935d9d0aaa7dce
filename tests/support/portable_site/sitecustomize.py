"""Test-only: on PYTHONPATH, makes every process that imports otel-llm take the paths of a machine that is not
x86-64 Linux (e.g. ARM GH200): no shared-memory rings (step records as datagrams, the agent's messages as
packets) and no C extension (the pure-Python step hooks, encoder and readers, the agent's Python walker): the
C modules are made unimportable, as where none was built; ``shm_ring.AVAILABLE`` is cleared as its module is
imported, before any importer reads it. Each process where it applied leaves a mark in OTEL_LLM_TEST_MARKS (a
folder: one file per process), so the test knows the EngineCore and the agent ran so."""

import multiprocessing
import os
import sys

for _name in ("otel_llm.instrumentation.vllm._step_fast", "otel_llm.instrumentation.vllm._hooks_fast",
              "otel_llm.agent._bounded_fast"):
    sys.modules[_name] = None  # ``import`` raises ImportError: as where the extension was not built


def _no_rings(module) -> None:
    module.AVAILABLE = False
    marks = os.environ.get("OTEL_LLM_TEST_MARKS")
    if marks:
        name = f"{multiprocessing.current_process().name}-{os.getpid()}"
        open(os.path.join(marks, name), "w").close()


import wrapt  # noqa: E402

wrapt.register_post_import_hook(_no_rings, "otel_llm.shm_ring")
