"""The optional C extension (``otel_llm.instrumentation.vllm._step_fast``: the EngineCore's per-step encode and
ring write in one call); everything else is in pyproject.toml. Without a compiler or Python headers the build of
the extension fails, the package installs without it and the step hooks use the pure-Python path
(``step_wire.REASON`` says why)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("otel_llm.instrumentation.vllm._step_fast", ["otel_llm/instrumentation/vllm/_step_fast.c"],
                             extra_compile_args=["-O2", "-std=c99", "-Wall"], optional=True)])
