"""A stand-in ``tensorrt_llm`` package for tests, injected into ``sys.modules``.

TensorRT-LLM cannot run here (CUDA, NVIDIA's package index). These modules carry release 1.2.1's
names exactly where the adapter hooks or reads them (tensorrt_llm/llmapi/llm.py,
tensorrt_llm/executor/result.py, tensorrt_llm/sampling_params.py as the release's documentation
publishes them; tensorrt_llm/serve/openai_server.py at 5f158410; RequestPerfMetrics' fields and the
IterationStats JSON keys as tests/bindings/test_executor_bindings.py asserts them; RequestEventTiming
as tensorrt_llm/metrics/enums.py), and the control flow around them is 1.2.1's, shortened:
``generate_async`` -> ``_prepare_sampling_params`` -> a result whose ``_handle_response`` ->
``_handle_sequence`` -> ``record_stats`` runs when the caller reads it. What stands in for the C++
executor is ``FakeEngine``: a scheduler the test steps one iteration at a time, stamping steady-clock
(``time.monotonic``) times as TensorRT-LLM's does.

What 1.2.1's result.py does differently from 5f158410's (the commit this stand-in first followed),
as far as it touches what the adapter sees: a stop string found while detokenizing ends the result
(``_done``) without calling ``abort()`` (5f158410 called ``self.abort()`` first: ``STOP_STRING_ABORTS``
turns that flow back on); ``record_stats`` and the post-processing path update ``metrics_dict`` instead
of replacing it; post-processing outputs now carry ``request_perf_metrics``; ``CompletionOutput`` gained
``additional_context_outputs`` / ``additional_generation_outputs``; results record ``cached_tokens``;
``do_tracing`` starts TensorRT-LLM's own span at the engine's arrival time and adds the KV-cache
transfer time (tests/collector/test_trtllm_native.py). Every hooked signature is unchanged.
"""

from __future__ import annotations

import datetime
import enum
import importlib.abc
import importlib.machinery
import json
import sys
import time
import types
import weakref
from dataclasses import dataclass, field
from queue import Empty, Queue
from typing import Any, Callable, List, Literal, Mapping, Optional, Union

MODULES = ("tensorrt_llm", "tensorrt_llm.bindings", "tensorrt_llm.bindings.executor", "tensorrt_llm.metrics",
           "tensorrt_llm.sampling_params", "tensorrt_llm.executor", "tensorrt_llm.executor.result",
           "tensorrt_llm.llmapi", "tensorrt_llm.llmapi.llm", "tensorrt_llm.serve", "tensorrt_llm.serve.openai_server")


# ---- tensorrt_llm.bindings.executor (C++ in the real package) --------------------------------------

class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class TimingMetrics:
    def __init__(self) -> None:
        zero = datetime.timedelta(0)
        self.arrival_time = self.first_scheduled_time = self.first_token_time = self.last_token_time = zero
        self.kv_cache_transfer_start = self.kv_cache_transfer_end = zero
        self.kv_cache_size = 0


class KvCacheMetrics:
    def __init__(self) -> None:
        self.num_total_allocated_blocks = 0
        self.num_new_allocated_blocks = 0
        self.num_reused_blocks = 0
        self.num_missed_blocks = 0
        self.kv_cache_hit_rate = 0.0


class SpeculativeDecodingMetrics:
    def __init__(self) -> None:
        self.acceptance_rate = 0.0
        self.total_accepted_draft_tokens = 0
        self.total_draft_tokens = 0


class RequestPerfMetrics:
    TimingMetrics = TimingMetrics
    KvCacheMetrics = KvCacheMetrics
    SpeculativeDecodingMetrics = SpeculativeDecodingMetrics

    def __init__(self) -> None:
        self.timing_metrics = TimingMetrics()
        self.kv_cache_metrics = KvCacheMetrics()
        self.speculative_decoding = SpeculativeDecodingMetrics()
        self.first_iter: Optional[int] = None
        self.last_iter: Optional[int] = None
        self.iter: Optional[int] = None


# ---- tensorrt_llm.metrics --------------------------------------------------------------------------

class MetricNames(enum.Enum):
    TTFT = "ttft"
    TPOT = "tpot"
    E2E = "e2e"
    REQUEST_QUEUE_TIME = "request_queue_time"


class RequestEventTiming(enum.Enum):
    ARRIVAL_TIME = "arrival_time"
    FIRST_TOKEN_TIME = "first_token_time"
    FIRST_SCHEDULED_TIME = "first_scheduled_time"
    LAST_TOKEN_TIME = "last_token_time"
    KV_CACHE_TRANSFER_START = "kv_cache_transfer_start"
    KV_CACHE_TRANSFER_END = "kv_cache_transfer_end"
    KV_CACHE_SIZE = "kv_cache_size"


# ---- tensorrt_llm.sampling_params ------------------------------------------------------------------

@dataclass(slots=True, kw_only=True)
class SamplingParams:  # the fields the stand-in uses, in 1.2.1's order with 1.2.1's defaults
    end_id: Optional[int] = None
    max_tokens: int = 32
    stop: Optional[Union[str, List[str]]] = None
    n: int = 1
    best_of: Optional[int] = None
    use_beam_search: bool = False
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    return_perf_metrics: bool = False
    detokenize: bool = True

    def __post_init__(self) -> None:
        if self.best_of is None:
            self.best_of = self.n


# ---- tensorrt_llm.executor.result ------------------------------------------------------------------

class ResponseWrapper:
    def __init__(self, response: Any, logprobs: Any = None, request_perf_metrics: Optional[dict] = None):
        self._response = response
        self.logprobs = logprobs
        self.request_perf_metrics = request_perf_metrics


class ErrorResponse:
    def __init__(self, client_id: int, error_msg: str, request_id: int) -> None:
        self.client_id = client_id
        self.error_msg = error_msg
        self.request_id = request_id


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: Optional[List[int]] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list] = field(default_factory=list)
    prompt_logprobs: Optional[list] = field(default_factory=list)
    finish_reason: Optional[Literal['stop', 'length', 'timeout', 'cancelled']] = None
    stop_reason: Optional[Union[int, str]] = None
    generation_logits: Any = None
    additional_context_outputs: Optional[dict] = None
    additional_generation_outputs: Optional[dict] = None
    disaggregated_params: Any = None
    request_perf_metrics: Optional[RequestPerfMetrics] = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)
    _incremental_states: Optional[dict] = field(default=None, init=False, repr=False)
    _postprocess_result: Any = None

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len:]

    @property
    def token_ids_diff(self) -> List[int]:
        return self.token_ids[self._last_token_ids_len:]


class GenerationResultBase:
    def __init__(self, id: int, sampling_params: SamplingParams, background_error_handler: Optional[Callable] = None,
                 postproc_params: Any = None):
        self.id = id
        self.sampling_params = sampling_params
        self.postproc_params = postproc_params
        self.disaggregated_params = None
        self.decoding_iter = 0
        self.cached_tokens = 0
        self.avg_decoded_tokens_per_iter: Optional[float] = None
        self._done = False
        self.metrics_dict: dict = {}
        self.trace_headers = None
        self.queue: Queue = Queue()
        self.aqueue = None
        self._outputs = [CompletionOutput(i) for i in range(self.sampling_params.best_of)]
        self._background_error_handler = background_error_handler

    @property
    def outputs(self) -> List[CompletionOutput]:
        return self._outputs[:self.sampling_params.n]

    def _handle_sequence(self, finish_reasons, response_tensors, sequence_index, logprobs_result=None,
                         req_perf_metrics_dict: Optional[dict] = None):
        output = self._outputs[sequence_index]
        output._last_token_ids_len = len(output.token_ids)
        output.token_ids.extend(response_tensors.output_token_ids[0])
        if finish_reasons and finish_reasons[0] == FinishReason.CANCELLED:
            output.finish_reason = 'cancelled'
        if response_tensors.request_perf_metrics is not None:
            output.request_perf_metrics = response_tensors.request_perf_metrics
        if self._done:
            reason = finish_reasons[0]
            if reason in (FinishReason.END_ID, FinishReason.STOP_WORDS):
                output.finish_reason = 'stop'
            elif reason == FinishReason.LENGTH:
                output.finish_reason = 'length'
            elif reason == FinishReason.TIMED_OUT:
                output.finish_reason = 'timeout'
            elif reason == FinishReason.CANCELLED:
                pass
            else:
                raise ValueError(f"Unknown finish reason: {reason}")
            self.record_stats(output, req_perf_metrics_dict)

    def _handle_response(self, response: Any):
        req_perf_metrics_dict = None
        if isinstance(response, ResponseWrapper):
            req_perf_metrics_dict = response.request_perf_metrics
            response = response._response
        if isinstance(response, ErrorResponse):
            if self._background_error_handler is not None:
                self._background_error_handler(response.error_msg)
            return
        if response.has_error():
            if self._background_error_handler is not None:
                self._background_error_handler(response.error_msg)
            return
        response_result = response.result
        self._done = response_result.is_final
        self.decoding_iter = response_result.decoding_iter
        self.cached_tokens = getattr(response_result, 'cached_tokens', 0)
        self.avg_decoded_tokens_per_iter = response_result.avg_decoded_tokens_per_iter
        self._handle_sequence(response_result.finish_reasons, response_result, response_result.sequence_index,
                              None, req_perf_metrics_dict)

    def record_stats(self, output: CompletionOutput, stats: Optional[dict[str, float]] = None) -> None:
        if not stats:
            return
        metrics_stats: dict = {"finished_reason": output.finish_reason} if output.finish_reason else {}
        metrics_stats.update(_process_req_perf_metrics(stats, len(output.token_ids), self.sampling_params.n > 1))
        self.metrics_dict.update(metrics_stats)  # 1.2.1 updates (5f158410 replaced it)


def _process_req_perf_metrics(stats: dict, output_length: int, is_multiple_response: bool = False) -> dict:
    get = stats.get
    stat = {MetricNames.TTFT: get(RequestEventTiming.FIRST_TOKEN_TIME, 0) - get(RequestEventTiming.ARRIVAL_TIME, 0),
            MetricNames.E2E: get(RequestEventTiming.LAST_TOKEN_TIME, 0) - get(RequestEventTiming.ARRIVAL_TIME, 0),
            MetricNames.REQUEST_QUEUE_TIME: get(RequestEventTiming.FIRST_SCHEDULED_TIME, 0)
            - get(RequestEventTiming.ARRIVAL_TIME, 0)}
    if output_length > 1 and not is_multiple_response:
        stat[MetricNames.TPOT] = (get(RequestEventTiming.LAST_TOKEN_TIME, 0)
                                  - get(RequestEventTiming.FIRST_TOKEN_TIME, 0)) / (output_length - 1)
    return {k: v for k, v in stat.items() if v > 0}


# 5f158410's DetokenizedGenerationResultBase called self.abort() before ending on a stop string; 1.2.1's does not
STOP_STRING_ABORTS = False


class DetokenizedGenerationResultBase(GenerationResultBase):
    def __init__(self, id: int, sampling_params: SamplingParams, tokenizer: Optional[Callable] = None,
                 streaming: bool = False, background_error_handler: Optional[Callable] = None,
                 postproc_params: Any = None):
        super().__init__(id, sampling_params, background_error_handler=background_error_handler,
                         postproc_params=postproc_params)
        self.tokenizer = tokenizer
        self._streaming = streaming

    def _handle_response(self, response: Any):
        GenerationResultBase._handle_response(self, response)
        if self.sampling_params.detokenize and self.tokenizer is not None:
            for beam_output in self.outputs:
                beam_output._last_text_len = len(beam_output.text)
                beam_output.text = self.tokenizer.decode(beam_output.token_ids)
                stop = self.sampling_params.stop
                if not self._done and isinstance(stop, str) and stop in beam_output.text:
                    beam_output.text = beam_output.text[:beam_output.text.find(stop)]
                    beam_output.finish_reason = 'stop'
                    beam_output.stop_reason = stop
                    if STOP_STRING_ABORTS:
                        self.abort()
                    self._done = True


class RequestError(RuntimeError):
    pass


def _raise_request_error(error: Any = None) -> None:
    # the executor's background error handler raises in the caller's thread
    if error is not None:
        raise RequestError(error)


class GenerationResult(GenerationResultBase):
    def __init__(self, generation_request: "GenerationRequest", background_error_handler: Optional[Callable] = None,
                 executor: Any = None, disaggregated_params: Any = None, logprob_params: Any = None) -> None:
        super().__init__(generation_request.id, generation_request.sampling_params,
                         background_error_handler or _raise_request_error, postproc_params=None)
        self._generation_request = generation_request
        self._streaming = generation_request.streaming
        self.trace_headers = generation_request.trace_headers
        self._executor = weakref.ref(executor) if executor else None
        self._aborted = False

    @property
    def request_id(self) -> int:
        return self._generation_request.id

    @property
    def prompt_token_ids(self) -> List[int]:
        return self._generation_request.prompt_token_ids

    def abort(self) -> None:
        self._executor().abort_request(self.request_id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    @property
    def finished(self) -> bool:
        return self._done

    # The fake engine runs an iteration whenever a reader waits (the real one runs on its own).
    def _result_step(self, timeout: Optional[float] = None):
        while self.queue.empty():
            self._executor().step()
        self._handle_response(self.queue.get(timeout=timeout))

    async def _aresult_step(self):
        while self.queue.empty():
            self._executor().step()
        self._handle_response(self.queue.get(timeout=10))

    def result(self, timeout: Optional[float] = None) -> "GenerationResult":
        while not self._done:
            self._result_step(timeout)
        return self

    async def aresult(self) -> "GenerationResult":
        while not self._done:
            await self._aresult_step()
        return self

    def __await__(self):
        return self.aresult().__await__()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        self._result_step()
        return self

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        await self._aresult_step()
        return self


class IterationResult:
    def __init__(self) -> None:
        self._done = False
        self._timeout = 2
        self.queue: Queue = Queue()
        self.aqueue = None

    def set_timeout(self, timeout: float):
        self._timeout = timeout

    def mark_undone(self):
        self._done = False

    def get_results(self) -> List[dict]:
        results = []
        while not self._done:
            try:
                results.append(json.loads(self.queue.get(timeout=0)))
            except Empty:
                self._done = True
        return results

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        try:
            return json.loads(self.queue.get(timeout=0))
        except Empty:
            self._done = True
            raise StopAsyncIteration


# ---- the engine: stands in for the executor, its worker and the C++ batch manager ------------------

@dataclass
class GenerationRequest:
    id: int
    prompt_token_ids: List[int]
    sampling_params: SamplingParams
    streaming: bool = False
    trace_headers: Optional[Mapping[str, str]] = None


@dataclass
class _Result:
    is_final: bool
    output_token_ids: List[List[int]]
    finish_reasons: List[FinishReason]
    request_perf_metrics: Optional[RequestPerfMetrics]
    decoding_iter: int
    avg_decoded_tokens_per_iter: float
    sequence_index: int = 0


class _Response:
    def __init__(self, client_id: int, result: Optional[_Result] = None, error_msg: Optional[str] = None):
        self.client_id = client_id
        self.result = result
        self.error_msg = error_msg

    def has_error(self) -> bool:
        return self.error_msg is not None


@dataclass
class _Running:
    result: GenerationResult
    perf: RequestPerfMetrics
    generated: int = 0
    scheduled: bool = False
    cancelled: bool = False
    fail: bool = False


class FakeEngine:
    """Runs one iteration per ``step()``: new requests are scheduled (their whole prompt in one context
    iteration, or ``chunk`` tokens at a time), running ones decode ``tokens_per_step`` tokens (several:
    speculative decoding). Token ids count up from 100; the tokenizer renders each as ``"t "``."""

    def __init__(self, max_batch: int = 8, tokens_per_step: int = 1, chunk: int | None = None,
                 reused_blocks: int = 0) -> None:
        self.max_batch = max_batch
        self.tokens_per_step = tokens_per_step
        self.chunk = chunk
        self.reused_blocks = reused_blocks
        self.iteration = 0
        self.running: list[_Running] = []
        self.next_id = 1
        self.stats = IterationResult()
        self.stats_log: list[dict] = []
        self.failing: set[int] = set()

    def generate_async(self, prompt_token_ids, sampling_params, streaming, trace_headers) -> GenerationResult:
        req = GenerationRequest(self.next_id, list(prompt_token_ids), sampling_params, streaming, trace_headers)
        self.next_id += 1
        result = GenerationResult(req, executor=self)
        perf = RequestPerfMetrics()
        perf.timing_metrics.arrival_time = datetime.timedelta(seconds=time.monotonic())
        self.running.append(_Running(result, perf))
        return result

    def abort_request(self, request_id: int) -> None:
        for r in self.running:
            if r.result.request_id == request_id:
                r.cancelled = True

    def step(self) -> None:
        start_wall = datetime.datetime.now()
        t0 = time.perf_counter()
        batch = self.running[:self.max_batch]
        ctx_reqs = gen_reqs = ctx_tokens = 0
        now = datetime.timedelta(seconds=time.monotonic())
        done = []
        for r in batch:
            sp = r.result.sampling_params
            tm = r.perf.timing_metrics
            if r.cancelled:
                done.append(r)
                self._respond(r, [], FinishReason.CANCELLED, final=True)
                continue
            if r.result.request_id in self.failing:
                done.append(r)
                r.result.queue.put(_Response(r.result.request_id, error_msg="CUDA error: an illegal memory access"))
                continue
            if not r.scheduled:
                r.scheduled = True
                tm.first_scheduled_time = now
                r.perf.first_iter = self.iteration
                r.prompt_left = len(r.result.prompt_token_ids)
            r.perf.iter = r.perf.last_iter = self.iteration
            if getattr(r, "prompt_left", 0) > 0:
                n = min(r.prompt_left, self.chunk or r.prompt_left)
                r.prompt_left -= n
                ctx_reqs += 1
                ctx_tokens += n
                if r.prompt_left:
                    continue  # a middle chunk: no token yet
                new = [100 + r.generated]
            else:
                gen_reqs += 1
                new = [100 + r.generated + i for i in range(self.tokens_per_step)]
            new = new[:sp.max_tokens - r.generated]
            if r.generated == 0:
                tm.first_token_time = now
            r.generated += len(new)
            tm.last_token_time = now
            final = r.generated >= sp.max_tokens
            if final:
                done.append(r)
            self._respond(r, new, FinishReason.LENGTH if final else FinishReason.NOT_FINISHED, final)
        for r in done:
            self.running.remove(r)
        latency_ms = (time.perf_counter() - t0) * 1000 + 1.0
        spec = self.tokens_per_step > 1
        stats = {
            "timestamp": start_wall.strftime("%m-%d-%Y %H:%M:%S.%f"), "iter": self.iteration,
            "iterLatencyMS": latency_ms, "newActiveRequestsQueueLatencyMS": 0.0, "numNewActiveRequests": 0,
            "numActiveRequests": len(batch), "numQueuedRequests": max(0, len(self.running) - self.max_batch),
            "numCompletedRequests": len(done), "maxNumActiveRequests": self.max_batch,
            "gpuMemUsage": 2_000_000_000, "cpuMemUsage": 1_000_000, "pinnedMemUsage": 0,
            "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 100 - 2 * len(batch),
                             "usedNumBlocks": 2 * len(batch), "tokensPerBlock": 32, "allocTotalBlocks": 2 * len(batch),
                             "allocNewBlocks": 0, "reusedBlocks": 0, "missedBlocks": 0, "cacheHitRate": 0.0},
            "staticBatchingStats": None,
            "inflightBatchingStats": {"numScheduledRequests": ctx_reqs + gen_reqs, "numContextRequests": ctx_reqs,
                                      "numGenRequests": gen_reqs, "numPausedRequests": 0, "numCtxTokens": ctx_tokens,
                                      "microBatchId": 0,
                                      "avgNumDecodedTokensPerIter": float(self.tokens_per_step)},
            "specDecodingStats": None,
        }
        self.stats_log.append(stats)
        self.stats.queue.put(json.dumps(stats))
        self.iteration += 1

    def _respond(self, r: _Running, new: list[int], reason: FinishReason, final: bool) -> None:
        result = r.result
        if not final and not result._streaming:
            return
        perf = None
        metrics = None
        if final and result.sampling_params.return_perf_metrics:
            perf = r.perf
            perf.kv_cache_metrics.num_total_allocated_blocks = 2
            perf.kv_cache_metrics.num_reused_blocks = self.reused_blocks
            perf.kv_cache_metrics.num_missed_blocks = 2 - min(2, self.reused_blocks)
            perf.kv_cache_metrics.kv_cache_hit_rate = self.reused_blocks / 2
            if self.tokens_per_step > 1:
                sd = perf.speculative_decoding
                sd.total_draft_tokens = (r.generated - 1) // self.tokens_per_step * (self.tokens_per_step - 1) + 1
                sd.total_accepted_draft_tokens = sd.total_draft_tokens - 1
                sd.acceptance_rate = sd.total_accepted_draft_tokens / sd.total_draft_tokens
            tm = perf.timing_metrics
            metrics = {RequestEventTiming.ARRIVAL_TIME: tm.arrival_time.total_seconds(),
                       RequestEventTiming.FIRST_SCHEDULED_TIME: tm.first_scheduled_time.total_seconds(),
                       RequestEventTiming.FIRST_TOKEN_TIME: tm.first_token_time.total_seconds(),
                       RequestEventTiming.LAST_TOKEN_TIME: tm.last_token_time.total_seconds()}
        if not result._streaming:  # one response with every token
            new = list(range(100, 100 + r.generated))
        res = _Result(final, [new], [reason], perf, r.generated, float(self.tokens_per_step))
        result.queue.put(ResponseWrapper(_Response(result.request_id, res), request_perf_metrics=metrics))

    def get_stats(self, timeout: float) -> List[dict]:
        self.stats.set_timeout(timeout)
        self.stats.mark_undone()
        return self.stats.get_results()

    def aget_stats(self, timeout: float) -> IterationResult:
        self.stats.set_timeout(timeout)
        self.stats.mark_undone()
        return self.stats


class Tokenizer:
    eos_token_id = 2
    pad_token_id = 0

    def decode(self, ids: List[int], **kwargs: Any) -> str:
        return "t " * len(ids)


# ---- tensorrt_llm.llmapi.llm ------------------------------------------------------------------------

class RequestOutput(DetokenizedGenerationResultBase, GenerationResult):
    def __init__(self) -> None:
        raise RuntimeError("RequestOutput is designed to be instantiated using _from_generation_result")

    @classmethod
    def _from_generation_result(cls, generation_result: GenerationResult, prompt: Optional[str] = None,
                                tokenizer: Any = None) -> "RequestOutput":
        inst = cls.__new__(cls)
        inst.__dict__.update(generation_result.__dict__)
        inst.tokenizer = tokenizer
        inst._streaming = generation_result._streaming
        inst._prompt = prompt
        return inst

    @property
    def prompt(self) -> Optional[str]:
        return self._prompt


@dataclass
class _Args:  # the fields of TorchLlmArgs the stand-in needs
    model: str
    return_perf_metrics: bool = False
    enable_iter_perf_stats: bool = False


class BaseLLM:
    def __init__(self, model: str, engine: FakeEngine | None = None, **kwargs: Any) -> None:
        self.args = _Args(model=model, **kwargs)
        self._executor = engine or FakeEngine()
        self.tokenizer = Tokenizer()

    def generate(self, inputs, sampling_params=None, use_tqdm=True, lora_request=None, prompt_adapter_request=None,
                 kv_cache_retention_config=None, disaggregated_params=None, scheduling_params=None):
        unbatched = not isinstance(inputs, list) or isinstance(inputs[0], int)
        batch = [inputs] if unbatched else inputs
        futures = [self.generate_async(i, sampling_params=sampling_params, streaming=False) for i in batch]
        for f in futures:
            f.result()
        return futures[0] if unbatched else futures

    def generate_async(self, inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None,
                       streaming=False, kv_cache_retention_config=None, disaggregated_params=None,
                       trace_headers: Optional[Mapping[str, str]] = None, _postproc_params=None,
                       scheduling_params=None, cache_salt=None) -> RequestOutput:
        sampling_params = self._prepare_sampling_params(sampling_params)
        prompt = inputs if isinstance(inputs, str) else None
        ids = list(range(3, 3 + len(inputs.split()))) if isinstance(inputs, str) else list(inputs)
        result = self._executor.generate_async(ids, sampling_params, streaming, trace_headers)
        return RequestOutput._from_generation_result(result, prompt, self.tokenizer)

    def get_stats(self, timeout: Optional[float] = 2) -> List[dict]:
        return self._executor.get_stats(timeout=timeout)

    def get_stats_async(self, timeout: Optional[float] = 2) -> IterationResult:
        return self._executor.aget_stats(timeout=timeout)

    def _prepare_sampling_params(self, sampling_params: Optional[SamplingParams] = None) -> SamplingParams:
        if sampling_params is None:
            sampling_params = SamplingParams(end_id=self.tokenizer.eos_token_id)
        sampling_params.return_perf_metrics = sampling_params.return_perf_metrics or self.args.return_perf_metrics
        return sampling_params


class _TrtLLM(BaseLLM):
    pass


class _TorchLLM(BaseLLM):
    pass


LLM = _TorchLLM


# ---- tensorrt_llm.serve.openai_server ---------------------------------------------------------------

class OpenAIServer:
    def __init__(self, llm: BaseLLM, model: str) -> None:
        self.llm = llm
        self.model = model

    async def _serve(self, request: dict, raw_request: Any) -> RequestOutput:
        promise = self.llm.generate_async(inputs=request["prompt"],
                                          sampling_params=SamplingParams(max_tokens=request.get("max_tokens", 4)),
                                          streaming=bool(request.get("stream")), trace_headers=None)
        if request.get("stream"):
            async for _ in promise:
                pass
        else:
            await promise.aresult()
        return promise

    async def openai_chat(self, request: Any, raw_request: Any) -> Any:
        return await self._serve(request, raw_request)

    async def chat_harmony(self, request: Any, raw_request: Any) -> Any:
        return await self._serve(request, raw_request)

    async def openai_completion(self, request: Any, raw_request: Any) -> Any:
        return await self._serve(request, raw_request)

    async def openai_responses(self, request: Any, raw_request: Any) -> Any:
        return await self._serve(request, raw_request)


# ---- installing it -------------------------------------------------------------------------------

def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__path__ = []  # type: ignore[attr-defined]
    m.__dict__.update(attrs)
    return m


def build() -> dict[str, types.ModuleType]:
    """The module tree, not yet installed (a test may drift a signature before installing it)."""
    executor = _module("tensorrt_llm.bindings.executor", RequestPerfMetrics=RequestPerfMetrics,
                       FinishReason=FinishReason)
    result = _module("tensorrt_llm.executor.result", CompletionOutput=CompletionOutput,
                     GenerationResultBase=GenerationResultBase,
                     DetokenizedGenerationResultBase=DetokenizedGenerationResultBase,
                     GenerationResult=GenerationResult, IterationResult=IterationResult,
                     ResponseWrapper=ResponseWrapper)
    llm = _module("tensorrt_llm.llmapi.llm", BaseLLM=BaseLLM, _TrtLLM=_TrtLLM, _TorchLLM=_TorchLLM, LLM=LLM,
                  RequestOutput=RequestOutput)
    return {
        "tensorrt_llm": _module("tensorrt_llm", LLM=LLM, SamplingParams=SamplingParams),
        "tensorrt_llm.bindings": _module("tensorrt_llm.bindings", executor=executor),
        "tensorrt_llm.bindings.executor": executor,
        "tensorrt_llm.metrics": _module("tensorrt_llm.metrics", MetricNames=MetricNames,
                                        RequestEventTiming=RequestEventTiming),
        "tensorrt_llm.sampling_params": _module("tensorrt_llm.sampling_params", SamplingParams=SamplingParams),
        "tensorrt_llm.executor": _module("tensorrt_llm.executor", result=result),
        "tensorrt_llm.executor.result": result,
        "tensorrt_llm.llmapi": _module("tensorrt_llm.llmapi", llm=llm, LLM=LLM, RequestOutput=RequestOutput),
        "tensorrt_llm.llmapi.llm": llm,
        "tensorrt_llm.serve": _module("tensorrt_llm.serve"),
        "tensorrt_llm.serve.openai_server": _module("tensorrt_llm.serve.openai_server", OpenAIServer=OpenAIServer),
    }


def install(modules: dict[str, types.ModuleType]) -> None:
    for name in MODULES:
        sys.modules[name] = modules[name]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the fake modules through the import system, so post-import hooks see them imported."""

    def __init__(self, modules: dict[str, types.ModuleType]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name in self.modules:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return self.modules[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def importable(modules: dict[str, types.ModuleType]) -> _Finder:
    """Make the fakes importable (``import tensorrt_llm.llmapi.llm``) without installing them yet."""
    finder = _Finder(modules)
    sys.meta_path.append(finder)
    return finder


def uninstall() -> None:
    for finder in [f for f in sys.meta_path if isinstance(f, _Finder)]:
        sys.meta_path.remove(finder)
    for name in MODULES:
        sys.modules.pop(name, None)
