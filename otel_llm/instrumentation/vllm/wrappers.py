"""vLLM frontend wrappers: translate vLLM's own events into the core's request timelines.

Every wrapper has one shape: the host's call runs unguarded (its exceptions pass through
untouched), our bookkeeping before and after it is guarded.

Per generated token, nothing: with an agent process (which reads the
engine-step records itself) vLLM's output batches go straight to its own ``process_outputs``; without one,
``process_outputs`` only counts output batches (the engine-step records are read at the first finish of a
batch, or every ``_DRAIN_EVERY`` batches). A request's finish comes from vLLM's own
``_update_stats_from_finished`` (once a request) and its engine events from
``IterationStats.update_from_events`` (only for the outputs that carry events); its token times are
derived at finish, off this thread, from the steps that served it (core/step_tokens.py). Where the
steps cannot give them (speculative decoding, KV connectors, no step records: chosen per engine, by itself)
``process_outputs`` stamps each output: one dict lookup and one list append.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
import time
import weakref
from typing import Any, Callable, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ... import semconv as sc
from ...core.clock import WallClock
from ...core.diagnosis.anatomy import EngineFacts, kv_cache_facts
from ...core.diagnosis.roofline import ModelShape
from ...guard import Guard
from ...core.finish_facts import ERROR_TYPES, EngineStats, FinishFacts, base_summary, summary_of, token_window
from ...core.handoff import HandoffBook
from ...core.pipeline import RequestPipeline
from ...core.summary import RequestSummary
from ...core.timeline import PREEMPTED, QUEUED, RequestGroup, RequestTimeline
from ...core.request_params import sampling_attributes
from ...agent import records
from ...agent.link import CLIENT_ENV
from ..wraps import Binders, is_ours
from . import contract, kv_channel
from .grammar import backend_attribute
from .request_hooks import ENGINE_MODEL_ENV, ENGINE_REQUESTS_ENV, ENRICHED
from .step_transport import StepReceiver

logger = logging.getLogger("otel_llm")

PROVIDER = "vllm"
MAX_MODEL_NAME = 256  # characters of a requested model name kept (the name comes from the client)
# Set by the OpenAI-server handlers (and LLM.chat) for the requests they start.
_OPERATION: contextvars.ContextVar[tuple[str, SpanKind] | None] = contextvars.ContextVar(
    "otel_llm_vllm_operation", default=None)
# Whether the OpenAI request being served asked for a stream (``gen_ai.request.stream``).
_STREAM: contextvars.ContextVar[bool | None] = contextvars.ContextVar("otel_llm_vllm_stream", default=None)
# The model the OpenAI request being served named (``gen_ai.request.model``: an alias, a LoRA adapter).
_MODEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("otel_llm_vllm_model", default=None)
# W3C headers as the HTTP handler passed them, before vLLM drops them when its own tracing is off.
_HEADERS: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_llm_vllm_headers", default=None)
# The (host, port) the HTTP request being served came in on: the instance a request span names.
_SERVER: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar("otel_llm_vllm_server", default=None)
# the request's tenant as the serving layer read it (a header, the OpenAI ``user`` field: core/tenant.py)
_TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("otel_llm_vllm_tenant", default=None)
_PROPAGATOR = TraceContextTextMapPropagator()
# an instance's part in disaggregated serving, from its KV connector's role
_DISAGG_ROLES = {"kv_producer": sc.DISAGG_ROLE_PREFILL, "kv_consumer": sc.DISAGG_ROLE_DECODE,
                 "kv_both": sc.DISAGG_ROLE_BOTH}






class VLLMWrappers:
    def __init__(self, telemetry: RequestPipeline, open_receiver: Callable[[], StepReceiver],
                 open_kv_receiver: Callable[[], kv_channel.HandoffReceiver],
                 engine_built: Callable[[EngineFacts], None] | None = None,
                 receiver: StepReceiver | None = None, open_agent: Callable[[], Any] | None = None) -> None:
        self.telemetry = telemetry
        self.guard = telemetry.guard  # the instrumentor's, which its pipeline was built with
        self.engine_built = engine_built  # the owner keeps the engine's shape (VLLMRuntime.last_engine)
        self.receiver = receiver
        # KV hand-offs (disaggregated serving): records of requests still running, and the socket the
        # EngineCores of engines with a KV connector send them to (bound before such an engine spawns)
        self.kv_book = HandoffBook()
        self.kv_receiver: kv_channel.HandoffReceiver | None = None
        self.open_kv_receiver = open_kv_receiver
        # the process's step socket, from its owner (the instrumentor: it outlives this object)
        self.open_receiver = open_receiver
        self.steps_armed = False  # set once the EngineCore-side hooks are armed for this process
        self.building = 0  # engine clients (LLMEngine, AsyncLLM) being built in this process now
        # the agent process that does the telemetry's work (otel_llm/agent/link.AgentLink), once started: it
        # reads the step records itself, so then this process has no receiver and reads no step
        self.open_agent = open_agent
        self.agent: Any = None
        self.bind = Binders()
        self._told_log_stats = False
        self.fence: contract.Contract | None = None  # the instrumentor's (contract.py)
        self._undrained = 0  # output batches since the step records were last read (token times from steps)
        self._reads: FrontendReads | None = None  # vLLM's symbols through the fence, resolved at the first request
        # output processors whose process_outputs goes straight to vLLM's (an agent's engines), until restore()
        self._passed: weakref.WeakSet[Any] = weakref.WeakSet()
        # the one path (docs/design/enginecore-source.md): the engines launched for an engine client with an
        # agent send their requests' records, and this frontend holds what it read of each request only to send
        # its enrichment when it lets it go
        self._enriched_launch = False  # set by launching_engines for the engine client being built
        self.enriching: dict[str, HeldRequest] = {}

    # -- engine construction -----------------------------------------------------------------

    def engine_init(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """Turn on vLLM's per-request statistics (our timings are the engine's own) and note the model."""
        try:
            b = self.bind(wrapped)
            if not b.get(args, kwargs, "log_stats", True):
                args, kwargs = b.set(args, kwargs, "log_stats", True)
                if not self._told_log_stats:
                    self._told_log_stats = True
                    logger.info("otel-llm: turned on vLLM's per-request statistics (log_stats=True); "
                                "the request timings we report are vLLM's own")
        except Exception as exc:
            self.guard.failed("vllm engine __init__ (before)", exc)
        if self.fence is not None:
            # an engine is being built: the EngineCore side's modules (light ones: the scheduler's) are worth
            # importing to check them here, where the user reads the log; the frontend's are checked as the
            # host imports them, the model runner's (a heavy import) only where it is imported
            try:
                self.fence.check_all(sides=(contract.ENGINE,))
            except Exception as exc:
                self.guard.failed("vllm contract", exc)
        if self.steps_armed and self.agent is None and self.open_agent is not None:
            try:  # before the EngineCore starts sending: the agent binds the step socket (in place of ours)
                if self._agent_fits(wrapped, args, kwargs):
                    # which API server this is (AsyncLLM's ``client_index``; 0 elsewhere): its agent keeps
                    # the engine records of this one's requests
                    os.environ[CLIENT_ENV] = str(int(self.bind(wrapped).get(args, kwargs, "client_index", 0) or 0))
                    self.agent = self.open_agent()
                    if self.agent is not None:
                        self.receiver = None
            except Exception as exc:
                self.guard.failed("vllm agent", exc)
        if self.steps_armed and self.receiver is None and self.agent is None:
            try:  # before the EngineCore starts sending: this process's socket in the step directory
                self.receiver = self.open_receiver()
            except Exception as exc:
                self.guard.failed("vllm step receiver", exc)
        if self.kv_receiver is None:
            try:
                vllm_config = self.bind(wrapped).get(args, kwargs, "vllm_config")
                if self._fence().read(vllm_config, "VllmConfig.kv_transfer_config") is not None:
                    self.kv_receiver = self.open_kv_receiver()
            except Exception as exc:
                self.guard.failed("vllm kv hand-off receiver", exc)
        self.building += 1
        try:
            result = wrapped(*args, **kwargs)
        finally:
            self.building -= 1
        try:  # an engine client of engines launched elsewhere (one of several API servers): as they were launched
            b = self.bind(wrapped)
            if not self._enriched_launch and b.get(args, kwargs, "client_addresses") is not None:
                self._enriched_launch = self._launched_enriched(b.get(args, kwargs, "vllm_config"))
        except Exception as exc:
            self.guard.failed("vllm engine __init__ (after)", exc)
        try:
            fence = self._fence()
            model_config = instance.vllm_config.model_config
            name = fence.read(model_config, "ModelConfig.served_model_name") or model_config.model
            if isinstance(name, (list, tuple)):
                name = name[0] if name else model_config.model
            instance.output_processor._otel_llm_model = str(name)
            kv = fence.read(instance.vllm_config, "VllmConfig.kv_transfer_config")
            instance.output_processor._otel_llm_disagg_role = _DISAGG_ROLES.get(fence.read(kv, "KVTransferConfig.kv_role"))
        except Exception as exc:
            self.guard.failed("vllm engine __init__ (after)", exc)
        try:
            self._setup_diagnosis(instance.vllm_config)
        except Exception as exc:
            self.guard.failed("vllm step diagnosis set-up", exc)
        try:
            setattr(instance.output_processor, _STEPS_CAN_GIVE_TOKENS, self._steps_can_give_tokens(instance.vllm_config))
            if self._enriched_launch:  # its EngineCores say its requests: this frontend enriches them
                setattr(instance.output_processor, _ENRICHES, True)
        except Exception as exc:
            self.guard.failed("vllm token times from steps", exc)
        finally:
            self._enriched_launch = False
        return result

    def launching_engines(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """``CoreEngineProcManager.__init__``: this process is about to spawn EngineCores. Where no Python
        engine client will hold their requests (the Rust frontend's supervisor, ``--headless``), the
        EngineCores become their requests' source: this process's agent is opened before they spawn (it
        binds the step socket their sink looks for), and they inherit the switch that arms their request
        hooks (request_hooks.py). docs/design/enginecore-source.md."""
        try:
            b = self.bind(wrapped)
            vllm_config = b.get(args, kwargs, "vllm_config")
            if self.building == 0 and _no_python_frontend(b.get(args, kwargs, "local_client", True)):
                self._become_source(vllm_config)
            elif self.building:
                self._enrich_engines(vllm_config)
            else:  # the supervisor of several Python API servers: they enrich, each its own requests
                self._enrich_api_servers(vllm_config)
        except Exception as exc:
            self.guard.failed("vllm engine launch", exc)
        return wrapped(*args, **kwargs)

    def _enrich_engines(self, vllm_config: Any) -> None:
        """The one path: the EngineCores a Python engine client being built here launches
        say their requests' starts and finishes to its agent, and this frontend enriches each request
        (agent/records.RequestEnrichment). Only where the agent reads the steps and they give the token times
        (no speculative decoding, no KV connector); elsewhere, and for every other launch, the frontend's hooks
        stay the source and the EngineCores send nothing (the variable is cleared: inherited, it would count
        the requests twice)."""
        self._enriched_launch = self.agent is not None and self._enriches(vllm_config)
        self._launch_enriched(self._enriched_launch, vllm_config)

    def _enrich_api_servers(self, vllm_config: Any) -> None:
        """``vllm serve --api-server-count N``: the engines launched here serve N Python API servers, spawned
        after them (they inherit the variables set now). Each API server whose agent reads the steps enriches
        its own requests (``engine_init``), and its agent keeps the engine records of its ``client_index``
        only (agent/process.py): every engine record reaches every API server's agent. The supervisor has no
        agent of its own; an API server without one takes no request record (its receiver reads steps only)
        and stays its requests' source."""
        self._launch_enriched(self._enriches(vllm_config), vllm_config)

    def _launched_enriched(self, vllm_config: Any) -> bool:
        """An engine client of engines launched by another process (an API server of several, its
        supervisor's): whether this frontend enriches its requests. Where the launch asked the engines for
        enriched records (``_enrich_api_servers``: the variable, inherited) and this one's agent reads them;
        otherwise its hooks are the source (without an agent, no process takes the engines' request records)."""
        return (self.agent is not None and os.environ.get(ENGINE_REQUESTS_ENV) == ENRICHED
                and self._enriches(vllm_config))

    def _enriches(self, vllm_config: Any) -> bool:
        """Whether the one path applies to an engine of ``vllm_config`` (an agent aside): its steps reach an
        agent and give the token times (no speculative decoding, no KV connector)."""
        return self.steps_armed and vllm_config is not None and self._steps_can_give_tokens(vllm_config)

    def _launch_enriched(self, enriched: bool, vllm_config: Any) -> None:
        if enriched:
            os.environ[ENGINE_REQUESTS_ENV] = ENRICHED
            os.environ[ENGINE_MODEL_ENV] = self._served_name(vllm_config)
        else:
            os.environ.pop(ENGINE_REQUESTS_ENV, None)

    def _served_name(self, vllm_config: Any) -> str:
        model_config = vllm_config.model_config
        name = self._fence().read(model_config, "ModelConfig.served_model_name") or model_config.model
        if isinstance(name, (list, tuple)):
            name = name[0] if name else model_config.model
        return str(name)

    def _become_source(self, vllm_config: Any) -> None:
        if vllm_config is None:
            return
        if not self.steps_armed:
            self.guard.warn_once("engine source: steps", "otel-llm: vLLM's engines here have no Python frontend (Rust "
                                 "frontend or --headless), and engine steps are off (engine_steps=False): their "
                                 "requests are read from the EngineCore's steps, so there is no request telemetry")
            return
        if not self._steps_can_give_tokens(vllm_config):
            self.guard.warn_once("engine source: token times", "otel-llm: vLLM's engines here have no Python frontend, and "
                                 "speculative decoding or a KV connector keeps their token times from the steps: "
                                 "no request telemetry for them")
            return
        if self.agent is None and self.open_agent is not None:
            self.agent = self.open_agent()
        if self.agent is None:
            self.guard.warn_once("engine source: agent", "otel-llm: vLLM's engines here have no Python frontend (Rust "
                                 "frontend or --headless): their request telemetry needs the agent process, which "
                                 "needs OTLP providers as OTEL_* configures them (or it did not start): none")
            return
        self.agent.watch()  # nothing is sent to it per request here: a thread notices its death
        os.environ[ENGINE_REQUESTS_ENV] = "1"  # inherited by the EngineCores spawned next
        os.environ[ENGINE_MODEL_ENV] = self._served_name(vllm_config)
        try:
            self._setup_diagnosis(vllm_config)  # the roofline's inputs, to the agent
        except Exception as exc:
            self.guard.failed("vllm step diagnosis set-up", exc)

    def _steps_can_give_tokens(self, vllm_config: Any) -> bool:
        """Whether this engine's token times can come from its step records (core/step_tokens.py) instead
        of a stamp per output: each share makes at most one token (no speculative decoding), the prompt's
        cache reads have one source (no KV connector), and vLLM's finish and event hooks are there
        (contract.py). Kept on the engine's output processor: an engine outlives instrumenting again."""
        fence = self._fence()
        if fence.read(vllm_config, "VllmConfig.speculative_config") is not None:
            return False
        if fence.read(vllm_config, "VllmConfig.kv_transfer_config") is not None:
            return False
        return all(map(fence.available, _STEP_TOKEN_HOOKS))

    def _from_steps(self, processor: Any) -> bool:
        """Whether ``processor``'s requests take their token times from steps under this instrumentation:
        the engine allows it, and its steps reach this process (or its agent)."""
        return (self.steps_armed
                and (self.receiver is not None or self.agent is not None)
                and getattr(processor, _STEPS_CAN_GIVE_TOKENS, False))

    def _agent_fits(self, wrapped: Any, args: tuple, kwargs: dict) -> bool:
        """Whether the engine being built can have its telemetry done by an agent process: its EngineCore is
        spawned (its steps then reach any process through the step directory: an in-process engine's go
        straight to this process's pipeline), and its token times come from its steps."""
        b = self.bind(wrapped)
        # LLMEngine's ``multiprocess_mode`` (VLLM_ENABLE_V1_MULTIPROCESSING); AsyncLLM has none: always
        # spawned. A release without the parameter reads as in-process: no agent, as before there was one
        if "multiprocess_mode" in b.positions or "multiprocess_mode" in kwargs:
            if not b.get(args, kwargs, "multiprocess_mode", False):
                return False
        vllm_config = b.get(args, kwargs, "vllm_config")
        return vllm_config is not None and self._steps_can_give_tokens(vllm_config)

    def _setup_diagnosis(self, vllm_config: Any) -> None:
        """The roofline's model shape and devices, from the engine's own configuration."""
        read = self._fence().read  # each a contract entry (ROOFLINE, LORA_STEPS): None where a release lacks it
        model_config = vllm_config.model_config
        cache_config = read(vllm_config, "VllmConfig.cache_config")
        cache_dtype = read(cache_config, "CacheConfig.cache_dtype")
        shape = ModelShape.from_hf_config(model_config.hf_config, model_config.dtype, cache_dtype)
        device_type = read(read(vllm_config, "VllmConfig.device_config"), "DeviceConfig.device_type")
        parallel = read(vllm_config, "VllmConfig.parallel_config")
        devices = (read(parallel, "ParallelConfig.tensor_parallel_size") or 1) * \
            (read(parallel, "ParallelConfig.pipeline_parallel_size") or 1)
        max_loras = read(read(vllm_config, "VllmConfig.lora_config"), "LoRAConfig.max_loras")
        kv_cache = kv_cache_facts(cache_dtype, read(cache_config, "CacheConfig.block_size"), model_config.dtype)
        engine = EngineFacts(shape, device_type == "cuda", devices, max_loras, kv_cache)
        if self.engine_built is not None:
            self.engine_built(engine)
        # with an agent, the roofline (and an NVIDIA GPU's sampler) live in the agent process
        self.telemetry.engine_built(engine)

    # -- request context: operation, kind and the incoming trace headers ----------------------

    def serving(self, operation: str) -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            # Not reset afterwards: a streamed response's generation runs after the handler
            # returns, in this request's task (or a copy of its context).
            _OPERATION.set((operation, SpanKind.SERVER))
            try:
                b = self.bind(wrapped)
                api_request = b.get(args, kwargs, "request")
                stream = getattr(api_request, "stream", None)
                _STREAM.set(stream if isinstance(stream, bool) else None)
                model = getattr(api_request, "model", None)
                _MODEL.set(model[:MAX_MODEL_NAME] if isinstance(model, str) and model else None)
                raw_request = b.get(args, kwargs, "raw_request")
                server = getattr(raw_request, "scope", {}).get("server")
                _SERVER.set((str(server[0])[:records.MAX_TEXT], int(server[1])) if server and len(server) == 2 else None)
                tenants = self.telemetry.config.tenant
                if tenants.reads_request:
                    _TENANT.set(tenants.from_request(getattr(raw_request, "headers", None),
                                                     getattr(api_request, "user", None)))
            except Exception as exc:
                self.guard.failed(f"vllm serving {operation}", exc)
            return _streams_keep_operation(wrapped(*args, **kwargs), operation)
        return wrapper

    def offline(self, operation: str) -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            token = _OPERATION.set((operation, SpanKind.INTERNAL))
            try:
                return wrapped(*args, **kwargs)
            finally:
                _OPERATION.reset(token)
        return wrapper

    def async_add_request(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        headers = None
        try:
            headers = self.bind(wrapped).get(args, kwargs, "trace_headers")
        except Exception as exc:
            self.guard.failed("AsyncLLM.add_request", exc)

        async def call() -> Any:
            token = _HEADERS.set(headers)
            try:
                return await wrapped(*args, **kwargs)
            finally:
                _HEADERS.reset(token)
        return call()

    # -- the request lifecycle ----------------------------------------------------------------

    def add_request(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        try:
            b = self.bind(wrapped)
            request = b.get(args, kwargs, "request")
            if self.agent is not None and getattr(instance, _ENRICHES, False):
                self._hold(instance, request, b, args, kwargs)
                return result
            rid = request.request_id
            if rid in self.telemetry.requests:  # a streaming-input continuation of a known request
                return result
            t = self._timeline(instance, request, b.get(args, kwargs, "prompt"))
            parent = b.get(args, kwargs, "parent_req")
            if parent is not None:  # one of the n sequences vLLM fans a request with n > 1 out to
                t.group = _group_of(parent)
                t.choice_index = b.get(args, kwargs, "request_index")
            self.telemetry.start(t)
        except Exception as exc:
            self.guard.failed("OutputProcessor.add_request", exc)
        return result

    def _served(self, processor: Any, request: Any, lora_name: str | None) -> tuple[str, SpanKind, dict[str, Any]]:
        """What the serving layer knows of ``request``: its operation, span kind and attributes (stream,
        requested model, server, disaggregated role, tenant). Each value bounded where it is read (the
        requested model here, the server in ``serving``, the tenant by core/tenant.clean), at most six."""
        operation, kind = _OPERATION.get() or (None, SpanKind.INTERNAL)
        if operation is None:  # offline generate/encode: what the request itself says it is
            pooling = request.sampling_params is None and getattr(request, "pooling_params", None) is not None
            operation = "embeddings" if pooling else "text_completion"
        attrs: dict[str, Any] = {}
        server = kind is SpanKind.SERVER
        if server:
            if _STREAM.get():  # as the client side: set only when streaming
                attrs[sc.REQUEST_STREAM] = True
            asked = _MODEL.get()
            if asked is not None:  # what the client asked for (the served model or adapter: gen_ai.response.model)
                attrs[sc.REQUEST_MODEL] = asked
            address = _SERVER.get()
            if address is not None:  # which instance served it (disaggregated serving: P or D)
                attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = address
        role = getattr(processor, "_otel_llm_disagg_role", None)
        if role is not None:
            attrs[sc.DISAGG_ROLE] = role
        tenant = self.telemetry.config.tenant.resolve(_TENANT.get() if server else None, lora_name)
        if tenant is not None:  # cleaned (core/tenant.py): on the request span, and its metrics' label
            attrs[sc.REQUEST_TENANT] = tenant
        return operation, kind, attrs

    def _lora(self, request: Any) -> tuple[str | None, int | None]:
        """The LoRA adapter of ``request`` (vLLM's LoRARequest): its name and integer id, or (None, None)."""
        reads = self.reads()
        lora = request.lora_request if reads.lora else None
        if lora is None:
            return None, None
        return str(reads.lora_name(lora) or lora.lora_int_id), int(lora.lora_int_id)

    def _timeline(self, processor: Any, request: Any, prompt: str | None) -> RequestTimeline:
        reads = self.reads()
        lora_name, lora_id = self._lora(request)
        operation, kind, attrs = self._served(processor, request, lora_name)
        params = request.sampling_params
        if params is not None:
            attrs.update(sampling_attributes(params))
            backend = backend_attribute(params, self._fence())  # a grammar to compile: queue_structured_output
            if backend is not None:
                attrs[sc.STRUCTURED_OUTPUT_BACKEND] = backend
        ids = request.prompt_token_ids
        t = RequestTimeline(
            request_id=request.request_id,
            arrival=request.arrival_time,
            model=getattr(processor, "_otel_llm_model", None),
            operation=operation,
            provider=PROVIDER,
            kind=kind,
            parent=_parent_context(request),
            response_id=reads.external_req_id(request) or request.request_id,
            request_attributes=attrs,
            input_tokens=len(ids) if ids is not None else None,
        )
        t.lora_name, t.lora_id = lora_name, lora_id
        t.native = processor.request_states.get(request.request_id)
        t.steps_give_tokens = self._from_steps(processor)
        if self.telemetry.config.capture_content:
            t.prompt_text = prompt
        return t

    def _fence(self) -> contract.Contract:
        if self.fence is None:  # not under an instrumentor (tests): a contract of its own
            self.fence = contract.Contract(guard=self.guard)
        return self.fence

    def reads(self) -> "FrontendReads":
        """The fence's readers for the request path's symbols, once: at the first request, when vLLM's engine
        modules are imported (and checked), not per request."""
        reads = self._reads
        if reads is None:
            reads = self._reads = FrontendReads.of(self._fence())
        return reads

    def _drain_steps(self) -> None:
        """The step records that arrived, into the pipeline."""
        self._undrained = 0
        receiver = self.receiver
        if receiver is not None:
            try:
                receiver.drain(self.telemetry.add_step)
            except Exception as exc:
                self.guard.failed("step receiver", exc)

    def process_outputs(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        from_steps = self._from_steps(instance)
        if from_steps and self.agent is not None:  # the agent reads the steps; finishes and events: own hooks
            self._pass_through(instance)
            return wrapped(*args, **kwargs)
        if from_steps:
            # Token times from steps: nothing needs this batch's step records before a request finishes, so
            # they are read in bulk (warm: one cache-cold start instead of one a batch) at the first finish of
            # an output batch, or every _DRAIN_EVERY batches, so that the ring never fills
            self._undrained += 1
            if self._undrained >= _DRAIN_EVERY:
                self._drain_steps()
        else:
            self._drain_steps()
        if self.kv_receiver is not None:
            try:
                self.kv_receiver.drain(self.kv_book.add)
            except Exception as exc:
                self.guard.failed("kv hand-off receiver", exc)
        result = wrapped(*args, **kwargs)
        if from_steps:
            return result  # finishes and events come from their own hooks; token times from the steps
        try:
            b = self.bind(wrapped)
            ts = b.get(args, kwargs, "engine_core_timestamp") or time.monotonic()
            finished = record_outputs(self.telemetry.requests, instance.request_states,
                                      b.get(args, kwargs, "engine_core_outputs"), ts, self.reads())
            if finished:
                stats = b.get(args, kwargs, "iteration_stats")
                now = stats.iteration_timestamp if stats is not None else time.time()
                for t, reason in finished:
                    self._finish(t, str(reason) if reason is not None else "stop", now)
        except Exception as exc:
            self.guard.failed("OutputProcessor.process_outputs", exc)
        return result

    def _pass_through(self, processor: Any) -> None:
        """An engine whose agent reads its steps needs nothing of its output batches: its later calls go
        straight to vLLM's ``process_outputs`` (bound on the processor itself), not through ours, ~4 calls of
        our code a 128-token request fewer on vLLM's output thread. Only where ours is the class's outermost
        wrapper: another library's wrapper above it keeps running. ``restore`` hooks them again."""
        try:
            ours = type(processor).__dict__.get("process_outputs")
            if is_ours(ours) and not is_ours(ours.__wrapped__):
                processor.process_outputs = ours.__wrapped__.__get__(processor, type(processor))
                self._passed.add(processor)
        except Exception as exc:
            self.guard.failed("OutputProcessor.process_outputs (pass-through)", exc)

    def restore(self) -> None:
        """Undo ``_pass_through``: the processors' output batches go through the class's method again."""
        for processor in list(self._passed):
            try:
                processor.__dict__.pop("process_outputs", None)
            except Exception as exc:
                self.guard.failed("OutputProcessor.process_outputs (restore)", exc)
        self._passed.clear()

    def finished(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """``OutputProcessor._update_stats_from_finished``: once per request vLLM lets go of, after it left
        ``request_states``, with the reason (a stop string the detokenizer found included)."""
        result = wrapped(*args, **kwargs)
        if self.enriching:
            try:
                b = self.bind(wrapped)
                state = b.get(args, kwargs, "req_state")
                held = self.enriching.pop(state.request_id, None)
                if held is not None:
                    reason = b.get(args, kwargs, "finish_reason")
                    stats = b.get(args, kwargs, "iteration_stats")
                    now = stats.iteration_timestamp if stats is not None else time.time()
                    self._enrich(held, str(reason) if reason is not None else "stop", now, state)
                    return result
            except Exception as exc:
                self.guard.failed("OutputProcessor._update_stats_from_finished (enrichment)", exc)
        if self._from_steps(instance):
            try:
                b = self.bind(wrapped)
                t = self.telemetry.requests.get(b.get(args, kwargs, "req_state").request_id)
                if t is not None:
                    if self._undrained:  # its steps, and every step before this output batch, are in the ring
                        self._drain_steps()
                    reason = b.get(args, kwargs, "finish_reason")
                    stats = b.get(args, kwargs, "iteration_stats")
                    now = stats.iteration_timestamp if stats is not None else time.time()
                    self._finish(t, str(reason) if reason is not None else "stop", now)
            except Exception as exc:
                self.guard.failed("OutputProcessor._update_stats_from_finished", exc)
        return result

    def engine_events(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """``IterationStats.update_from_events``: the engine events (queued, scheduled, preempted) of an
        output that carries some; vLLM calls it for those outputs only."""
        result = wrapped(*args, **kwargs)
        try:
            requests = self.telemetry.requests
            if not requests:  # (none on the one path: the engine's records carry its events)
                return result
            b = self.bind(wrapped)
            t = requests.get(b.get(args, kwargs, "req_id"))
            if t is not None and t.steps_give_tokens:  # (stamped requests take them in record_outputs)
                t.events += [(int(e.type), e.timestamp) for e in b.get(args, kwargs, "events")]
        except Exception as exc:
            self.guard.failed("IterationStats.update_from_events", exc)
        return result

    def abort_requests(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        try:
            if result and self._undrained:
                self._drain_steps()  # (token times from steps: the records an output batch left unread)
            now = time.time()
            enriching = self.enriching
            for rid in result or ():
                t = self.telemetry.requests.get(rid)
                if t is not None:
                    self._finish(t, "abort", now)
                elif enriching and (held := enriching.pop(rid, None)) is not None:
                    self._enrich(held, "abort", now, None)  # (the engine's finish counts its tokens)
        except Exception as exc:
            self.guard.failed("OutputProcessor.abort_requests", exc)
        return result

    def _hold(self, processor: Any, request: Any, b: Any, args: tuple, kwargs: dict) -> None:
        """The one path's start: nothing is sent (the EngineCore says the request's start, with its sampling
        parameters, prompt length, adapter and trace headers); what only this frontend reads as the request
        comes in is held, as its enrichment's fields, until it lets the request go. No timeline: nothing of
        it but those fields would ever be read."""
        enriching = self.enriching
        rid = request.request_id
        if rid in enriching:  # a streaming-input continuation of a held request
            return
        parent_req = b.get(args, kwargs, "parent_req")
        group = _group_of(parent_req) if parent_req is not None else None  # one of the n sequences of n > 1
        telemetry = self.telemetry
        if len(enriching) >= telemetry.config.max_requests:
            telemetry.counts.requests_untracked += 1  # its engine records still count it, in the agent
            if group is not None:
                group.expected -= 1
            return
        operation, kind, attrs = self._served(processor, request, self._lora(request)[0])
        fields: dict[str, Any] = {"request_id": rid, "operation": operation,
                                  "response_id": self.reads().external_req_id(request) or rid,
                                  "model": getattr(processor, "_otel_llm_model", None)}
        if kind is SpanKind.SERVER:  # (the defaults, offline: INTERNAL, no attributes)
            fields["server"] = True
        if attrs:
            fields["attributes"] = attrs
        context = _parent_context(request)
        if context is not None:  # (W3C headers: injected only where there is a parent)
            headers: dict[str, str] = {}
            _PROPAGATOR.inject(headers, context=context)
            fields["parent"] = records.bound_headers(headers)
        if telemetry.config.capture_content:
            fields["prompt_text"] = b.get(args, kwargs, "prompt")
        enriching[rid] = HeldRequest(fields, group, b.get(args, kwargs, "request_index") if group is not None else None)
        telemetry.counts.requests_started += 1

    def _enrich(self, held: "HeldRequest", reason: str, now_wall: float, state: Any) -> None:
        """The one path's finish: what only this frontend knows of the request, as one record to the agent
        (records.RequestEnrichment, its fields at their defaults left out)."""
        values = held.fields
        values["reason"] = reason
        values["end"] = now_wall
        st = getattr(state, "stats", None)
        if st is not None:
            values["output_tokens"] = int(st.num_generation_tokens)
            # when this frontend received the first and last output
            values["first_output"], values["last_output"] = output_receipts(st, reason, now_wall)
        text = getattr(getattr(state, "detokenizer", None), "output_text", None)
        if isinstance(text, str):
            values["output_characters"] = len(text)
            if self.telemetry.config.capture_content:
                values["output_text"] = text
        group = held.group
        if group is not None:
            values["group_id"], values["group_size"] = group.group_id, group.choice_count
            values["group_expected"], values["choice_index"] = group.expected, held.choice_index
        self.telemetry.counts.requests_finished += 1
        self.agent.send(records.encode_enrichment(values))

    def _finish(self, t: RequestTimeline, reason: str, now_wall: float) -> None:
        t.finish_reason = reason
        state = t.native
        t.native = None  # release vLLM's object now
        st = getattr(state, "stats", None)
        detok = getattr(state, "detokenizer", None)
        text = getattr(detok, "output_text", None)
        if not isinstance(text, str):
            text = None
        first_output, last_output = output_receipts(st, reason, now_wall)
        if st is not None and t.steps_give_tokens and self.agent is not None and self.kv_receiver is None:
            # the engine's numbers as they are: the summary is made in the agent (core/finish_facts.py); its
            # token times come from the steps there (stamped ones travel in a FINISH)
            self.telemetry.finish_facts(FinishFacts(
                t.request_id, reason, now_wall, t.events, t.cache_sources, getattr(state, "num_cached_tokens", None),
                len(text) if text is not None else None, text if self.telemetry.config.capture_content else None,
                t.model, t.operation, t.provider, t.input_tokens, t.arrival, engine_stats(st, self.reads()),
                first_output, last_output))
            return
        t.first_output, t.last_output = first_output or None, last_output or None
        t.handoff = self.kv_book.pop(t.request_id)
        if t.steps_give_tokens and st is not None:
            token_window(t, engine_stats(st, self.reads()), getattr(state, "num_cached_tokens", None))
        summary = summarize(t, state, now_wall, self.reads(), self.guard)
        summary.error_type = ERROR_TYPES.get(reason)
        if text is not None:
            summary.output_characters = len(text)
            if self.telemetry.config.capture_content:
                t.output_text = text
        self.telemetry.finish(t.request_id, summary)


class HeldRequest:
    """A request this frontend enriches (the one path), from its start until it lets it go: its
    enrichment's fields read at the start (agent/records.RequestEnrichment's, by name, bounded as
    ``records.encode`` bounds them), and its n > 1 group, read at the finish (a later sibling refused over
    ``max_requests`` lowers what the group expects)."""

    __slots__ = ("fields", "group", "choice_index")

    def __init__(self, fields: dict[str, Any], group: RequestGroup | None, choice_index: int | None) -> None:
        self.fields, self.group, self.choice_index = fields, group, choice_index


_DRAIN_EVERY = 32  # output batches at most between reads of the step records (a ring holds hundreds of steps)
# vLLM's hooks the stamp-free frontend needs (contract.py entries), and whether an engine allows it
_STEPS_CAN_GIVE_TOKENS = "_otel_llm_steps_give_tokens"
_STEP_TOKEN_HOOKS = ("OutputProcessor._update_stats_from_finished", "IterationStats.update_from_events")
_ENRICHES = "_otel_llm_enriches"  # on an engine's output processor: its EngineCores say its requests


def output_receipts(st: Any, reason: str, now_wall: float) -> tuple[float, float]:
    """When this frontend received the request's first and last output (wall clock; 0.0: not received): vLLM's
    own stamps, where its TTFT and e2e end (the output batch's ``iteration_timestamp``: the first as arrival +
    ``first_token_latency``, the last as the finishing batch's, ``now_wall``). O(1) a request: read at finish.
    An abort is no output, and an engine without statistics took no first receipt."""
    first = 0.0
    if st is not None and st.first_token_latency > 0 and st.arrival_time:
        first = st.arrival_time + st.first_token_latency
    return first, (now_wall if reason != "abort" and first else 0.0)


def engine_stats(st: Any, reads: "FrontendReads") -> EngineStats:
    """vLLM's ``RequestStateStats`` as the core's record of an engine's per-request statistics."""
    return EngineStats(st.arrival_time, st.queued_ts, st.scheduled_ts, st.first_token_ts, st.last_token_ts,
                       st.first_token_latency, st.num_generation_tokens, reads.num_preemptions(st))


def _group_of(parent: Any) -> RequestGroup:
    """The one ``RequestGroup`` of a vLLM ``ParentRequest``, kept on it: it lives exactly as long as
    vLLM's fan-out does, and every child added with that parent finds it."""
    group = getattr(parent, _GROUP_ATTR, None)
    if group is None:
        n = parent.n
        group = RequestGroup(group_id=parent.request_id, choice_count=n, expected=n)
        setattr(parent, _GROUP_ATTR, group)
    return group


_GROUP_ATTR = "_otel_llm_group"


async def _streams_keep_operation(call: Any, operation: str) -> Any:
    result = await call
    if inspect.isasyncgen(result):
        return OperationStream(result, operation, tuple((var, var.get()) for var in _HANDLER_SET))
    return result


# what the serving handler set (``VLLMWrappers.serving``) that the request's start reads: a stream carries it
# to the task that streams the body
_HANDLER_SET = (_STREAM, _MODEL, _SERVER, _TENANT)


class OperationStream:
    """A streamed response, which adds its request to the engine on its first iteration, in the task that
    streams the body (Starlette's), whose context lacks what the handler set: set there, at the first
    ``__anext__`` (the stream flag, the model asked for, the server, the tenant). Every later chunk is the
    response's own ``__anext__``, handed back as is: no frame of ours per streamed token (an async generator
    re-yielding each chunk would add work per token)."""

    __slots__ = ("_gen", "_operation", "_carried", "_first")

    def __init__(self, gen: Any, operation: str, carried: tuple[tuple[contextvars.ContextVar, Any], ...]) -> None:
        self._gen, self._operation, self._carried, self._first = gen, operation, carried, True

    def __aiter__(self) -> "OperationStream":
        return self

    def __anext__(self) -> Any:
        if self._first:
            self._first = False
            _OPERATION.set((self._operation, SpanKind.SERVER))
            for var, value in self._carried:
                var.set(value)
        return self._gen.__anext__()

    def asend(self, value: Any) -> Any:
        return self._gen.asend(value)

    def athrow(self, *args: Any) -> Any:
        return self._gen.athrow(*args)

    def aclose(self) -> Any:
        return self._gen.aclose()


class FrontendReads(NamedTuple):
    """The contract's readers (contract._FALLBACKS) for what the request path reads with a fallback, and
    whether the features without one are there."""
    prefill_stats: Callable[[Any], Any]  # EngineCoreOutput.prefill_stats
    local_cached: Callable[[Any], Any]  # PrefillStats.num_local_cached_tokens
    external_cached: Callable[[Any], Any]  # PrefillStats.num_external_cached_tokens
    external_req_id: Callable[[Any], Any]  # EngineCoreRequest.external_req_id
    num_preemptions: Callable[[Any], Any]  # RequestStateStats.num_preemptions
    lora_name: Callable[[Any], Any]  # LoRARequest.lora_name
    lora: bool  # EngineCoreRequest.lora_request and LoRARequest.lora_int_id

    @classmethod
    def of(cls, fence: contract.Contract) -> "FrontendReads":
        r = fence.reader
        return cls(r("EngineCoreOutput.prefill_stats"), r("PrefillStats.num_local_cached_tokens"),
                   r("PrefillStats.num_external_cached_tokens"), r("EngineCoreRequest.external_req_id"),
                   r("RequestStateStats.num_preemptions"), r("LoRARequest.lora_name"),
                   fence.present("EngineCoreRequest.lora_request", "LoRARequest.lora_int_id"))


# every symbol there (vLLM's newest tested release): for callers without an instrumentor's fence (benchmarks)
PRESENT = FrontendReads(*(contract._FALLBACKS[k](False) for k in (
    "EngineCoreOutput.prefill_stats", "PrefillStats.num_local_cached_tokens", "PrefillStats.num_external_cached_tokens",
    "EngineCoreRequest.external_req_id", "RequestStateStats.num_preemptions", "LoRARequest.lora_name")), True)


def record_outputs(requests: dict[str, RequestTimeline], states: Any, outputs: Any,
                   ts: float, reads: FrontendReads = PRESENT) -> list[tuple[RequestTimeline, Any]] | None:
    """The hot path: per output, stamp its tokens and engine events on its timeline.

    Returns the (timeline, finish reason) of requests vLLM has just let go of, or None.
    """
    finished = None
    for o in outputs:
        t = requests.get(o.request_id)
        if t is None:
            continue
        n = len(o.new_token_ids)
        if not t.token_ts and n:  # its first token: the prompt's cache reads by source come with it
            _cache_sources(t, o, reads)
        if n == 1:
            t.token_ts.append(ts)
        elif n:
            t.add_tokens(ts, n)
        if o.events:
            t.events.extend((int(e.type), e.timestamp) for e in o.events)
        if o.request_id not in states:
            (finished := finished or []).append((t, o.finish_reason))
    return finished


def _cache_sources(t: RequestTimeline, output: Any, reads: FrontendReads = PRESENT) -> None:
    """The prompt's cached tokens split by source (vLLM's ``PrefillStats``: local prefix cache, KV
    connector), from the output that carries the first token."""
    stats = reads.prefill_stats(output)
    if stats is not None:
        local, external = reads.local_cached(stats), reads.external_cached(stats)
        if local is not None and external is not None:
            try:
                t.cache_sources = (int(local), int(external))
            except (TypeError, ValueError):  # another vLLM's PrefillStats: the split is unknown
                pass


def summarize(t: RequestTimeline, state: Any, now_wall: float, reads: FrontendReads, guard: Guard) -> RequestSummary:
    """vLLM's own numbers (RequestStateStats), with vLLM's own formulas (FinishedRequestStats). ``guard``:
    the instrumentor's, which says once that an engine has no statistics (then: what our own stamps allow)."""
    st = getattr(state, "stats", None)
    if st is not None:
        return summary_of(t, engine_stats(st, reads), now_wall, getattr(state, "num_cached_tokens", None))
    s = base_summary(t, now_wall - t.arrival, getattr(state, "num_cached_tokens", None))
    # The engine was built before instrument() (statistics off, no engine events): derive
    # what our own stamps allow. TTFT then ends when the engine produced the token, not
    # when the frontend received it.
    _warn_no_stats(guard)
    queued, scheduled = t.first(QUEUED), t.first_scheduled()
    if queued is not None and scheduled is not None:
        s.queue = scheduled - queued
    if t.token_ts:
        s.ttft = WallClock().mono_ns(t.token_ts[0]) / 1e9 - t.arrival
        if scheduled is not None:
            s.prefill = t.token_ts[0] - scheduled
        s.decode = t.token_ts[-1] - t.token_ts[0]
    s.output_tokens = sum(t.tokens_at(i) for i in range(len(t.token_ts)))
    s.num_preemptions = _count_preemptions(t)
    s.tpot = RequestSummary.mean_tpot(s.decode, s.output_tokens)
    return s


def _warn_no_stats(guard: Guard) -> None:
    guard.warn_once("vllm engine without statistics",
                    "otel-llm: this vLLM engine was built before otel_llm.instrument() with per-request "
                    "statistics off: request spans get TTFT, decode and e2e only, no queue/prefill phases "
                    "or engine steps. Call instrument() before building the engine.")


def _count_preemptions(t: RequestTimeline) -> int:
    return sum(1 for k, _ in t.events if k == PREEMPTED)


def _no_python_frontend(local_client: Any) -> bool:
    """Whether the EngineCores being launched here serve no Python engine client: a headless engine
    (``local_client=False``), or the Rust frontend's (``VLLM_USE_RUST_FRONTEND``, read as vLLM reads it)."""
    if local_client is False:
        return True
    try:
        import vllm.envs as envs

        return bool(envs.VLLM_USE_RUST_FRONTEND)
    except Exception:
        return os.environ.get("VLLM_USE_RUST_FRONTEND", "0").lower() in ("1", "true")


def _parent_context(request: Any) -> otel_context.Context | None:
    """The current span if there is one, else the W3C headers the request came with."""
    current = otel_context.get_current()
    if current and trace.get_current_span(current).get_span_context().is_valid:  # (empty: no span, offline)
        return current
    headers = getattr(request, "trace_headers", None) or _HEADERS.get()
    if headers:
        return _PROPAGATOR.extract(dict(headers))
    return None
