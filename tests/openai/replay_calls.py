"""One body for every way of calling the openai client on a recording: sync or async, plain,
``with_raw_response`` (then ``.parse()``), or ``with_streaming_response`` (then ``.parse()``).
Returns what the caller saw as plain data, so two runs can be compared for equality."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import openai

from replay_server import Recording

VARIANTS = ("plain", "raw", "streaming_response")


def _method(client: Any, api: str, variant: str) -> Callable[..., Any]:
    resource = {"chat": client.chat.completions, "responses": client.responses,
                "embeddings": client.embeddings, "completions": client.completions}[api]
    if variant == "raw":
        return resource.with_raw_response.create
    if variant == "streaming_response":
        return resource.with_streaming_response.create
    return resource.create


def _dump(item: Any) -> Any:
    return item.model_dump() if hasattr(item, "model_dump") else item


def _error(exc: BaseException, items: list[Any]) -> tuple[Any, ...]:
    return ("raised", type(exc).__name__, str(exc), getattr(exc, "status_code", None), items)


def call_sync(base_url: str, rec: Recording, variant: str = "plain", **overrides: Any) -> tuple[Any, ...]:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    kwargs = {**rec.request, **overrides}
    items: list[Any] = []
    try:
        if variant == "streaming_response":
            with _method(client, rec.api, variant)(**kwargs) as response:
                result = response.parse()
                if rec.stream:
                    for c in result:
                        items.append(_dump(c))
                    return ("ok", items)
                return ("ok", _dump(result))
        result = _method(client, rec.api, variant)(**kwargs)
        if variant == "raw":
            result = result.parse()
        if kwargs.get("stream"):
            for c in result:
                items.append(_dump(c))
            return ("ok", items)
        return ("ok", _dump(result))
    except openai.APIError as exc:  # the API's own errors (status, connection, in-band)
        return _error(exc, items)


def call_async(base_url: str, rec: Recording, variant: str = "plain", **overrides: Any) -> tuple[Any, ...]:
    async def run() -> tuple[Any, ...]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
        kwargs = {**rec.request, **overrides}
        items: list[Any] = []
        try:
            if variant == "streaming_response":
                async with _method(client, rec.api, variant)(**kwargs) as response:
                    result = await response.parse()
                    if rec.stream:
                        async for c in result:
                            items.append(_dump(c))
                        return ("ok", items)
                    return ("ok", _dump(result))
            result = await _method(client, rec.api, variant)(**kwargs)
            if variant == "raw":
                result = result.parse()
            if kwargs.get("stream"):
                async for c in result:
                    items.append(_dump(c))
                return ("ok", items)
            return ("ok", _dump(result))
        except openai.APIError as exc:
            return _error(exc, items)
        finally:
            await client.close()
    return asyncio.run(run())


def call(mode: str, base_url: str, rec: Recording, variant: str = "plain", **overrides: Any) -> tuple[Any, ...]:
    return (call_sync if mode == "sync" else call_async)(base_url, rec, variant, **overrides)
