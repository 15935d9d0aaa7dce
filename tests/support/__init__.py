"""Test helpers, not shipped (the ``otel-llm`` wheel carries ``otel_llm`` only): the tiny random-weights model,
the real vLLM engine's CPU settings, a ``vllm serve`` launcher, an in-process OTLP/HTTP sink, metric readers.

Imported as ``support`` with ``tests/`` on ``sys.path``: pytest puts it there (``pythonpath`` in
pyproject.toml); the demo, the examples and the benchmarks insert it themselves (``sys.path.insert``), and
a subprocess that needs it gets it through ``PYTHONPATH`` (``pythonpath_env``).
"""

from __future__ import annotations

import os
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent  # the folder that holds ``support``


def pythonpath_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``tests/`` first on ``PYTHONPATH``, so ``python -m support.<module>`` runs in a child."""
    rest = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *([rest] if rest else [])])}
