"""pytest plugin for .ci/vllm_own_tests.py's instrumented run: ``otel_llm.instrument()`` before vLLM's tests
import vLLM (its step hooks then wrap the scheduler they drive), the errors we caught written at the end."""

from __future__ import annotations

import json
import os


def pytest_configure(config):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import otel_llm
    otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())


def pytest_unconfigure(config):
    import otel_llm
    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    errors = dict(otel_llm.stats()["errors"])
    if VLLMInstrumentor().runtime.step_hooks is None:  # the hooks never armed: the comparison would prove nothing
        errors["step hooks not armed"] = 1
    with open(os.environ["OTEL_LLM_OWN_TESTS_ERRORS"], "w") as f:
        json.dump(errors, f)
