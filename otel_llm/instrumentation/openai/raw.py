"""``with_raw_response`` and ``with_streaming_response``: the call returns when the headers arrive,
so the span must not end there. The raw response is wrapped; the span ends with what the caller
does with it:

- ``.parse()`` of a stream returns our stream proxy (the same one on every ``parse()``): timed per
  chunk and ended exactly as a plain stream;
- ``.parse()`` of a body gives the response's facts (id, usage, finish reasons) and ends the span;
- direct iteration of the raw body (``iter_lines``/``iter_bytes``/``iter_text``, also through
  ``http_response``) ends the span at the last piece read; over ``iter_lines`` each SSE event of
  output counts as a chunk (chat: ``data:`` with choices; Responses: ``event: *.delta``), without
  the content facts a parsed chunk has (usage, finish reasons, characters);
- ``close()`` (the ``with`` block's exit) before any of that ends it as ``closed``; a raw
  response dropped unread ends it as ``abandoned`` at the last thing seen.
"""

from __future__ import annotations

import inspect
import weakref
from time import perf_counter
from typing import Any, AsyncIterator, Callable, Iterator

import wrapt

from .record import ABANDONED, CLOSED, COMPLETE, ERROR, CallRecord
from .stream import AsyncStreamProxy, StreamProxy

_ITERATORS = ("iter_lines", "iter_bytes", "iter_text", "iter_raw")


def _classify(line: str, state: list) -> int:
    """One SSE line of a raw stream: 0 for an output chunk (content unknown here), -1 otherwise."""
    if line.startswith("event:"):
        state[0] = line[6:].strip()
        return -1
    if not line.startswith("data:") or "[DONE]" in line:
        return -1
    event, state[0] = state[0], None
    if event is not None:
        return 0 if event.endswith(".delta") else -1
    return 0 if '"choices":[' in line and '"choices":[]' not in line else -1


def timed(source: Iterator[Any], rec: CallRecord, lines: bool) -> Iterator[Any]:
    state: list = [None]
    last = None
    try:
        for piece in source:
            last = perf_counter()
            if lines:
                try:
                    rec.chunk(last, _classify(piece, state))
                except Exception as exc:
                    rec.owner.guard.failed("openai raw stream line", exc)
            yield piece
    except GeneratorExit:
        rec.finish(CLOSED, at=last)
        raise
    except BaseException as exc:
        rec.finish(ERROR, exc)
        raise
    rec.finish(COMPLETE, at=last)


async def atimed(source: AsyncIterator[Any], rec: CallRecord, lines: bool) -> AsyncIterator[Any]:
    state: list = [None]
    last = None
    try:
        async for piece in source:
            last = perf_counter()
            if lines:
                try:
                    rec.chunk(last, _classify(piece, state))
                except Exception as exc:
                    rec.owner.guard.failed("openai raw stream line", exc)
            yield piece
    except GeneratorExit:
        rec.finish(CLOSED, at=last)
        raise
    except BaseException as exc:
        rec.finish(ERROR, exc)
        raise
    rec.finish(COMPLETE, at=last)


class _HttpResponse(wrapt.ObjectProxy):  # type: ignore[misc]
    """``raw.http_response``, with its body iterators timed."""

    def __init__(self, wrapped: Any, rec: CallRecord, stream: bool) -> None:
        super().__init__(wrapped)
        self._self_rec = rec
        self._self_stream = stream

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.__wrapped__, name)
        if name in _ITERATORS or name.startswith("aiter_") and name[1:] in _ITERATORS:
            rec, lines = self._self_rec, self._self_stream and name.endswith("lines")
            if name.startswith("aiter_"):
                return lambda *a, **k: atimed(attr(*a, **k), rec, lines)
            return lambda *a, **k: timed(attr(*a, **k), rec, lines)
        return attr


class RawResponse(wrapt.ObjectProxy):  # type: ignore[misc]
    """Wraps ``LegacyAPIResponse`` / ``APIResponse`` / ``AsyncAPIResponse`` of one call."""

    def __init__(self, wrapped: Any, rec: CallRecord, op: Any, stream_types: tuple[type, type]) -> None:
        super().__init__(wrapped)
        self._self_rec = rec
        self._self_op = op
        self._self_stream_types = stream_types
        self._self_parsed: dict[Any, Any] = {}
        self._self_finalizer = weakref.finalize(self, rec.abandon)

    # -- what the caller gets from parse() -----------------------------------------------------

    def _self_take(self, to: Any, parsed: Any) -> Any:
        rec = self._self_rec
        try:
            if to in self._self_parsed:
                return self._self_parsed[to]
            sync_type, async_type = self._self_stream_types
            if isinstance(parsed, sync_type):
                out: Any = StreamProxy(parsed, rec, self._self_op.chunk)
            elif isinstance(parsed, async_type):
                out = AsyncStreamProxy(parsed, rec, self._self_op.chunk)
            else:
                out = parsed
                if not rec.done and hasattr(parsed, "model_dump"):
                    rec.read_output = True
                    self._self_op.response(rec, parsed)
            if out is not parsed:
                self._self_finalizer.detach()  # the stream proxy owns the end now
            self._self_parsed[to] = out
        except Exception as exc:
            rec.owner.guard.failed("openai raw parse", exc)
            return parsed
        if out is parsed:
            self._self_end(COMPLETE)
        return out

    def _self_end(self, how: str, exc: BaseException | None = None) -> None:
        self._self_finalizer.detach()
        self._self_rec.finish(how, exc)

    def _self_parse(self, to: Any, call: Callable[[], Any]) -> Any:
        try:
            parsed = call()
        except BaseException as exc:
            self._self_end(ERROR, exc)
            raise
        return self._self_take(to, parsed)

    def parse(self, *, to: Any = None) -> Any:
        method = self.__wrapped__.parse
        if inspect.iscoroutinefunction(method):
            return self._self_aparse(to, method)
        return self._self_parse(to, lambda: method(to=to) if to is not None else method())

    async def _self_aparse(self, to: Any, method: Any) -> Any:
        try:
            parsed = await (method(to=to) if to is not None else method())
        except BaseException as exc:
            self._self_end(ERROR, exc)
            raise
        return self._self_take(to, parsed)

    # -- the raw body, read directly -----------------------------------------------------------

    @property
    def http_response(self) -> Any:
        return _HttpResponse(self.__wrapped__.http_response, self._self_rec, self._self_rec.stream)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.__wrapped__, name)
        if name in _ITERATORS:
            self._self_finalizer.detach()
            rec, lines = self._self_rec, self._self_rec.stream and name == "iter_lines"
            if inspect.isasyncgenfunction(attr) or inspect.iscoroutinefunction(attr):
                return lambda *a, **k: atimed(attr(*a, **k), rec, lines)
            return lambda *a, **k: timed(attr(*a, **k), rec, lines)
        return attr

    def close(self) -> Any:
        method = self.__wrapped__.close
        if inspect.iscoroutinefunction(method):
            return self._self_aclose(method)
        try:
            return method()
        finally:
            self._self_end_if_unparsed()

    async def _self_aclose(self, method: Any) -> Any:
        try:
            return await method()
        finally:
            self._self_end_if_unparsed()

    def _self_end_if_unparsed(self) -> None:
        # a stream handed to the caller ends with the stream; closing the raw response first is the
        # ``with`` block ending: the stream proxy sees it as closed when its own close/exit runs
        if not self._self_parsed:
            self._self_end(CLOSED)
        else:
            for out in self._self_parsed.values():
                if isinstance(out, (StreamProxy, AsyncStreamProxy)):
                    out._end(CLOSED)


__all__ = ["RawResponse", "ABANDONED"]
