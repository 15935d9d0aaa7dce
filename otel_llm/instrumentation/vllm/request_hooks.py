"""The EngineCore's request hooks: each request's start and finish, as the engine saw them, for the agent.

Armed by the plugin (plugin.py) in a spawned EngineCore where the process that spawned it says so in
``ENGINE_REQUESTS_ENV`` (``wrappers.VLLMWrappers.launching_engines``): ``1`` where no Python frontend holds
the requests (the Rust frontend's supervisor, a headless engine), ``enriched`` where a Python frontend with an
agent does and adds what only it knows to each request (agent/records.RequestEnrichment): the records then
say so, and the agent waits for that enrichment. Three vLLM methods, O(1) a request, nothing per step:

* ``EngineCore.preprocess_add_request`` (the input thread): notes the ``EngineCoreRequest``'s external id,
  which vLLM's ``Request`` does not keep;
* ``Scheduler.add_request`` (the engine thread, before any step can serve the request): ``RequestStart``;
* ``Scheduler._free_request`` (the engine thread; every finish: stop, length, abort, error): ``RequestFinish``.

The records (otel_llm/agent/records.py) go through ``send``: the step sink's ``send_request``, which queues
them for one datagram to each frontend socket of the step directory (at the next step, or ``flush`` when the
engine goes idle).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from ...agent import records
from ...core.request_params import sampling_attributes
from ...guard import Guard
from ... import semconv as sc
from ..wraps import Target, WrapTable
from . import contract
from .grammar import backend_attribute

ENGINE_REQUESTS_ENV = "OTEL_LLM_ENGINE_REQUESTS"  # "1" or "enriched": this EngineCore is its requests' source
ENRICHED = "enriched"  # ... and a Python frontend enriches each of its requests
ENGINE_MODEL_ENV = "OTEL_LLM_ENGINE_MODEL"  # the served model name, from the process that spawned it
_MAX_NOTED = 4096  # external ids noted and not yet taken by add_request (a request vLLM refused): bounded


def wanted() -> bool:
    return os.environ.get(ENGINE_REQUESTS_ENV) in ("1", ENRICHED)


class RequestHooks:
    """``send(bytes)``: where each record goes. ``clock``: the step hooks' clock (time.monotonic)."""

    def __init__(self, send: Callable[[bytes], None], guard: Guard | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 flush: Callable[[], None] | None = None) -> None:
        self.send = send
        self.flush = flush  # sends what ``send`` queued (the sink's flush_requests): when the engine goes idle
        self.guard = guard if guard is not None else Guard()
        self.clock, self.wall = clock, wall
        self.model = os.environ.get(ENGINE_MODEL_ENV) or None
        self.enriched = os.environ.get(ENGINE_REQUESTS_ENV) == ENRICHED
        self.external: dict[str, str | None] = {}  # request id -> external id, preprocess to add_request
        # request id -> (when the scheduler took it, its external id), until it is freed
        self.live: dict[str, tuple[float, str | None]] = {}
        self.fence: contract.Contract | None = None  # vLLM's symbols (contract.py), at the first request
        self._table = WrapTable([
            Target("vllm.v1.engine.core", "EngineCore.preprocess_add_request", self.preprocess, plain=True),
            Target("vllm.v1.core.sched.scheduler", "Scheduler.add_request", self.add_request, plain=True),
            Target("vllm.v1.core.sched.scheduler", "Scheduler._free_request", self.free_request, plain=True),
        ], self.guard)

    def arm(self) -> None:
        self._table.wrap()

    def disarm(self) -> None:
        self._table.unwrap()
        self.external.clear()
        self.live.clear()

    # -- the hooks (plain methods: wraps.Target) --------------------------------------------------------

    def preprocess(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        out = wrapped(*args, **kwargs)
        try:
            request = args[0] if args else kwargs["request"]
            external = self.external
            if len(external) >= _MAX_NOTED:
                external.clear()
            external[request.request_id] = getattr(request, "external_req_id", None)
        except Exception as exc:
            self.guard.failed("vllm engine request start", exc)
        return out

    def add_request(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        queued = self.clock()
        request = args[0] if args else kwargs.get("request")
        known = request is not None and request.request_id in instance.requests  # a streaming continuation
        out = wrapped(*args, **kwargs)
        if not known:
            try:
                self.started(request, queued)
            except Exception as exc:
                self.guard.failed("vllm engine request start", exc)
        return out

    def free_request(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        try:
            request = args[0] if args else kwargs["request"]
            self.finished(request)
        except Exception as exc:
            self.guard.failed("vllm engine request finish", exc)
        out = wrapped(*args, **kwargs)
        if self.flush is not None and not instance.requests:  # idle now: no next step flushes the records
            try:
                self.flush()
            except Exception as exc:
                self.guard.failed("vllm engine request finish", exc)
        return out

    # -- the records --------------------------------------------------------------------------------------

    def sampling(self, params: Any) -> dict[str, Any]:
        """The request's GenAI sampling attributes, with its structured-output backend where it has a grammar."""
        if params is None:
            return {}
        attrs = sampling_attributes(params)
        if self.fence is None:
            self.fence = contract.Contract(guard=self.guard)
        backend = backend_attribute(params, self.fence)
        if backend is not None:
            attrs[sc.STRUCTURED_OUTPUT_BACKEND] = backend
        return attrs

    def started(self, request: Any, queued: float) -> None:
        rid = request.request_id
        live = self.live
        if len(live) >= _MAX_NOTED * 4:  # frees never came (an engine error): don't grow
            live.clear()
        external = self.external.pop(rid, None)
        live[rid] = (queued, external)
        lora = request.lora_request
        params = request.sampling_params
        headers = request.trace_headers
        record = records.RequestStart(
            request_id=rid, arrival=float(request.arrival_time), queued=queued,
            prompt_tokens=int(request.num_prompt_tokens), external_id=external,
            model=self.model, trace_headers=dict(headers) if headers else None,
            sampling=self.sampling(params),
            lora_name=getattr(lora, "lora_name", None) if lora is not None else None,
            lora_id=getattr(lora, "lora_int_id", None) if lora is not None else None,
            client_index=int(request.client_index or 0), enriched=self.enriched)
        self.send(records.encode(record))

    def finished(self, request: Any) -> None:
        rid = request.request_id
        end, end_wall = self.clock(), self.wall()
        queued, external = self.live.pop(rid, (0.0, None))
        reason = request.get_finished_reason()
        record = records.RequestFinish(
            request_id=rid, reason=str(reason) if reason is not None else "abort",
            arrival=float(request.arrival_time), queued=queued, end=end, end_wall=end_wall,
            prompt_tokens=int(request.num_prompt_tokens), output_tokens=int(request.num_output_tokens),
            preemptions=int(request.num_preemptions or 0),
            external_id=external, model=self.model, enriched=self.enriched,
            client_index=int(request.client_index or 0))
        self.send(records.encode(record))
