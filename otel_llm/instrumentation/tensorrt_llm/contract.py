"""What of TensorRT-LLM we hook or read, for the one source tree this adapter was built from.

TensorRT-LLM cannot be installed or run on the machines this adapter was written on, so it
was built from its public source at one commit, ``PINNED_COMMIT`` (the merge of PR #5897,
"[None][feat] Add opentelemetry tracing", which is also where TensorRT-LLM's own
``llm_request`` span appeared). Every name below was read there unless the entry's ``source``
says otherwise. Before wrapping anything the instrumentor compares the installed package with
this table (``check``); on any difference it wraps nothing, logs once, and counts the refusal,
rather than misreading an API that moved. ``tests/tensorrt_llm/test_contract.py`` holds its own
copy of this table, written from the same source, so an edit here that the source does not back
fails there.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
from dataclasses import dataclass
from typing import Any

from ...core.guard import GUARD

logger = logging.getLogger("otel_llm")

PINNED_REPO = "NVIDIA/TensorRT-LLM"
PINNED_COMMIT = "5f15841037de10a50012016c54671f84f39c350e"

LLM_MODULE = "tensorrt_llm.llmapi.llm"
RESULT_MODULE = "tensorrt_llm.executor.result"
SERVER_MODULE = "tensorrt_llm.serve.openai_server"
METRICS_MODULE = "tensorrt_llm.metrics"
SAMPLING_MODULE = "tensorrt_llm.sampling_params"


@dataclass(frozen=True)
class Signature:
    """A function or method whose parameters (names, in order, ``self`` included) we rely on."""

    module: str
    qualname: str
    parameters: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class Members:
    """A class (or enum) whose attributes, dataclass fields or enum members we read."""

    module: str
    qualname: str
    names: tuple[str, ...]
    source: str


_LLM = f"tensorrt_llm/llmapi/llm.py @ {PINNED_COMMIT[:8]}"
_RESULT = f"tensorrt_llm/executor/result.py @ {PINNED_COMMIT[:8]}"
_SERVER = f"tensorrt_llm/serve/openai_server.py @ {PINNED_COMMIT[:8]}"

SIGNATURES: tuple[Signature, ...] = (
    Signature(LLM_MODULE, "BaseLLM.generate_async",
              ("self", "inputs", "sampling_params", "lora_request", "prompt_adapter_request", "streaming",
               "kv_cache_retention_config", "disaggregated_params", "trace_headers", "_postproc_params",
               "scheduling_params", "cache_salt"), _LLM),
    Signature(LLM_MODULE, "BaseLLM._prepare_sampling_params", ("self", "sampling_params"), _LLM),
    Signature(LLM_MODULE, "BaseLLM.get_stats", ("self", "timeout"), _LLM),
    Signature(RESULT_MODULE, "DetokenizedGenerationResultBase._handle_response", ("self", "response"), _RESULT),
    Signature(RESULT_MODULE, "GenerationResultBase.record_stats", ("self", "output", "stats"), _RESULT),
    Signature(RESULT_MODULE, "GenerationResult.abort", ("self",), _RESULT),
    Signature(RESULT_MODULE, "IterationResult.__anext__", ("self",), _RESULT),
)

SERVER_SIGNATURES: tuple[Signature, ...] = (
    Signature(SERVER_MODULE, "OpenAIServer.openai_chat", ("self", "request", "raw_request"), _SERVER),
    Signature(SERVER_MODULE, "OpenAIServer.chat_harmony", ("self", "request", "raw_request"), _SERVER),
    Signature(SERVER_MODULE, "OpenAIServer.openai_completion", ("self", "request", "raw_request"), _SERVER),
    Signature(SERVER_MODULE, "OpenAIServer.openai_responses", ("self", "request", "raw_request"), _SERVER),
)

MEMBERS: tuple[Members, ...] = (
    # result.py: the per-sequence record the LLM API fills (a dataclass) and the result's public face
    Members(RESULT_MODULE, "CompletionOutput",
            ("index", "text", "token_ids", "finish_reason", "request_perf_metrics"), _RESULT),
    Members(RESULT_MODULE, "CompletionOutput", ("length", "token_ids_diff"), _RESULT),  # properties
    # a private field, read on the hot path instead of copying token_ids_diff: its length is the same
    Members(RESULT_MODULE, "CompletionOutput", ("_last_token_ids_len",), _RESULT),
    Members(RESULT_MODULE, "GenerationResult", ("request_id", "prompt_token_ids", "finished", "outputs"), _RESULT),
    # the keys of the dict record_stats receives: result.py imports RequestEventTiming from ..metrics
    Members(METRICS_MODULE, "RequestEventTiming",
            ("ARRIVAL_TIME", "FIRST_SCHEDULED_TIME", "FIRST_TOKEN_TIME", "LAST_TOKEN_TIME"),
            "tensorrt_llm/metrics/enums.py @ 0f6cdd08 (members used by result.py @ 5f158410)"),
    Members(SAMPLING_MODULE, "SamplingParams",
            ("return_perf_metrics", "max_tokens", "temperature", "top_p", "top_k", "seed", "frequency_penalty",
             "presence_penalty", "stop", "n"),
            "tensorrt_llm/sampling_params.py @ 000a01de (return_perf_metrics read by llm.py @ 5f158410)"),
)

# Fields of the C++-bound RequestPerfMetrics (CompletionOutput.request_perf_metrics) we read, checked
# on a default-constructed instance: tests/bindings/test_executor_bindings.py
# (test_request_perf_metrics_pickle) sets every one; openai_server.py @ 5f158410 (get_perf_metrics)
# reads them. Times are datetime.timedelta on the engine's steady clock.
PERF_METRICS_MODULE = "tensorrt_llm.bindings.executor"
PERF_METRICS: dict[str, tuple[str, ...]] = {
    "": ("timing_metrics", "kv_cache_metrics", "speculative_decoding", "first_iter", "last_iter"),
    "timing_metrics": ("arrival_time", "first_scheduled_time", "first_token_time", "last_token_time"),
    "kv_cache_metrics": ("num_total_allocated_blocks", "num_new_allocated_blocks", "num_reused_blocks",
                         "num_missed_blocks", "kv_cache_hit_rate"),
    "speculative_decoding": ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"),
}


def _resolve(module: Any, dotted: str) -> Any:
    owner = module
    for part in dotted.split("."):
        owner = inspect.getattr_static(owner, part) if isinstance(owner, type) else getattr(owner, part)
    return owner


def _function(obj: Any) -> Any:
    # staticmethod/classmethod/wrapt wrappers: the function underneath
    obj = getattr(obj, "__func__", obj)
    return inspect.unwrap(obj) if callable(obj) else obj


def _signature_drift(sig: Signature) -> str | None:
    module = sys.modules.get(sig.module)
    if module is None:
        return f"{sig.module} is not imported"
    try:
        func = _function(_resolve(module, sig.qualname))
        found = tuple(inspect.signature(func).parameters)
    except (AttributeError, TypeError, ValueError) as exc:
        return f"{sig.module}.{sig.qualname}: not found ({exc})"
    if found != sig.parameters:
        return f"{sig.module}.{sig.qualname}{found} differs from the pinned {sig.parameters}"
    return None


def _members_drift(m: Members) -> str | None:
    module = sys.modules.get(m.module)
    if module is None:
        return f"{m.module} is not imported"
    try:
        cls = _resolve(module, m.qualname)
    except AttributeError:
        return f"{m.module}.{m.qualname}: not found"
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    missing = [n for n in m.names if n not in names and not hasattr(cls, n)]
    if missing:
        return f"{m.module}.{m.qualname} lacks {missing}"
    return None


def _perf_metrics_drift() -> str | None:
    module = sys.modules.get(PERF_METRICS_MODULE)
    if module is None:
        return None  # not loaded (no GPU build in this process): read defensively at run time
    try:
        instance = module.RequestPerfMetrics()
    except Exception as exc:
        return f"{PERF_METRICS_MODULE}.RequestPerfMetrics(): {exc!r}"
    for part, names in PERF_METRICS.items():
        obj = getattr(instance, part, None) if part else instance
        missing = [n for n in names if not hasattr(obj, n)]
        if obj is None or missing:
            return f"RequestPerfMetrics{'.' + part if part else ''} lacks {missing or [part]}"
    return None


def check(server: bool = False) -> list[str]:
    """Differences between the installed TensorRT-LLM and the pinned source (empty: it matches).

    ``server``: check trtllm-serve's handlers (only once ``tensorrt_llm.serve.openai_server`` is imported).
    """
    found = []
    for sig in (SERVER_SIGNATURES if server else SIGNATURES):
        drift = _signature_drift(sig)
        if drift:
            found.append(drift)
    if not server:
        for m in MEMBERS:
            drift = _members_drift(m)
            if drift:
                found.append(drift)
        drift = _perf_metrics_drift()
        if drift:
            found.append(drift)
    return found


REFUSAL_SITE = "tensorrt_llm contract"


def refuse(part: str, differences: list[str]) -> None:
    """Count a refusal to wrap (``otel_llm.stats()["errors"]``, the ``otel_llm.errors`` counter) and say
    why, once per part."""
    site = f"{REFUSAL_SITE}: {part}"
    first = site not in GUARD.errors
    GUARD.errors[site] += 1
    if first:
        logger.warning("otel-llm: the installed TensorRT-LLM differs from the source this adapter was built "
                       "from (%s@%s); %s is not instrumented: %s",
                       PINNED_REPO, PINNED_COMMIT[:8], part, "; ".join(differences))
