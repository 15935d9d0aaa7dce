"""The optional C extension (``otel_llm_collector.fast._wire``: the one-pass receive path); everything else is
in pyproject.toml. Without a compiler or Python headers the build of the extension fails, the package installs
without it and the receivers use the two-pass path (``fast/wire.py``'s ``REASON`` says why)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("otel_llm_collector.fast._wire", ["otel_llm_collector/fast/_wire.c"],
                             extra_compile_args=["-O2", "-std=c99", "-Wall"], optional=True)])
