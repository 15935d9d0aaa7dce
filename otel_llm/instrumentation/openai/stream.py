"""Stream proxies: time every chunk, end the call's span exactly once, however the stream ends.

The stream ends by exhaustion, an error while reading, ``close()``, leaving a ``with`` block,
or abandonment: the caller breaks out of the loop and drops the stream without closing it.
A ``weakref.finalize`` on the proxy catches the last case (and streams still open at
interpreter exit); the span then ends at the last chunk seen, with
``llm.client.stream.end = abandoned``. The finalizer holds the record, never the proxy, so
it does not keep the stream alive.

Per chunk: one clock read and the operation's chunk reader, which appends the arrival time to
the record (8 bytes) and counts characters; no span events, no allocation beyond that. The proxy
is a plain ``__slots__`` class, not a ``wrapt.ObjectProxy`` (whose generic forwarding is paid on
every ``next()``: benchmarks/client_overhead.py measures the hot path), and ``for chunk in stream``
runs in one generator frame rather than a method call per chunk. It stays transparent: ``isinstance(proxy, openai.Stream)`` holds
(``__class__`` answers the wrapped stream's class, as wrapt's proxies do), every other attribute
(``response``, ``until_done`` ...) is the wrapped stream's, attribute writes go to it.
"""

from __future__ import annotations

import weakref
from time import perf_counter
from typing import Any, AsyncIterator, Callable, Iterator

from .record import CLOSED, COMPLETE, ERROR, CallRecord

# reader(rec, chunk, now): notes one received chunk in the record (ops.py: ``Chat.chunk``...)
ChunkReader = Callable[[CallRecord, Any, float], None]
_SITE = "openai stream chunk"


class _Proxy:
    __slots__ = ("__wrapped__", "_rec", "_reader", "_finalizer", "__weakref__")
    _own = frozenset(__slots__)

    def __init__(self, wrapped: Any, rec: CallRecord, reader: ChunkReader) -> None:
        put = object.__setattr__
        put(self, "__wrapped__", wrapped)
        put(self, "_rec", rec)
        put(self, "_reader", reader)
        rec.read_output = True  # the stream's chunks are the output: its facts are known when it ends
        put(self, "_finalizer", weakref.finalize(self, rec.abandon))

    # -- transparency: the caller sees the wrapped stream -----------------------------------------

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(proxy, openai.Stream) holds, as for a wrapt proxy
        return type(self.__wrapped__)

    def __getattr__(self, name: str) -> Any:
        if name == "__wrapped__":  # not set yet (a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _Proxy._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.__wrapped__, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__wrapped__, name)

    def __dir__(self) -> list[str]:
        return dir(self.__wrapped__)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)

    # -- the end, exactly once ---------------------------------------------------------------------

    def _end(self, how: str, exc: BaseException | None = None) -> None:
        self._finalizer.detach()
        self._rec.finish(how, exc)


class StreamProxy(_Proxy):
    """Wraps ``openai.Stream``."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        # ``openai.Stream.__iter__`` is a generator too: ``iter(stream)`` was never the stream itself
        rec, reader = self._rec, self._reader
        at_yield = False
        try:
            for chunk in self.__wrapped__:
                now = perf_counter()
                try:
                    reader(rec, chunk, now)
                except Exception as exc:
                    rec.owner.guard.failed(_SITE, exc)
                at_yield = True
                yield chunk
                at_yield = False
        except BaseException as exc:
            # thrown in at ``yield`` (the caller left the loop: GeneratorExit; asyncio cancelling the
            # dropped generator's close): not the stream's failure; it goes on, or is abandoned
            if not at_yield:
                self._end(ERROR, exc)
            raise
        self._end(COMPLETE)

    def __next__(self) -> Any:
        try:
            chunk = self.__wrapped__.__next__()
        except StopIteration:
            self._end(COMPLETE)
            raise
        except BaseException as exc:
            self._end(ERROR, exc)
            raise
        now = perf_counter()
        try:
            self._reader(self._rec, chunk, now)
        except Exception as exc:
            self._rec.owner.guard.failed(_SITE, exc)
        return chunk

    def __enter__(self) -> "StreamProxy":
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(exc_type, exc, tb)
        finally:
            self._end(CLOSED if exc is None else ERROR, exc)

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._end(CLOSED)


class AsyncStreamProxy(_Proxy):
    """Wraps ``openai.AsyncStream``."""

    __slots__ = ()

    async def __aiter__(self) -> AsyncIterator[Any]:
        rec, reader = self._rec, self._reader
        at_yield = False
        try:
            async for chunk in self.__wrapped__:
                now = perf_counter()
                try:
                    reader(rec, chunk, now)
                except Exception as exc:
                    rec.owner.guard.failed(_SITE, exc)
                at_yield = True
                yield chunk
                at_yield = False
        except BaseException as exc:
            if not at_yield:  # as in StreamProxy.__iter__
                self._end(ERROR, exc)
            raise
        self._end(COMPLETE)

    async def __anext__(self) -> Any:
        try:
            chunk = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            self._end(COMPLETE)
            raise
        except BaseException as exc:
            self._end(ERROR, exc)
            raise
        now = perf_counter()
        try:
            self._reader(self._rec, chunk, now)
        except Exception as exc:
            self._rec.owner.guard.failed(_SITE, exc)
        return chunk

    async def __aenter__(self) -> "AsyncStreamProxy":
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(exc_type, exc, tb)
        finally:
            self._end(CLOSED if exc is None else ERROR, exc)

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._end(CLOSED)
