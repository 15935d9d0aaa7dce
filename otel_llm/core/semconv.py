"""Attribute and span names: the trace contract, named once.

GenAI names follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``); the
``llm.*`` names are ours and are documented in the README's trace-contract table.
Latencies are in seconds.
"""

from __future__ import annotations

# GenAI semantic conventions
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_STREAM = "gen_ai.request.stream"
REQUEST_TOP_K = "gen_ai.request.top_k"
REQUEST_SEED = "gen_ai.request.seed"
REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
# prompt tokens served from the prefix cache (vLLM's num_cached_tokens)
USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
TOKEN_TYPE = "gen_ai.token.type"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

# Ours: request-level latencies (seconds) and facts
LATENCY_TTFT = "llm.latency.time_to_first_token"
LATENCY_TPOT = "llm.latency.time_per_output_token"
LATENCY_E2E = "llm.latency.e2e"
LATENCY_QUEUE = "llm.latency.queue"
LATENCY_PREFILL = "llm.latency.prefill"
LATENCY_DECODE = "llm.latency.decode"
NUM_PREEMPTIONS = "llm.request.num_preemptions"
OUTPUT_CHARACTERS = "llm.response.output_characters"
SLO_MET = "llm.slo.met"
SLO_BREACHED = "llm.slo.breached"
SAMPLING_REASON = "llm.sampling.reason"
DETAIL = "llm.detail"
# not "llm.engine": that is the namespace of llm.engine.step.*, and a name may not be both
ENGINE = "llm.engine.name"

# Ours: child spans
SPAN_QUEUE = "llm.queue"
SPAN_PREFILL = "llm.prefill"
SPAN_PREFILL_CHUNK = "llm.prefill.chunk"
SPAN_DECODE = "llm.decode"
SPAN_DECODE_STEP = "llm.decode.step"
SPAN_REQUEUE = "llm.requeue"
SPAN_REPREFILL = "llm.reprefill"
SPAN_ENGINE_STEP = "llm.engine.step"
EVENT_PREEMPTION = "llm.preemption"
EVENT_ENGINE_QUEUED = "llm.engine.queued"

CHUNK_TOKENS = "llm.prefill.chunk.tokens"
CHUNK_INDEX = "llm.prefill.chunk.index"
STEP_INDEX = "llm.decode.step.index"
STEP_TOKENS = "llm.decode.step.tokens"
ENGINE_STEP_ID = "llm.engine.step.id"

# Ours: engine-step span attributes
STEP_PHASE = "llm.engine.step.phase"
STEP_NUM_PREFILL_REQS = "llm.engine.step.prefill_requests"
STEP_NUM_PREFILL_TOKENS = "llm.engine.step.prefill_tokens"
STEP_NUM_DECODE_REQS = "llm.engine.step.decode_requests"
STEP_NUM_DECODE_TOKENS = "llm.engine.step.decode_tokens"
STEP_BATCH_SIZE = "llm.engine.step.batch_size"
STEP_NUM_RUNNING = "llm.engine.step.running"
STEP_NUM_WAITING = "llm.engine.step.waiting"
STEP_NUM_PREEMPTED = "llm.engine.step.preempted"
STEP_KV_CACHE_USAGE = "llm.engine.step.kv_cache_usage"

# vLLM's own native ``llm_request`` span (read by the collector)
VLLM_TTFT = "gen_ai.latency.time_to_first_token"
VLLM_E2E = "gen_ai.latency.e2e"
VLLM_QUEUE = "gen_ai.latency.time_in_queue"
VLLM_PREFILL = "gen_ai.latency.time_in_model_prefill"
VLLM_DECODE = "gen_ai.latency.time_in_model_decode"
VLLM_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
VLLM_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
VLLM_RESPONSE_MODEL = "gen_ai.response.model"
