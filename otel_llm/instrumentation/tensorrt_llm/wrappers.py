"""TensorRT-LLM caller-process wrappers: translate its results into the core's request timelines.

Everything hooked runs in the process that called the LLM API (or runs trtllm-serve); the
executor's worker processes are never touched. Every wrapper has the house shape: the host's
call runs unguarded (its exceptions pass through untouched), our bookkeeping around it is guarded.
Per streamed update the only work is one attribute lookup, one slice length and one list append.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from pathlib import PurePath
from typing import Any, Callable

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ... import semconv as sc
from ...core.pipeline import Pipeline
from ...core.timeline import RequestTimeline
from ...core.request_params import sampling_attributes
from ..wraps import Binders
from .iterations import IterationLedger
from .perf import EngineTimes, finalize, iteration_range

logger = logging.getLogger("otel_llm")

PROVIDER = sc.PROVIDER_TENSORRT_LLM
_KEY = "_otel_llm_timeline"  # our timeline, on TensorRT-LLM's RequestOutput (a plain object with a __dict__)
# Set by trtllm-serve's handlers for the requests they start: (operation, kind, model, incoming headers)
_SERVING: contextvars.ContextVar[tuple[str, SpanKind, str | None, dict | None] | None] = contextvars.ContextVar(
    "otel_llm_trtllm_serving", default=None)
_PROPAGATOR = TraceContextTextMapPropagator()






class TRTLLMWrappers:
    def __init__(self, telemetry: Pipeline, ledger: IterationLedger) -> None:
        self.telemetry = telemetry
        self.guard = telemetry.guard  # the instrumentor's, which its pipeline was built with
        self.ledger = ledger
        self.bind = Binders()
        self._told_perf_metrics = False

    # -- turning on the engine's per-request perf metrics ---------------------------------------

    def prepare_sampling_params(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        params = wrapped(*args, **kwargs)
        try:
            if not params.return_perf_metrics:
                params.return_perf_metrics = True
                if not self._told_perf_metrics:
                    self._told_perf_metrics = True
                    logger.info("otel-llm: turned on TensorRT-LLM's per-request perf metrics "
                                "(SamplingParams.return_perf_metrics=True); the request timings we report are "
                                "TensorRT-LLM's own")
        except Exception as exc:
            self.guard.failed("BaseLLM._prepare_sampling_params", exc)
        return params

    # -- request start ----------------------------------------------------------------------------

    def generate_async(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        arrival = time.time()
        try:
            args, kwargs = self._propagate(wrapped, args, kwargs)
        except Exception as exc:
            self.guard.failed("BaseLLM.generate_async (before)", exc)
        result = wrapped(*args, **kwargs)
        try:
            self._start(wrapped, instance, args, kwargs, result, arrival)
        except Exception as exc:
            self.guard.failed("BaseLLM.generate_async", exc)
        return result

    def _propagate(self, wrapped: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Hand the caller's span to TensorRT-LLM as W3C ``trace_headers`` when it was given none, so its
        own ``llm_request`` span (when its tracing is on) lands in the same trace as ours. Headers the
        caller passed (trtllm-serve passes the incoming ones) are left as they are."""
        b = self.bind(wrapped)
        if b.get(args, kwargs, "trace_headers") or _SERVING.get() is not None:
            return args, kwargs
        if not trace.get_current_span().get_span_context().is_valid:
            return args, kwargs
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return b.set(args, kwargs, "trace_headers", carrier)

    def _start(self, wrapped: Any, llm: Any, args: tuple, kwargs: dict, result: Any, arrival: float) -> None:
        b = self.bind(wrapped)
        serving = _SERVING.get()
        operation, kind, model, headers = serving or ("text_completion", SpanKind.INTERNAL, None, None)
        if model is None:
            model = getattr(getattr(llm, "args", None), "model", None)
            if isinstance(model, PurePath):  # the TensorRT flavour points args.model at its engine directory
                model = model.name
        params = getattr(result, "sampling_params", None) or b.get(args, kwargs, "sampling_params")
        attrs = sampling_attributes(params) if params is not None else {}
        if b.get(args, kwargs, "streaming", False):
            attrs[sc.REQUEST_STREAM] = True
        ids = result.prompt_token_ids
        rid = str(result.request_id)
        t = RequestTimeline(
            # request ids count per executor: two LLMs in one process reuse them, so ours also names the LLM
            request_id=f"{id(llm):x}:{rid}", arrival=arrival, model=str(model) if model is not None else None,
            operation=operation, provider=PROVIDER, kind=kind,
            parent=_parent_context(b.get(args, kwargs, "trace_headers") or headers),
            response_id=rid, request_attributes=attrs, input_tokens=len(ids) if ids is not None else None)
        if self.telemetry.config.capture_content:
            prompt = getattr(result, "prompt", None)
            t.prompt_text = prompt if isinstance(prompt, str) else None
        if self.telemetry.start(t):
            result.__dict__[_KEY] = t
            # the PyTorch flavour's switch for iteration stats (TorchLlmArgs.enable_iter_perf_stats): with it
            # on, stats will come, so even the first requests wait for theirs
            args = getattr(llm, "args", None)
            if not self.ledger.seen_any and getattr(args, "enable_iter_perf_stats", False) is True:
                self.ledger.expect()

    # -- per streamed update, and the finish ------------------------------------------------------

    def handle_response(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = instance.__dict__.get(_KEY)
        if t is None:
            return wrapped(*args, **kwargs)
        try:
            out = wrapped(*args, **kwargs)
        except BaseException:  # the host's exception goes on unchanged, whatever happens to our finish
            try:
                self._finish(instance, t, "engine_error")
            except Exception as exc:
                self.guard.failed("GenerationResult._handle_response", exc)
            raise
        try:  # the hot path: once per streamed update
            o = instance.outputs[0]
            n = len(o.token_ids) - o._last_token_ids_len  # len(token_ids_diff), without its copy
            if n:
                t.add_tokens(time.monotonic(), n)
                if instance.finished:
                    self._finish(instance, t, None)
            elif instance.finished:
                self._finish(instance, t, None)
            elif _is_error(args[0] if args else kwargs.get("response")):  # errors carry no tokens
                self._finish(instance, t, "engine_error")
        except Exception as exc:
            self.guard.failed("GenerationResult._handle_response", exc)
        return out

    def record_stats(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        out = wrapped(*args, **kwargs)
        try:
            t = instance.__dict__.get(_KEY)
            if t is not None:
                stats = self.bind(wrapped).get(args, kwargs, "stats")
                times = EngineTimes.from_stats(stats)
                if times is not None:
                    t.native = times
        except Exception as exc:
            self.guard.failed("GenerationResultBase.record_stats", exc)
        return out

    def abort(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        out = wrapped(*args, **kwargs)
        try:
            # Before 1.2.1 (5f158410's result.py) TensorRT-LLM itself aborted a request that hit a stop
            # string, from inside _handle_response: that request finishes normally there. 1.2.1 only
            # ends the result there. Told apart by the frames above (abort is rare; the per-update path
            # stays free of bookkeeping for it).
            if not _inside_handle_response():
                t = instance.__dict__.get(_KEY)
                if t is not None:
                    t.finish_reason = "cancelled"
                    self._finish(instance, t, "aborted")
        except Exception as exc:
            self.guard.failed("GenerationResult.abort", exc)
        return out

    def _finish(self, result: Any, t: RequestTimeline, error_type: str | None) -> None:
        if result.__dict__.pop(_KEY, None) is None:
            return  # finished already (an update after an abort, or an error after the last token)
        try:
            outputs = result.outputs
            o = outputs[0] if outputs else None
        except Exception:
            o = None
        if o is not None and o.finish_reason:
            t.finish_reason = o.finish_reason
        elif t.finish_reason is None and error_type is None:
            t.finish_reason = "stop"
        t.error_type = error_type
        perf = getattr(o, "request_perf_metrics", None) if o is not None else None
        times = t.native if isinstance(t.native, EngineTimes) else EngineTimes.from_perf_metrics(perf)
        t.native = None
        now_mono, now_wall = time.monotonic(), time.time()
        output_tokens = len(o.token_ids) if o is not None and o.token_ids is not None else 0
        s = finalize(t, times, perf, output_tokens, bool(t.request_attributes.get(sc.REQUEST_STREAM)),
                     now_mono, now_wall, self.guard)
        text = getattr(o, "text", None)
        if isinstance(text, str) and text:
            s.output_characters = len(text)
            if self.telemetry.config.capture_content:
                t.output_text = text
        engine_steps = self.telemetry.config.engine_steps
        self.ledger.finished(t, s, iteration_range(perf) if engine_steps else None)

    # -- engine iterations, as the user or trtllm-serve pulls them ----------------------------------

    def get_stats(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        out = wrapped(*args, **kwargs)
        if not self.telemetry.config.engine_steps:
            return out
        try:
            for stats in out or ():
                # dicts (IterationResult.get_results json-decodes them); get_stats' docstring (1.2.1 too)
                # shows JSON strings: read those too, without changing what the caller gets
                if isinstance(stats, str):
                    stats = json.loads(stats)
                if isinstance(stats, dict):
                    self.ledger.observe(stats)
        except Exception as exc:
            self.guard.failed("BaseLLM.get_stats", exc)
        return out

    def iteration_anext(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        async def call() -> Any:
            stats = await wrapped(*args, **kwargs)
            try:
                if isinstance(stats, dict) and self.telemetry.config.engine_steps:
                    self.ledger.observe(stats)
            except Exception as exc:
                self.guard.failed("IterationResult.__anext__", exc)
            return stats
        return call()

    # -- trtllm-serve: operation, SERVER kind, model and incoming headers ---------------------------

    def serving(self, operation: str) -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            context = None
            try:
                raw = self.bind(wrapped).get(args, kwargs, "raw_request")
                headers = getattr(raw, "headers", None)
                context = (operation, SpanKind.SERVER, getattr(instance, "model", None),
                           {str(k).lower(): v for k, v in headers.items()} if headers is not None else None)
            except Exception as exc:
                self.guard.failed("OpenAIServer handler", exc)

            async def call() -> Any:
                token = _SERVING.set(context)
                try:
                    return await wrapped(*args, **kwargs)
                finally:
                    _SERVING.reset(token)
            return call()
        return wrapper


def _inside_handle_response(depth: int = 12) -> bool:
    frame = sys._getframe(2)
    code = TRTLLMWrappers.handle_response.__code__
    while frame is not None and depth:
        if frame.f_code is code:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def _is_error(response: Any) -> bool:
    """An error response, as result.py's ``_handle_response`` tells them apart: an engine response
    whose ``has_error()`` is true, or the executor's ``ErrorResponse`` (which carries ``error_msg``)."""
    inner = getattr(response, "_response", response)  # ResponseWrapper
    has_error = getattr(inner, "has_error", None)
    if callable(has_error):
        return bool(has_error())
    return type(inner).__name__ == "ErrorResponse" and getattr(inner, "error_msg", None) is not None


def _parent_context(headers: Any) -> otel_context.Context | None:
    """The current span if there is one, else the W3C headers the request came with."""
    current = otel_context.get_current()
    if trace.get_current_span(current).get_span_context().is_valid:
        return current
    if headers:
        return _PROPAGATOR.extract({str(k).lower(): v for k, v in dict(headers).items()})
    return None
