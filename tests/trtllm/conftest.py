"""Fixtures for the TensorRT-LLM adapter tests: the stand-in package (``fake_trtllm``), instrumented."""

from __future__ import annotations

from typing import Iterator

import pytest

import fake_trtllm as fake
from trtllm_env import Env, instrumented


@pytest.fixture

def trt() -> Iterator[Env]:
    modules = fake.build()
    fake.install(modules)
    env = instrumented(modules)
    try:
        yield env
    finally:
        env.inst.uninstrument()
        fake.uninstall()
