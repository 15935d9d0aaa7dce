"""The optional C extensions of the EngineCore's per-step path, everything else is in pyproject.toml:
``otel_llm.instrumentation.vllm._step_fast`` (the step record's encode and ring write in one call) and
``._hooks_fast`` (the scheduler hooks' steady step). Without a compiler or Python headers their build fails, the
package installs without them and the step hooks use the pure-Python paths, which produce the same records
(``step_wire.REASON`` and ``step_hooks.FAST_REASON`` say why)."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c99", "-Wall"]
_HERE = "otel_llm/instrumentation/vllm"

setup(ext_modules=[
    Extension("otel_llm.instrumentation.vllm._step_fast", [f"{_HERE}/_step_fast.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("otel_llm.instrumentation.vllm._hooks_fast", [f"{_HERE}/_hooks_fast.c"], extra_compile_args=_FLAGS,
              optional=True),
])
