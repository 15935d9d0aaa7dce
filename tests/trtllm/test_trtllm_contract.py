"""The static contract: what the adapter hooks and reads in TensorRT-LLM, for the pinned source.

``PINNED`` below is written from NVIDIA/TensorRT-LLM at commit 5f15841037de10a50012016c54671f84f39c350e
(the merge of PR #5897, "[None][feat] Add opentelemetry tracing"), file by file:

* tensorrt_llm/llmapi/llm.py: ``BaseLLM.generate_async(self, inputs, sampling_params=None,
  lora_request=None, prompt_adapter_request=None, streaming=False, kv_cache_retention_config=None,
  disaggregated_params=None, trace_headers=None, _postproc_params=None, scheduling_params=None,
  cache_salt=None)``, ``BaseLLM._prepare_sampling_params(self, sampling_params=None)`` (sets
  ``sampling_params.return_perf_metrics``), ``BaseLLM.get_stats(self, timeout=2)``.
* tensorrt_llm/executor/result.py: ``DetokenizedGenerationResultBase._handle_response(self, response)``,
  ``GenerationResultBase.record_stats(self, output, stats=None)``, ``GenerationResult.abort(self)``,
  ``IterationResult.__anext__(self)``; ``CompletionOutput`` (a dataclass) fields ``index``, ``text``,
  ``token_ids``, ``finish_reason``, ``request_perf_metrics``, the private ``_last_token_ids_len`` (the
  length ``token_ids_diff`` slices from) and properties ``length``, ``token_ids_diff``;
  ``GenerationResult.request_id``, ``prompt_token_ids``, ``finished``, ``outputs``.
* tensorrt_llm/serve/openai_server.py: ``OpenAIServer.openai_chat``, ``chat_harmony``,
  ``openai_completion``, ``openai_responses``, each ``(self, request, raw_request)``.
* tensorrt_llm/metrics/enums.py (stored version 0f6cdd08; result.py at the pin imports it from
  ``..metrics``): ``RequestEventTiming.ARRIVAL_TIME`` / ``FIRST_SCHEDULED_TIME`` / ``FIRST_TOKEN_TIME`` /
  ``LAST_TOKEN_TIME``.
* tensorrt_llm/sampling_params.py (stored version 000a01de, the 1.0.0rc4 version bump; the pinned
  commit does not touch it): ``return_perf_metrics``, ``max_tokens``, ``temperature``, ``top_p``,
  ``top_k``, ``seed``, ``frequency_penalty``, ``presence_penalty``, ``stop``, ``n``.
* RequestPerfMetrics (C++ binding): tests/bindings/test_executor_bindings.py
  ``test_request_perf_metrics_pickle`` sets each field; openai_server.py at the pin reads them in
  ``get_perf_metrics``.
"""

from __future__ import annotations

import logging
import types

import pytest

import fake_trtllm as fake
from trtllm_env import instrumented
from otel_llm.core.guard import GUARD
from otel_llm.instrumentation.tensorrt_llm import contract
from otel_llm.instrumentation.wraps import is_wrapped

COMMIT = "5f15841037de10a50012016c54671f84f39c350e"
LLM, RESULT, SERVER = "tensorrt_llm.llmapi.llm", "tensorrt_llm.executor.result", "tensorrt_llm.serve.openai_server"

PINNED_SIGNATURES = {
    (LLM, "BaseLLM.generate_async"): ("self", "inputs", "sampling_params", "lora_request", "prompt_adapter_request",
                                      "streaming", "kv_cache_retention_config", "disaggregated_params",
                                      "trace_headers", "_postproc_params", "scheduling_params", "cache_salt"),
    (LLM, "BaseLLM._prepare_sampling_params"): ("self", "sampling_params"),
    (LLM, "BaseLLM.get_stats"): ("self", "timeout"),
    (RESULT, "DetokenizedGenerationResultBase._handle_response"): ("self", "response"),
    (RESULT, "GenerationResultBase.record_stats"): ("self", "output", "stats"),
    (RESULT, "GenerationResult.abort"): ("self",),
    (RESULT, "IterationResult.__anext__"): ("self",),
}
PINNED_SERVER = {
    (SERVER, f"OpenAIServer.{name}"): ("self", "request", "raw_request")
    for name in ("openai_chat", "chat_harmony", "openai_completion", "openai_responses")
}
PINNED_MEMBERS = {
    (RESULT, "CompletionOutput"): {"index", "text", "token_ids", "finish_reason", "request_perf_metrics",
                                   "length", "token_ids_diff", "_last_token_ids_len"},
    (RESULT, "GenerationResult"): {"request_id", "prompt_token_ids", "finished", "outputs"},
    ("tensorrt_llm.metrics", "RequestEventTiming"): {"ARRIVAL_TIME", "FIRST_SCHEDULED_TIME", "FIRST_TOKEN_TIME",
                                                     "LAST_TOKEN_TIME"},
    ("tensorrt_llm.sampling_params", "SamplingParams"): {"return_perf_metrics", "max_tokens", "temperature", "top_p",
                                                         "top_k", "seed", "frequency_penalty", "presence_penalty",
                                                         "stop", "n"},
}
PINNED_PERF_METRICS = {
    "": {"timing_metrics", "kv_cache_metrics", "speculative_decoding", "first_iter", "last_iter"},
    "timing_metrics": {"arrival_time", "first_scheduled_time", "first_token_time", "last_token_time"},
    "kv_cache_metrics": {"num_total_allocated_blocks", "num_new_allocated_blocks", "num_reused_blocks",
                         "num_missed_blocks", "kv_cache_hit_rate"},
    "speculative_decoding": {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"},
}


def test_the_adapters_table_is_the_pinned_source() -> None:
    assert contract.PINNED_COMMIT == COMMIT
    assert {(s.module, s.qualname): s.parameters for s in contract.SIGNATURES} == PINNED_SIGNATURES
    assert {(s.module, s.qualname): s.parameters for s in contract.SERVER_SIGNATURES} == PINNED_SERVER
    members: dict = {}
    for m in contract.MEMBERS:
        members.setdefault((m.module, m.qualname), set()).update(m.names)
    assert members == PINNED_MEMBERS
    assert {k: set(v) for k, v in contract.PERF_METRICS.items()} == PINNED_PERF_METRICS
    for entry in (*contract.SIGNATURES, *contract.SERVER_SIGNATURES, *contract.MEMBERS):
        assert entry.source, entry  # every name says where it was read


def test_the_stand_in_matches_the_pinned_source() -> None:
    fake.install(fake.build())
    try:
        assert contract.check() == [] and contract.check(server=True) == []
    finally:
        fake.uninstall()


def _drifted_generate_async(modules: dict) -> None:
    # generate_async as it was before the pinned commit: no trace_headers parameter
    base = modules[LLM].BaseLLM
    old = type("BaseLLM", (base,), {})

    def generate_async(self, inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None,
                       streaming=False, kv_cache_retention_config=None, disaggregated_params=None,
                       _postproc_params=None, scheduling_params=None, cache_salt=None):
        return base.generate_async(self, inputs, sampling_params, streaming=streaming)

    old.generate_async = generate_async
    modules[LLM].BaseLLM = modules[LLM].LLM = old


def _newer_generate_async(modules: dict) -> None:
    # generate_async as a 2026 version of llm.py on TensorRT-LLM's main branch has it (a stored version
    # read from the public repository): conversation_params and priority added
    base = modules[LLM].BaseLLM
    newer = type("BaseLLM", (base,), {})

    def generate_async(self, inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None,
                       streaming=False, kv_cache_retention_config=None, disaggregated_params=None,
                       trace_headers=None, _postproc_params=None, scheduling_params=None, conversation_params=None,
                       cache_salt=None, priority=0.5):
        return base.generate_async(self, inputs, sampling_params, streaming=streaming)

    newer.generate_async = generate_async
    modules[LLM].BaseLLM = modules[LLM].LLM = newer


def _drifted_perf_metrics(modules: dict) -> None:
    class RequestPerfMetrics(fake.RequestPerfMetrics):
        def __init__(self) -> None:
            super().__init__()
            del self.first_iter

    modules["tensorrt_llm.bindings.executor"].RequestPerfMetrics = RequestPerfMetrics


def _drifted_completion_output(modules: dict) -> None:
    modules[RESULT] = types.ModuleType(RESULT)
    modules[RESULT].__dict__.update({k: v for k, v in fake.build()[RESULT].__dict__.items() if k != "__name__"})

    class CompletionOutput:  # a release that renamed request_perf_metrics
        index: int = 0
        text: str = ""
        token_ids: list = []
        finish_reason: str | None = None
        perf_metrics = None

    modules[RESULT].CompletionOutput = CompletionOutput


@pytest.mark.parametrize("drift,expected", [
    (_drifted_generate_async, "BaseLLM.generate_async"),
    (_newer_generate_async, "'conversation_params'"),
    (_drifted_perf_metrics, "RequestPerfMetrics lacks ['first_iter']"),
    (_drifted_completion_output, "CompletionOutput lacks ['request_perf_metrics']"),
])
def test_a_drifted_release_is_refused_not_misread(drift, expected, caplog) -> None:
    modules = fake.build()
    drift(modules)
    fake.install(modules)
    site = f"{contract.REFUSAL_SITE}: the LLM API"
    before = GUARD.errors[site]
    first_time = before == 0
    try:
        with caplog.at_level(logging.WARNING, logger="otel_llm"):
            env = instrumented(modules)
            llm_mod = modules[LLM]
            assert not is_wrapped(llm_mod.BaseLLM, "generate_async")
            assert not is_wrapped(fake.BaseLLM, "generate_async")
            assert not is_wrapped(fake.DetokenizedGenerationResultBase, "_handle_response")
            assert GUARD.errors[site] == before + 1
            assert any(expected in d for d in env.inst.refused["the LLM API"]), env.inst.refused
            out = llm_mod.LLM(model="m").generate("a b c", fake.SamplingParams(max_tokens=3))
            assert out.outputs[0].length == 3  # the engine works as before, untouched
            assert env.spans() == [] and env.inst.telemetry.stats()["requests_started"] == 0
        said = [r for r in caplog.records if "differs from the source this adapter was built from" in r.getMessage()]
        assert len(said) == (1 if first_time else 0)  # logged once per process, counted every time
    finally:
        env.inst.uninstrument()
        fake.uninstall()


def test_a_drifted_server_refuses_only_the_server_part() -> None:
    modules = fake.build()

    class OpenAIServer(fake.OpenAIServer):
        async def openai_chat(self, request, raw_request, extra=None):  # a parameter the pin does not have
            return await super().openai_chat(request, raw_request)

    modules[SERVER].OpenAIServer = OpenAIServer
    fake.install(modules)
    try:
        env = instrumented(modules)
        assert "trtllm-serve" in env.inst.refused and "the LLM API" not in env.inst.refused
        assert not is_wrapped(OpenAIServer, "openai_chat")
        assert is_wrapped(fake.BaseLLM, "generate_async")
    finally:
        env.inst.uninstrument()
        fake.uninstall()


def test_wraps_lazily_when_tensorrt_llm_is_imported_later() -> None:
    import importlib
    import sys

    modules = fake.build()
    fake.importable(modules)
    try:
        env = instrumented(modules)
        assert LLM not in sys.modules  # instrumenting imported nothing
        assert not is_wrapped(fake.BaseLLM, "generate_async")
        importlib.import_module(LLM)
        assert is_wrapped(fake.BaseLLM, "generate_async")
        assert is_wrapped(fake.DetokenizedGenerationResultBase, "_handle_response")
        assert not is_wrapped(fake.OpenAIServer, "openai_chat")
        importlib.import_module(SERVER)
        assert is_wrapped(fake.OpenAIServer, "openai_chat")
    finally:
        env.inst.uninstrument()
        fake.uninstall()


def test_instrument_detects_tensorrt_llm() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import otel_llm

    fake.install(fake.build())
    try:
        done = otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
        assert "tensorrt_llm" in done and "tensorrt_llm" in otel_llm.instrumented()
        assert is_wrapped(fake.BaseLLM, "generate_async")
        assert "tensorrt_llm" in otel_llm.stats()
    finally:
        otel_llm.uninstrument()
        fake.uninstall()
    assert not is_wrapped(fake.BaseLLM, "generate_async")


def test_registered_for_opentelemetry_instrument() -> None:
    import tomllib
    from pathlib import Path

    from otel_llm.instrumentation.tensorrt_llm import TensorRTLLMInstrumentor

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["opentelemetry_instrumentor"]["tensorrt_llm"]
    assert target == "otel_llm.instrumentation.tensorrt_llm:TensorRTLLMInstrumentor"
    # not installed and not importable: the launcher's dependency check skips us
    assert TensorRTLLMInstrumentor().instrumentation_dependencies() == ("tensorrt_llm",)
    fake.install(fake.build())
    try:  # importable (here the stand-in; a source checkout alike): no distribution to check
        assert TensorRTLLMInstrumentor().instrumentation_dependencies() == ()
    finally:
        fake.uninstall()
