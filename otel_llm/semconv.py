"""Attribute and span names: the trace contract, named once.

GenAI names follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``); the
``llm.*`` names are ours and are documented in the trace-contract table (docs/trace-contract.md).
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
# output tokens the model spent reasoning (openai's completion_tokens_details.reasoning_tokens)
USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"
TOKEN_TYPE = "gen_ai.token.type"
TOKEN_MODALITY = "gen_ai.token.modality"  # on the usage counters; ``unknown``: the provider reports no breakdown
TOKEN_MODALITY_UNKNOWN = "unknown"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
REQUEST_ENCODING_FORMATS = "gen_ai.request.encoding_formats"
EMBEDDINGS_DIMENSION_COUNT = "gen_ai.embeddings.dimension.count"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
OPERATION_CHAT = "chat"
OPERATION_TEXT_COMPLETION = "text_completion"
OPERATION_EMBEDDINGS = "embeddings"

# GenAI client metrics, in two versions of the conventions, chosen once at instrument() as the contrib
# instrumentations choose (core/semconv_mode.py): by default the names they emit without an opt-in;
# with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental, the registry's current ones (below).
# Held against the vendored registry by tests/core/test_semconv_registry.py.
SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
GENAI_LATEST_EXPERIMENTAL = "gen_ai_latest_experimental"
CLIENT_METRIC_NAMESPACE = "gen_ai.client.operation"
METRIC_CLIENT_DURATION = f"{CLIENT_METRIC_NAMESPACE}.duration"  # latest: embeddings (and other non-inference) only
METRIC_CLIENT_TIME_TO_FIRST_CHUNK = f"{CLIENT_METRIC_NAMESPACE}.time_to_first_chunk"
METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK = f"{CLIENT_METRIC_NAMESPACE}.time_per_output_chunk"
METRIC_CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"  # default only: replaced by the usage counters (PR 374)
# latest: inference operations (chat, text_completion) on gen_ai.client.inference.* (semantic-conventions-genai
# PR 521), token usage on counters by gen_ai.token.modality and per-operation histograms (PR 374)
INFERENCE_METRIC_NAMESPACE = "gen_ai.client.inference"
METRIC_INFERENCE_DURATION = f"{INFERENCE_METRIC_NAMESPACE}.duration"
METRIC_INFERENCE_TIME_TO_FIRST_CHUNK = f"{INFERENCE_METRIC_NAMESPACE}.time_to_first_chunk"
METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK = f"{INFERENCE_METRIC_NAMESPACE}.time_per_output_chunk"
METRIC_USAGE_INPUT_TOKENS = f"{INFERENCE_METRIC_NAMESPACE}.usage.input_tokens"
METRIC_USAGE_OUTPUT_TOKENS = f"{INFERENCE_METRIC_NAMESPACE}.usage.output_tokens"
METRIC_USAGE_CACHE_READ_INPUT_TOKENS = f"{INFERENCE_METRIC_NAMESPACE}.usage.cache_read.input_tokens"
METRIC_USAGE_REASONING_OUTPUT_TOKENS = f"{INFERENCE_METRIC_NAMESPACE}.usage.reasoning.output_tokens"
METRIC_OPERATION_INPUT_TOKENS = f"{INFERENCE_METRIC_NAMESPACE}.operation.input_tokens"
METRIC_OPERATION_OUTPUT_TOKENS = f"{INFERENCE_METRIC_NAMESPACE}.operation.output_tokens"
# The schema URL of our tracers and meters: the GenAI registry has published none yet, so the last core
# semantic-conventions release that held the GenAI conventions as active (1.42 moved them out)
SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.0"
SERVICE_INSTANCE_ID = "service.instance.id"  # one per process on the resources we build (core/providers.py)

# Ours: request-level latencies (seconds) and facts
LATENCY_TTFT = "llm.latency.time_to_first_token"
LATENCY_TPOT = "llm.latency.time_per_output_token"
LATENCY_E2E = "llm.latency.e2e"
LATENCY_QUEUE = "llm.latency.queue"
LATENCY_PREFILL = "llm.latency.prefill"
LATENCY_DECODE = "llm.latency.decode"
# the longest gap between two steps that produced tokens, and the inter-token latencies' bucket counts
# (over the time-per-output-token histogram's boundaries; see core/inter_token.py)
LATENCY_MAX_GAP = "llm.latency.max_inter_token_gap"
LATENCY_ITL_COUNTS = "llm.latency.inter_token.bucket_counts"
NUM_PREEMPTIONS = "llm.request.num_preemptions"
OUTPUT_CHARACTERS = "llm.response.output_characters"
SLO_MET = "llm.slo.met"
SLO_BREACHED = "llm.slo.breached"
# the SLO thresholds the request was judged against (seconds; those set for its model): a breach reads
# against its own objective, even where SLOs differ by model or change between runs
SLO_TTFT = "llm.slo.ttft"
SLO_TPOT = "llm.slo.tpot"
SLO_E2E = "llm.slo.e2e"
SLO_THRESHOLDS = {"ttft": SLO_TTFT, "tpot": SLO_TPOT, "e2e": SLO_E2E}  # objective -> attribute
SAMPLING_REASON = "llm.sampling.reason"
# not "llm.engine": that is the namespace of llm.engine.step.*, and a name may not be both
ENGINE = "llm.engine.name"

# Ours: the client's call span (docs/trace-contract.md, client span). A "chunk" is an update of the
# generated output (the conventions' and ``vllm bench serve``'s): a chat/completions chunk with choices,
# a Responses ``*.delta`` event of any output type; not lifecycle events nor the usage-only chunk.
CLIENT_CHUNKS = "llm.client.chunks"
CLIENT_TIME_TO_FIRST_CONTENT = "llm.client.time_to_first_content"  # first chunk with generated content
CLIENT_OUTPUT_KINDS = "llm.client.output.kinds"  # text, tool_call, refusal, reasoning, other
CLIENT_TIME_PER_OUTPUT_CHUNK = "llm.client.time_per_output_chunk"
CLIENT_TIME_PER_OUTPUT_TOKEN = "llm.client.time_per_output_token"
CLIENT_CHUNK_GAP_MAX = "llm.client.chunk_gap.max"
CLIENT_CHUNK_GAPS_OVER_SLO = "llm.client.chunk_gap.over_slo"
CLIENT_DURATION = "llm.client.duration"
CLIENT_OUTPUT_CHARACTERS = "llm.client.output_characters"
CLIENT_CHARS_PER_SECOND = "llm.client.output.characters_per_second"
CLIENT_STREAM_END = "llm.client.stream.end"  # complete | closed | abandoned | error
CLIENT_SLO_MET = "llm.client.slo.met"
CLIENT_SLO_BREACHED = "llm.client.slo.breached"
CLIENT_REQUESTS = "llm.client.requests"
CLIENT_GOOD_REQUESTS = "llm.client.requests.good"
CLIENT_OVERHEAD_TTFC = "llm.client.overhead.time_to_first_chunk"

# Ours: why a kept request was slow (core/diagnosis/verdict.py, docs/verdict.md).
# ``llm.slow.cause`` is the dominant cause; ``llm.slow.<cause>`` the seconds each cause cost it.
SLOW_QUEUE_MAX_SEQS = "queue_max_seqs"  # waited: the batch held max_num_seqs requests
SLOW_QUEUE_KV_CACHE = "queue_kv_cache"  # waited: the KV cache could not hold it
SLOW_QUEUE_TOKEN_BUDGET = "queue_token_budget"  # waited: the step's token budget was spent
SLOW_PREFILL_INTERFERENCE = "prefill_interference"  # its decode steps carried others' prefill tokens
SLOW_PREEMPTION = "preemption"  # preempted until it caught up
SLOW_BATCH_GROWTH = "batch_growth"  # its decode steps slowed as the batch grew
SLOW_ENGINE_STARVATION = "engine_starvation"  # the engine sat idle between steps while it was pending
# waited: its LoRA adapter was not loaded while max_loras adapters were in use
SLOW_QUEUE_LORA_SLOT = "queue_lora_slot"
SLOW_KV_TRANSFER = "kv_transfer"  # loading (or waiting for) its KV cache took longer than comparable loads
SLOW_UNKNOWN = "unknown"  # the data cannot decide
# the causes outside the batch (issue: grammars, the frontend, a request's own size)
SLOW_QUEUE_STRUCTURED_OUTPUT = "queue_structured_output"  # waited: its structured-output grammar was compiling
SLOW_FRONTEND = "frontend"  # the frontend handed it to the engine later than comparable requests
SLOW_OWN_PREFILL = "own_prefill"  # its own prompt's prefill, beyond a short prompt's
SLOW_OWN_LENGTH = "own_length"  # its own generation's length, beyond what the e2e SLO left it
SLOW_GRAMMAR_INTERFERENCE = "grammar_interference"  # its decode steps waited for others' grammar bitmasks
# the structured-output backend that compiles a request's grammar (request span; the verdict: it has a grammar)
STRUCTURED_OUTPUT_BACKEND = "llm.structured_output.backend"  # xgrammar, guidance, outlines, lm-format-enforcer
# whether its grammar was reused from the backend's cache (request span; instrumentation/vllm/grammar.py's rule)
STRUCTURED_OUTPUT_CACHE_HIT = "llm.structured_output.cache_hit"
# on llm.engine.step: seconds the engine spent computing the step's grammar bitmask, and the requests it covered
STEP_GRAMMAR_TIME = "llm.engine.step.structured_output.bitmask_time"
STEP_GRAMMAR_REQUESTS = "llm.engine.step.structured_output.requests"
# every cause, in the order of their declaration (core/diagnosis/causes.py declares them: a test keeps these equal)
SLOW_CAUSES = (SLOW_QUEUE_MAX_SEQS, SLOW_QUEUE_KV_CACHE, SLOW_QUEUE_TOKEN_BUDGET, SLOW_QUEUE_LORA_SLOT,
               SLOW_QUEUE_STRUCTURED_OUTPUT, SLOW_FRONTEND, SLOW_OWN_PREFILL, SLOW_PREFILL_INTERFERENCE,
               SLOW_GRAMMAR_INTERFERENCE, SLOW_PREEMPTION, SLOW_BATCH_GROWTH, SLOW_OWN_LENGTH,
               SLOW_ENGINE_STARVATION, SLOW_KV_TRANSFER, SLOW_UNKNOWN)
SLOW_CAUSE = "llm.slow.cause"
SLOW_SECONDS_TEMPLATE = "llm.slow.{cause}"
SLOW_SECONDS = {cause: SLOW_SECONDS_TEMPLATE.format(cause=cause) for cause in SLOW_CAUSES}  # seconds per cause
SLO_OBJECTIVE = "llm.slo.objective"  # the objective a breach counted against (ttft, tpot, e2e)

# Ours: the KV hand-off of disaggregated prefill/decode (on the request span and its llm.kv_transfer spans)
KV_TRANSFER_DIRECTION = "llm.kv_transfer.direction"  # load (decode instance) or save (prefill instance)
KV_TRANSFER_CONNECTOR = "llm.kv_transfer.connector"  # the connector's class (ExampleConnector, NixlConnector)
KV_TRANSFER_EXTERNAL_TOKENS = "llm.kv_transfer.external_tokens"  # prompt tokens whose KV was loaded, not computed
KV_TRANSFER_ASYNC = "llm.kv_transfer.async"  # loaded outside the forward pass: the request waited for it
KV_TRANSFER_FAILED = "llm.kv_transfer.failed"  # a failed hand-off (blocks not loaded, a receive failed, a raise)
KV_TRANSFER_FAILED_BLOCKS = "llm.kv_transfer.failed_blocks"  # blocks that failed to load (recomputed)
KV_TRANSFER_ERRORS = "llm.kv_transfer.errors"  # connector calls that raised, and transfers it reported failed
KV_TRANSFER_SAVE_PENDING = "llm.kv_transfer.save_pending"  # the send went on after the request finished
KV_TRANSFER_CONNECTOR_DURATION = "llm.kv_transfer.connector_duration"  # the connector's own transfer timing
KV_TRANSFER_BYTES = "llm.kv_transfer.bytes"  # the connector's own count of bytes moved
LATENCY_KV_LOAD = "llm.latency.kv_load"  # seconds loading (or waiting for) the KV cache: part of the prefill
LATENCY_KV_SAVE = "llm.latency.kv_save"  # seconds saving the KV cache for another instance
KV_LOAD, KV_SAVE = "load", "save"
# llm.sampling.reason of a disaggregated request's prefill half: exported so that the gateway, which sees
# the decode half too, decides; the gateway's sdk_decision policy does not count it as a keep
SAMPLING_REASON_DEFERRED = "kv_handoff"
# Ours: disaggregated serving's router (examples/disagg_proxy.py) and the role of each instance
DISAGG_ROLE = "llm.disagg.role"  # on an engine's request span: the instance's part (prefill, decode, both)
DISAGG_HOP = "llm.disagg.hop"  # on the router's CLIENT spans: which instance this hop went to
DISAGG_ROLE_PREFILL, DISAGG_ROLE_DECODE, DISAGG_ROLE_BOTH = "prefill", "decode", "both"
DISAGG_PREFILL = "llm.disagg.prefill_url"  # on the router span: the instances it routed to
DISAGG_DECODE = "llm.disagg.decode_url"
DISAGG_TTFT = "llm.disagg.time_to_first_token"  # the user's TTFT as the router saw it (seconds)
DISAGG_E2E = "llm.disagg.e2e"  # the user's request, end to end, as the router saw it (seconds)

# Ours: child spans
SPAN_QUEUE = "llm.queue"
SPAN_PREFILL = "llm.prefill"
SPAN_PREFILL_CHUNK = "llm.prefill.chunk"
SPAN_DECODE = "llm.decode"
SPAN_DECODE_STEP = "llm.decode.step"
SPAN_DECODE_WINDOW = "llm.decode.window"
SPAN_REQUEUE = "llm.requeue"
SPAN_REPREFILL = "llm.reprefill"
SPAN_ENGINE_STEP = "llm.engine.step"
SPAN_CHOICE = "llm.choice"  # one sequence of a request that asked for n > 1 choices (parallel sampling)
SPAN_KV_TRANSFER = "llm.kv_transfer"  # the KV hand-off of disaggregated serving: a load (decode side) or a save
EVENT_PREEMPTION = "llm.preemption"
EVENT_ENGINE_QUEUED = "llm.engine.queued"

CHOICE_INDEX = "llm.choice.index"  # on llm.choice: the sequence's index among the n (0 .. n-1)
CHUNK_TOKENS = "llm.prefill.chunk.tokens"
CHUNK_INDEX = "llm.prefill.chunk.index"
STEP_INDEX = "llm.decode.step.index"
STEP_TOKENS = "llm.decode.step.tokens"
ENGINE_STEP_ID = "llm.engine.step.id"
CHUNKS_OMITTED = "llm.prefill.chunks_omitted"  # on llm.prefill: chunk spans the span budget left out
WINDOW_TOKENS = "llm.decode.window.tokens"
WINDOW_FIRST_INDEX = "llm.decode.window.first_index"  # llm.decode.step.index of its first and last step
WINDOW_LAST_INDEX = "llm.decode.window.last_index"
WINDOW_GAP_MEAN = "llm.decode.window.gap.mean"  # seconds per output token
WINDOW_GAP_MAX = "llm.decode.window.gap.max"  # the longest gap between consecutive outputs, seconds
EVENTFUL_COALESCED = "llm.decode.eventful_coalesced"  # on llm.decode: eventful steps the budget put in windows

# Ours: the facts of its engine step, on each llm.decode.step and llm.prefill.chunk span
STEP_DURATION = "llm.engine.step.duration"  # seconds, scheduler entered -> outputs built
STEP_OTHER_PREFILL_TOKENS = "llm.engine.step.other_prefill_tokens"  # other requests' prefill in that step

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
STEP_QUEUE_BLOCKED = "llm.engine.step.queue_blocked"  # why requests stayed waiting: max_seqs, kv_cache, ...

# gen_ai.provider.name values we set. The GenAI registry (semantic-conventions-genai,
# docs/registry/attributes/gen-ai.md) lists no value for vLLM or TensorRT-LLM; it allows a custom
# value then, and we use each engine's Python import name (see docs/engines.md, "TensorRT-LLM").
PROVIDER_VLLM = "vllm"
PROVIDER_TENSORRT_LLM = "tensorrt_llm"
# The engines' own ``llm_request`` spans carry no provider; their tracers' instrumentation scope names it, by
# prefix: vLLM 0.32 ends the span through ``manual_instrument_otel`` (scope ``vllm.tracing.otel``), earlier
# releases through ``init_tracer("vllm.llm_engine", ...)``; TensorRT-LLM ``tracing.init_tracer("trt.llm", ...)``
# (tensorrt_llm/llmapi/llm.py, serve/openai_server.py).
NATIVE_SCOPE_PROVIDERS = (("vllm.", PROVIDER_VLLM), ("trt.llm", PROVIDER_TENSORRT_LLM),
                          ("tensorrt_llm", PROVIDER_TENSORRT_LLM))

# Ours: request facts only TensorRT-LLM reports (its RequestPerfMetrics), on the request span
KV_CACHE_REUSED_BLOCKS = "llm.request.kv_cache.reused_blocks"
KV_CACHE_MISSED_BLOCKS = "llm.request.kv_cache.missed_blocks"
KV_CACHE_ALLOCATED_BLOCKS = "llm.request.kv_cache.allocated_blocks"
KV_CACHE_HIT_RATE = "llm.request.kv_cache.hit_rate"
SPEC_DRAFT_TOKENS = "llm.request.spec_decode.draft_tokens"
SPEC_ACCEPTED_TOKENS = "llm.request.spec_decode.accepted_tokens"
SPEC_ACCEPTANCE_RATE = "llm.request.spec_decode.acceptance_rate"
FIRST_ITER = "llm.request.first_iteration"
LAST_ITER = "llm.request.last_iteration"

# Ours: engine-step attributes only TensorRT-LLM's iteration stats carry (same meaning as vLLM's
# where the names above are shared)
STEP_LATENCY = "llm.engine.step.latency"
STEP_GPU_MEMORY = "llm.engine.step.gpu_memory_usage"
STEP_KV_BLOCKS_USED = "llm.engine.step.kv_cache_blocks_used"
STEP_KV_BLOCKS_MAX = "llm.engine.step.kv_cache_blocks_max"

# Resource of the engine-step traces (kept apart from request traces)
SERVICE_NAME = "service.name"
OPENINFERENCE_PROJECT_NAME = "openinference.project.name"  # how Phoenix assigns traces to projects

# vLLM's own native ``llm_request`` span (read by the collector). The ``gen_ai.latency.*`` ones (vLLM's and
# SGLang's, proposal 408 of the GenAI conventions, not in the registry) are also on our request spans, with
# vLLM's formulas, so dashboards built on vLLM's tracing keep working; ``llm.latency.*`` are the canonical ones.
VLLM_TTFT = "gen_ai.latency.time_to_first_token"
VLLM_E2E = "gen_ai.latency.e2e"
VLLM_QUEUE = "gen_ai.latency.time_in_queue"
VLLM_PREFILL = "gen_ai.latency.time_in_model_prefill"
VLLM_DECODE = "gen_ai.latency.time_in_model_decode"
VLLM_INFERENCE = "gen_ai.latency.time_in_model_inference"  # prefill + decode (first scheduled to last token)
VLLM_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
VLLM_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
VLLM_RESPONSE_MODEL = "gen_ai.response.model"

# Ours: engine-step anatomy (seconds), see core/diagnosis/anatomy.py
STEP_SCHEDULE_TIME = "llm.engine.step.schedule_time"
STEP_EXECUTE_TIME = "llm.engine.step.execute_time"
STEP_MODEL_TIME = "llm.engine.step.model_time"
STEP_OUTPUT_TIME = "llm.engine.step.output_time"
STEP_IDLE_BEFORE = "llm.engine.step.idle_before"
STEP_PART = "llm.engine.step.part"  # metric attribute: schedule | execute | model | output | idle | total
# Ours: engine-step roofline, see core/diagnosis/roofline.py
STEP_FLOPS = "llm.engine.step.flops"
STEP_BYTES = "llm.engine.step.bytes"
STEP_INTENSITY = "llm.engine.step.arithmetic_intensity"
STEP_BOUND = "llm.engine.step.bound"  # compute | memory
STEP_PREDICTED_TIME = "llm.engine.step.predicted_time"
STEP_MFU = "llm.engine.step.mfu"
STEP_MBU = "llm.engine.step.mbu"
STEP_DEVICE = "llm.engine.step.device"
# Ours: the GPU sample nearest the step (NVML), see core/diagnosis/gpu.py
STEP_GPU_UTILIZATION = "llm.engine.step.gpu.utilization"
# GPU memory in use: STEP_GPU_MEMORY above (TensorRT-LLM reports it itself; for vLLM, from NVML)
STEP_GPU_POWER = "llm.engine.step.gpu.power"
STEP_GPU_SM_CLOCK = "llm.engine.step.gpu.sm_clock"
STEP_GPU_THROTTLE = "llm.engine.step.gpu.throttle_reasons"

# OpenTelemetry hardware conventions (hw.*), for the GPU sampler's metrics
HW_ID = "hw.id"
HW_NAME = "hw.name"
HW_TYPE = "hw.type"
HW_VENDOR = "hw.vendor"
GPU_THROTTLE_REASON = "llm.gpu.throttle_reason"

# Ours: speculative decoding (core/spec_decode.py; docs/production-features.md). On the request span, with
# SPEC_DRAFT_TOKENS, SPEC_ACCEPTED_TOKENS and SPEC_ACCEPTANCE_RATE above (shared with TensorRT-LLM):
SPEC_VERIFY_STEPS = "llm.request.spec_decode.verify_steps"  # steps that verified drafts of the request
SPEC_ACCEPTANCE_LENGTH = "llm.request.spec_decode.acceptance_length"  # 1 + accepted / verify steps
# on llm.engine.step: requests that verified drafts, draft tokens scheduled, drafts accepted
STEP_SPEC_DRAFTS = "llm.engine.step.spec_decode.drafts"
STEP_SPEC_DRAFT_TOKENS = "llm.engine.step.spec_decode.draft_tokens"
STEP_SPEC_ACCEPTED_TOKENS = "llm.engine.step.spec_decode.accepted_tokens"
# on llm.decode.step / llm.decode.window: the request's draft tokens verified in that step (window: steps)
STEP_DRAFTED = "llm.decode.step.drafted_tokens"
WINDOW_DRAFTED = "llm.decode.window.drafted_tokens"
SPEC_POSITION = "llm.spec_decode.position"  # metric attribute: the draft position (0-based)
SPEC_TOKEN_KIND = "llm.spec_decode.token.kind"  # metric attribute: drafted | accepted
# on llm.engine.step: seconds in the model runner's drafter (propose_draft_token_ids) in that step
STEP_SPEC_DRAFT_TIME = "llm.engine.step.spec_decode.draft_time"

# Ours: LoRA adapters (vLLM's LoRARequest: name and integer id)
LORA_NAME = "llm.lora.name"  # on the request span, and the adapter label of every per-request metric
LORA_ID = "llm.lora.id"
LORA_OTHER = "other"  # the label value of adapters beyond the label cap (counted in stats())
LORA_MULTIPLE = "multiple"  # the step metrics' adapter label of a step that ran several adapters at once
STEP_LORA_ADAPTERS = "llm.engine.step.lora.adapters"  # names of the adapters the step ran
STEP_LORA_COUNT = "llm.engine.step.lora.active"  # how many adapters the step ran
STEP_LORA_MAX = "llm.engine.step.lora.max"  # the engine's max_loras
# span events (on llm.engine.step, and on the request span whose adapter loaded) of the model runner's cache
LORA_EVENT_LOADED = "llm.lora.loaded"  # an adapter read into the cache in that step
LORA_EVENT_EVICTED = "llm.lora.evicted"  # an adapter dropped from the cache (least recently used, or removed)
LORA_LOAD_TIME = "llm.lora.load_time"  # on a load event: seconds of the load (read, cache insert, slot copy)

# Ours: where cache-read input tokens came from (their sum is USAGE_CACHE_READ_INPUT_TOKENS)
CACHE_READ_LOCAL = "llm.usage.cache_read.local_tokens"  # the engine's own prefix cache
CACHE_READ_EXTERNAL = "llm.usage.cache_read.external_tokens"  # loaded through a KV connector
# the KV cache's element type and block size (tokens), on llm.engine.step
STEP_KV_CACHE_DTYPE = "llm.engine.step.kv_cache.dtype"
STEP_KV_CACHE_BLOCK_SIZE = "llm.engine.step.kv_cache.block_size"

# Ours: SLO operations (tenants, engine time per request, the delay a request's work caused others)
REQUEST_TENANT = "llm.request.tenant"  # on the request span, and the tenant label of every per-request metric
TENANT_OTHER = "other"  # the label value of tenants beyond the label cap (counted in stats())
TENANT_INVALID = "invalid"  # the label value of a tenant value with characters outside the allowed set
# seconds of engine-step time charged to the request: each step's duration split by its share of the step's work
REQUEST_ENGINE_TIME = "llm.request.engine_time"
# seconds of prefill interference other requests lost in steps where this request's prompt was computed
REQUEST_INTERFERENCE_CAUSED = "llm.request.interference_caused"
