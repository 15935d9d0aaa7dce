"""The optional C extensions of the EngineCore's per-step path, everything else is in pyproject.toml:
``otel_llm.instrumentation.vllm._step_fast`` (the step record's encode and ring write in one call) and
``._hooks_fast`` (the scheduler hooks' steady step); and the agent's ``otel_llm.agent._bounded_fast`` (the walk that
bounds the records it reads before ``marshal`` does). Without a compiler or Python headers their build fails, the
package installs without them and the step hooks use the pure-Python paths, which produce the same records
(``step_wire.REASON``, ``step_hooks.FAST_REASON`` and ``bounded_marshal.REASON`` say why)."""

import re
import sys
from pathlib import Path

from setuptools import Extension, setup

_ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(_ROOT))
from long_description import long_description  # noqa: E402  (beside this file, in the sdist too)

_VERSION = re.search(r'__version__ = "([^"]+)"', (_ROOT / "otel_llm/version.py").read_text()).group(1)

_FLAGS = ["-O2", "-std=c99", "-Wall"]
_HERE = "otel_llm/instrumentation/vllm"

setup(long_description=long_description(_ROOT / "README.md", _VERSION),
      long_description_content_type="text/markdown", ext_modules=[
    Extension("otel_llm.instrumentation.vllm._step_fast", [f"{_HERE}/_step_fast.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("otel_llm.instrumentation.vllm._hooks_fast", [f"{_HERE}/_hooks_fast.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("otel_llm.agent._bounded_fast", ["otel_llm/agent/_bounded_fast.c"], extra_compile_args=_FLAGS,
              optional=True),
])
