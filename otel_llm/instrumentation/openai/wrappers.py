"""The ``create`` wrappers: start the CLIENT span, inject ``traceparent``, time the call.

Shape of every wrapper (STYLE.md 5): guarded set-up, the host's call unguarded (its
exceptions pass through unchanged), guarded bookkeeping. Sync and async share ``_begin``,
``_failed`` and ``_returned``; only the call itself differs.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import SpanKind

from ... import semconv as sc
from . import coexist
from ._fence import helper_raw_stream
from .raw import RawResponse
from .record import CLOSED, COMPLETE, ERROR, CallRecord
from .stream import AsyncStreamProxy, StreamProxy
from .telemetry import PROVIDER, ClientState

__all__ = ["ClientState", "OpenAIWrappers", "with_trace_headers"]


class OpenAIWrappers:
    def __init__(self, telemetry: ClientState, stream_types: tuple[type, type],
                 legacy_raw_type: type | None = None, raw_types: tuple[type, ...] = ()) -> None:
        self.t = telemetry
        self.guard = telemetry.guard
        self.stream_type, self.async_stream_type = stream_types
        self.legacy_raw_type = legacy_raw_type  # ``with_raw_response``: the body is read, unless streamed
        self.raw_types = raw_types  # ``with_streaming_response``: nothing read yet

    def sync(self, op: Any, method: str = "create") -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict, borrowed: bool = False) -> Any:
            done, borrowed = self._route(op, wrapped, instance, args, kwargs, method, wrapper, borrowed)
            if done is not _OWN:
                return done
            rec, kwargs, token = self._begin(op, instance, kwargs, borrowed)
            if rec is None:
                return wrapped(*args, **kwargs)
            try:
                result = wrapped(*args, **kwargs)
            except BaseException as exc:
                self._failed(op, rec, token, exc)
                raise
            return self._returned(op, rec, token, result)
        return wrapper

    def asynchronous(self, op: Any, method: str = "create") -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict, borrowed: bool = False) -> Any:
            done, borrowed = self._route(op, wrapped, instance, args, kwargs, method, wrapper, borrowed)
            if done is not _OWN:
                return done

            async def call() -> Any:
                rec, kw, token = self._begin(op, instance, kwargs, borrowed)
                if rec is None:
                    return await wrapped(*args, **kw)
                try:
                    result = await wrapped(*args, **kw)
                except BaseException as exc:
                    self._failed(op, rec, token, exc)
                    raise
                return self._returned(op, rec, token, result)
            return call()
        return wrapper

    # -- beside an upstream openai instrumentation (coexist.py) ------------------------------------

    def _route(self, op: Any, wrapped: Any, instance: Any, args: tuple, kwargs: dict, method: str,
               wrapper: Callable[..., Any], borrowed: bool) -> tuple[Any, bool]:
        """(the call's result, made here; or ``_OWN``: ours to measure, with whether the span is borrowed)."""
        if not is_instrumentation_enabled():  # the suppress-instrumentation context: the caller's call alone
            return wrapped(*args, **kwargs), False
        if borrowed:
            return _OWN, True
        deferred = self._defer(op, wrapped, instance, args, kwargs, method, wrapper)
        if deferred is not _OWN:
            return deferred, False
        return _OWN, self._borrow(instance, method)

    def _defer(self, op: Any, wrapped: Any, instance: Any, args: tuple, kwargs: dict, method: str,
               wrapper: Callable[..., Any]) -> Any:
        """Ours above an upstream wrapper: the call goes through theirs, ours runs inside it (borrowed)."""
        try:
            upstream = coexist.is_upstream(wrapped)
        except Exception as exc:
            self.guard.failed(f"openai {op.operation} (upstream check)", exc)
            return _OWN
        if not upstream:
            return _OWN
        return coexist.call_through_upstream(
            wrapped, instance, args, kwargs,
            lambda original, inst, a, kw: wrapper(original, inst, a, kw, borrowed=True))

    def _borrow(self, instance: Any, method: str) -> bool:
        try:
            return coexist.upstream_above(instance, method)
        except Exception as exc:
            self.guard.failed("openai upstream check", exc)
            return False

    def helper_close(self, asynchronous: bool) -> Callable[..., Any]:
        """``close()`` of a ``.stream()`` helper: it closes the HTTP response behind our stream proxy's
        back; end the stream as ``closed`` there (a stream already ended stays as it ended)."""
        if asynchronous:
            def awrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
                async def call() -> Any:
                    try:
                        return await wrapped(*args, **kwargs)
                    finally:
                        self._helper_closed(instance)
                return call()
            return awrapper

        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            try:
                return wrapped(*args, **kwargs)
            finally:
                self._helper_closed(instance)
        return wrapper

    # -- shared by sync and async --------------------------------------------------------------

    def _begin(self, op: Any, instance: Any, kwargs: dict,
               borrowed: bool = False) -> tuple[CallRecord | None, dict, object]:
        """Start the span, make it current, and add its ``traceparent`` to ``extra_headers``; ``borrowed``:
        the current span is an upstream instrumentation's, and ours is only what we add to it. On any
        failure of ours the call goes ahead exactly as the caller made it, unmeasured."""
        original, span = kwargs, None
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
            attrs.update(op.attributes(kwargs))
            start_ns = time.time_ns()
            anchor = time.perf_counter()  # read beside start_ns: the one pairing of the two clocks
            if borrowed:
                ctx = otel_context.get_current()
                span = trace.get_current_span(ctx)
            else:
                span = t.tracer.start_span(f"{op.operation} {model}" if model else op.operation,
                                           kind=SpanKind.CLIENT, attributes=attrs, start_time=start_ns)
                ctx = trace.set_span_in_context(span)
            kwargs = with_trace_headers(kwargs, ctx, instance)
            rec = CallRecord(t, span, op.operation, model, stream, server, start_ns,
                             t.config.capture_content and not borrowed)
            rec.borrowed = borrowed
            if rec.output is not None:
                op.capture_input(rec, kwargs)
            token = None if borrowed else otel_context.attach(ctx)
            # The clock starts at the call, with the span: every later time is placed from this one
            # pairing of wall and monotonic clocks, so the span covers the call as the caller saw it
            # (a clock started after the set-up above made the span end early by the set-up's time, long
            # on a cold first call under load, and the server's span stuck out of the client's).
            rec.start = anchor
            return rec, kwargs, token
        except Exception as exc:
            self.guard.failed(f"openai {op.operation} (before)", exc)
            if span is not None and not borrowed:
                try:
                    span.end()
                except Exception:
                    pass
            return None, original, None

    def _failed(self, op: Any, rec: CallRecord, token: object, exc: BaseException) -> None:
        self._detach(token)
        self._completion_of(op, rec, exc)
        rec.finish(ERROR, exc)

    def _returned(self, op: Any, rec: CallRecord, token: object, result: Any) -> Any:
        self._detach(token)
        try:
            if isinstance(result, self.stream_type):
                return StreamProxy(result, rec, op.chunk)
            if isinstance(result, self.async_stream_type):
                return AsyncStreamProxy(result, rec, op.chunk)
            legacy = self.legacy_raw_type
            if legacy is not None and isinstance(result, legacy) and not rec.stream:
                # the body is already read: its facts now (openai caches the parse for the caller)
                try:
                    parsed = result.parse()
                except Exception as exc:  # the host's own (``.parse()``'s finish-reason errors): the
                    self._completion_of(op, rec, exc)  # caller's parse raises it too; the call failed as
                    rec.finish(ERROR, exc)      # a plain ``.parse()`` does
                    return result
                op.response(rec, parsed)
                rec.read_output = True
            elif (legacy is not None and isinstance(result, legacy)) or isinstance(result, self.raw_types):
                return RawResponse(result, rec, op, (self.stream_type, self.async_stream_type))
            elif hasattr(result, "model_dump"):
                op.response(rec, result)
                rec.read_output = True
        except Exception as exc:
            self.guard.failed(f"openai {op.operation} (after)", exc)
        rec.finish(COMPLETE)
        return result

    def _completion_of(self, op: Any, rec: CallRecord, exc: BaseException) -> None:
        """``.parse()`` raises ``ContentFilterFinishReasonError`` / ``LengthFinishReasonError`` for a
        response the API did return: the error span keeps that response's facts (id, usage, finish reasons)."""
        completion = getattr(exc, "completion", None)
        if completion is None or not hasattr(completion, "model_dump"):
            return
        try:
            op.response(rec, completion)
            rec.read_output = True
        except Exception as err:
            self.guard.failed("openai parse error facts", err)

    def _helper_closed(self, helper: Any) -> None:
        try:
            raw = helper_raw_stream(helper)
            if type(raw) in (StreamProxy, AsyncStreamProxy):  # type(), not isinstance: the proxy answers
                raw._end(CLOSED)                                  # the wrapped stream's class
        except Exception as exc:
            self.guard.failed("openai stream helper close", exc)

    def _detach(self, token: object) -> None:
        if token is None:  # a borrowed span: nothing of ours was attached
            return
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
        except Exception as exc:
            self.guard.failed("openai context detach", exc)

    def _server(self, instance: Any) -> tuple[str | None, int | None]:
        url = instance._client.base_url
        port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
        return (url.host or None, port)


_OWN = object()  # _defer's answer: no upstream wrapper below ours


# W3C Trace Context: a caller who sends its own ``traceparent`` owns the pair.
TRACE_CONTEXT_HEADERS = ("traceparent", "tracestate")


def with_trace_headers(kwargs: dict, ctx: Any, instance: Any) -> dict:
    """``kwargs`` with our propagator's headers added to ``extra_headers``; nothing else changes.

    The caller's ``extra_headers`` (any ``Mapping``: ``dict``, ``httpx.Headers``, ``MappingProxyType``,
    with ``Omit`` values) are kept as they are, in a new ``dict`` (the caller's object is never
    mutated). A header the caller already sets, in ``extra_headers`` or in the client's
    ``default_headers`` (names compared case-insensitively, an ``Omit`` value included), is not
    added; a caller's own ``traceparent`` also keeps our ``tracestate`` out. A value that is not a
    ``Mapping`` is left alone and nothing is injected (openai would reject or misread a merge).
    """
    ours: dict[str, str] = {}
    propagate.inject(ours, context=ctx)
    if not ours:
        return kwargs
    given = kwargs.get("extra_headers")
    if given is not None and not isinstance(given, Mapping):
        return kwargs
    taken = {str(k).lower() for k in given} if given else set()
    client = getattr(instance, "_client", None)
    defaults = getattr(client, "default_headers", None) if client is not None else None
    if isinstance(defaults, Mapping):
        taken.update(str(k).lower() for k in defaults)
    if TRACE_CONTEXT_HEADERS[0] in taken:
        taken.update(TRACE_CONTEXT_HEADERS)
    add = {k: v for k, v in ours.items() if k.lower() not in taken}
    if not add:
        return kwargs
    merged: dict[str, Any] = dict(given.items()) if given else {}
    merged.update(add)
    return {**kwargs, "extra_headers": merged}
