"""Stream proxies: time every chunk, end the call's span exactly once, however the stream ends.

The stream ends by exhaustion, an error while reading, ``close()``, leaving a ``with`` block,
or abandonment: the caller breaks out of the loop and drops the stream without closing it.
A ``weakref.finalize`` on the proxy catches the last case (and streams still open at
interpreter exit); the span then ends at the last chunk seen, with
``llm.client.stream.end = abandoned``. The finalizer holds the record, never the proxy, so
it does not keep the stream alive. Per chunk: one clock read, the operation's O(1) chunk
reader, one ``CallRecord.chunk``; no span events, no allocation beyond the host's own.
"""

from __future__ import annotations

import weakref
from time import perf_counter
from typing import Any, Callable

import wrapt

from ...core.guard import GUARD
from .record import CLOSED, COMPLETE, ERROR, CallRecord

ChunkReader = Callable[[CallRecord, Any], int]


def _end(rec: CallRecord, finalizer: weakref.finalize, how: str, exc: BaseException | None = None) -> None:
    finalizer.detach()
    rec.finish(how, exc)


class _Base(wrapt.ObjectProxy):  # type: ignore[misc]
    def __init__(self, wrapped: Any, rec: CallRecord, reader: ChunkReader) -> None:
        super().__init__(wrapped)
        rec.read_output = True  # the stream's chunks are the output: its facts are known when it ends
        self._self_rec = rec
        self._self_reader = reader
        self._self_finalizer = weakref.finalize(self, rec.abandon)

    def _self_chunk(self, chunk: Any) -> None:
        now = perf_counter()
        rec = self._self_rec
        try:
            rec.chunk(now, self._self_reader(rec, chunk))
        except Exception as exc:
            GUARD.failed("openai stream chunk", exc)

    def _self_end(self, how: str, exc: BaseException | None = None) -> None:
        _end(self._self_rec, self._self_finalizer, how, exc)


class StreamProxy(_Base):
    """Wraps ``openai.Stream``."""

    def __iter__(self) -> "StreamProxy":
        return self

    def __next__(self) -> Any:
        try:
            chunk = self.__wrapped__.__next__()
        except StopIteration:
            self._self_end(COMPLETE)
            raise
        except BaseException as exc:
            self._self_end(ERROR, exc)
            raise
        self._self_chunk(chunk)
        return chunk

    def __enter__(self) -> "StreamProxy":
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(exc_type, exc, tb)
        finally:
            self._self_end(CLOSED if exc is None else ERROR, exc)

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_end(CLOSED)


class AsyncStreamProxy(_Base):
    """Wraps ``openai.AsyncStream``."""

    def __aiter__(self) -> "AsyncStreamProxy":
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            self._self_end(COMPLETE)
            raise
        except BaseException as exc:
            self._self_end(ERROR, exc)
            raise
        self._self_chunk(chunk)
        return chunk

    async def __aenter__(self) -> "AsyncStreamProxy":
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(exc_type, exc, tb)
        finally:
            self._self_end(CLOSED if exc is None else ERROR, exc)

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._self_end(CLOSED)
