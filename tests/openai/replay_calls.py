"""One body for every way of calling the openai client on a recording: sync or async, plain,
``with_raw_response`` (then ``.parse()``), or ``with_streaming_response`` (then ``.parse()``).
Also openai's helpers, ``.parse()`` (plain and ``with_raw_response``) and ``.stream()``.
Returns what the caller saw as plain data, so two runs can be compared for equality."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Literal

import openai
import pydantic

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
    # warnings off: parsed helper results hold user models where openai's union types expect its own
    return item.model_dump(warnings=False) if hasattr(item, "model_dump") else item


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


# -- openai's helpers: ``.parse()`` (posts directly, not through ``create``) and ``.stream()`` -----------

HELPERS = ("parse", "raw_parse", "stream")


class Location(pydantic.BaseModel):
    """The response format of openai-python's ``test_parse_pydantic_model`` (recording chat_parse_pydantic)."""

    city: str
    temperature: float
    units: Literal["c", "f"]


PARSE_FORMATS = {"chat_parse_pydantic": Location}


def helper_applies(rec: Recording, helper: str) -> bool:
    """``.stream()`` for streamed chat/Responses recordings, ``.parse()`` for their bodies."""
    if rec.api not in ("chat", "responses"):
        return False
    return rec.stream if helper == "stream" else not rec.stream


def _helper_kwargs(rec: Recording, overrides: dict[str, Any]) -> dict[str, Any]:
    kwargs = {k: v for k, v in {**rec.request, **overrides}.items() if k != "stream"}  # the helpers set it
    fmt = PARSE_FORMATS.get(rec.name)
    if fmt is not None:
        kwargs["response_format" if rec.api == "chat" else "text_format"] = fmt
    return kwargs


def _resource(client: Any, rec: Recording) -> Any:
    return client.chat.completions if rec.api == "chat" else client.responses


def helper_sync(base_url: str, rec: Recording, helper: str, **overrides: Any) -> tuple[Any, ...]:
    resource = _resource(openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0), rec)
    kwargs = _helper_kwargs(rec, overrides)
    items: list[Any] = []
    try:
        if helper == "stream":
            with resource.stream(**kwargs) as stream:
                for event in stream:
                    items.append(_dump(event))
                final = stream.get_final_completion() if rec.api == "chat" else stream.get_final_response()
            return ("ok", items, _dump(final))
        if helper == "raw_parse":
            return ("ok", _dump(resource.with_raw_response.parse(**kwargs).parse()))
        return ("ok", _dump(resource.parse(**kwargs)))
    # OpenAIError: also the helpers' own (ContentFilterFinishReasonError...); RuntimeError: a Responses stream
    # without its completed event; ValueError: a tool not `strict` (raised before sending)
    except (openai.OpenAIError, RuntimeError, ValueError) as exc:
        return _error(exc, items)


def helper_async(base_url: str, rec: Recording, helper: str, **overrides: Any) -> tuple[Any, ...]:
    async def run() -> tuple[Any, ...]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
        resource = _resource(client, rec)
        kwargs = _helper_kwargs(rec, overrides)
        items: list[Any] = []
        try:
            if helper == "stream":
                async with resource.stream(**kwargs) as stream:
                    async for event in stream:
                        items.append(_dump(event))
                    final = await (stream.get_final_completion() if rec.api == "chat"
                                   else stream.get_final_response())
                return ("ok", items, _dump(final))
            if helper == "raw_parse":
                return ("ok", _dump((await resource.with_raw_response.parse(**kwargs)).parse()))
            return ("ok", _dump(await resource.parse(**kwargs)))
        except (openai.OpenAIError, RuntimeError, ValueError) as exc:
            return _error(exc, items)
        finally:
            await client.close()
    return asyncio.run(run())


def helper_call(mode: str, base_url: str, rec: Recording, helper: str, **overrides: Any) -> tuple[Any, ...]:
    return (helper_sync if mode == "sync" else helper_async)(base_url, rec, helper, **overrides)
