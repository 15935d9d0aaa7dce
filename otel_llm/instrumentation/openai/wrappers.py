"""The ``create`` wrappers: start the CLIENT span, inject ``traceparent``, time the call.

Shape of every wrapper (STYLE.md 5): guarded set-up, the host's call unguarded (its
exceptions pass through unchanged), guarded bookkeeping. Sync and async share ``_begin``,
``_failed`` and ``_returned``; only the call itself differs.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Tracer

from ...core.client_metrics import ClientMetrics
from ...core import semconv as sc
from ...core.config import Config
from ...core.guard import GUARD
from .ops import request_attributes
from .record import ERROR, CallRecord
from .stream import AsyncStreamProxy, StreamProxy

PROVIDER = "openai"


class ClientTelemetry:
    """The frozen state every wrapper closes over, built once at ``instrument()``."""

    provider = PROVIDER

    def __init__(self, config: Config, tracer: Tracer, metrics: ClientMetrics) -> None:
        self.config = config
        self.tracer = tracer
        self.metrics = metrics


class OpenAIWrappers:
    def __init__(self, telemetry: ClientTelemetry, stream_types: tuple[type, type]) -> None:
        self.t = telemetry
        self.stream_type, self.async_stream_type = stream_types

    def sync(self, op: Any) -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            rec, kwargs, token = self._begin(op, instance, kwargs)
            if rec is None:
                return wrapped(*args, **kwargs)
            try:
                result = wrapped(*args, **kwargs)
            except BaseException as exc:
                self._failed(rec, token, exc)
                raise
            return self._returned(op, rec, token, result)
        return wrapper

    def asynchronous(self, op: Any) -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            async def call() -> Any:
                rec, kw, token = self._begin(op, instance, kwargs)
                if rec is None:
                    return await wrapped(*args, **kw)
                try:
                    result = await wrapped(*args, **kw)
                except BaseException as exc:
                    self._failed(rec, token, exc)
                    raise
                return self._returned(op, rec, token, result)
            return call()
        return wrapper

    # -- shared by sync and async --------------------------------------------------------------

    def _begin(self, op: Any, instance: Any, kwargs: dict) -> tuple[CallRecord | None, dict, object]:
        """Start the span, make it current, and add its ``traceparent`` to ``extra_headers``."""
        try:
            t = self.t
            model = kwargs.get("model")
            model = model if isinstance(model, str) else None
            stream = kwargs.get("stream") is True
            server = self._server(instance)
            attrs: dict[str, Any] = {sc.OPERATION_NAME: op.operation, sc.PROVIDER_NAME: PROVIDER}
            if model:
                attrs[sc.REQUEST_MODEL] = model
            if stream:
                attrs[sc.REQUEST_STREAM] = True
            if server[0]:
                attrs[sc.SERVER_ADDRESS] = server[0]
            if server[1] is not None:
                attrs[sc.SERVER_PORT] = server[1]
            attrs.update(request_attributes(kwargs))
            start_ns = time.time_ns()
            span = t.tracer.start_span(f"{op.operation} {model}" if model else op.operation,
                                       kind=SpanKind.CLIENT, attributes=attrs, start_time=start_ns)
            ctx = trace.set_span_in_context(span)
            headers: dict[str, str] = {}
            propagate.inject(headers, context=ctx)
            given = kwargs.get("extra_headers")
            if headers:
                # the caller's own headers win (an explicit traceparent is theirs to send)
                kwargs = {**kwargs, "extra_headers": {**headers, **given} if isinstance(given, dict) else headers}
            rec = CallRecord(t, span, op.operation, model, stream, server, start_ns, t.config.capture_content)
            if rec.texts is not None:
                op.capture_input(rec, kwargs)
            token = otel_context.attach(ctx)
            rec.start = time.perf_counter()  # the clock starts as the request leaves
            return rec, kwargs, token
        except Exception as exc:
            GUARD.failed(f"openai {op.operation} (before)", exc)
            return None, kwargs, None

    def _failed(self, rec: CallRecord, token: object, exc: BaseException) -> None:
        _detach(token)
        rec.finish(ERROR, exc)

    def _returned(self, op: Any, rec: CallRecord, token: object, result: Any) -> Any:
        _detach(token)
        try:
            if isinstance(result, self.stream_type):
                return StreamProxy(result, rec, op.chunk)
            if isinstance(result, self.async_stream_type):
                return AsyncStreamProxy(result, rec, op.chunk)
            if hasattr(result, "choices") or hasattr(result, "output"):
                op.response(rec, result)
            # else: a raw response (``with_raw_response``): the span covers the call, without its body
        except Exception as exc:
            GUARD.failed(f"openai {op.operation} (after)", exc)
        rec.finish("complete")
        return result

    def _server(self, instance: Any) -> tuple[str | None, int | None]:
        url = instance._client.base_url
        port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
        return (url.host or None, port)


def _detach(token: object) -> None:
    try:
        otel_context.detach(token)  # type: ignore[arg-type]
    except Exception as exc:
        GUARD.failed("openai context detach", exc)
