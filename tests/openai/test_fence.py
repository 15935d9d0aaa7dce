"""The openai adapter's one private import (``_fence.py``) still resolves: fail loudly, not silently degrade."""

from openai import OpenAI

from otel_llm.instrumentation.openai._fence import legacy_api_response


def test_legacy_api_response_is_what_with_raw_response_returns() -> None:
    legacy = legacy_api_response()
    assert legacy is not None, "openai moved LegacyAPIResponse: update instrumentation/openai/_fence.py"
    from openai._legacy_response import to_raw_response_wrapper
    assert "LegacyAPIResponse" in str(to_raw_response_wrapper.__annotations__.get("return", ""))
    assert OpenAI(api_key="x").chat.completions.with_raw_response is not None


def test_stream_helpers_keep_their_raw_stream_where_the_fence_reads_it() -> None:
    """``.stream()``'s helpers: the wrapped ``close()`` methods exist, and the helper holds the stream ``create``
    returned in the attribute ``_fence.helper_raw_stream`` reads (else leaving their ``with`` block early
    would end our span as ``abandoned``, later, instead of ``closed``)."""
    import importlib
    import inspect

    from otel_llm.instrumentation.openai._fence import HELPER_CLOSES, helper_raw_stream

    for module, dotted, asynchronous in HELPER_CLOSES:
        owner_name, method = dotted.split(".")
        owner = getattr(importlib.import_module(module), owner_name)
        assert inspect.iscoroutinefunction(getattr(owner, method)) == asynchronous, dotted
        assert "self._raw_stream = raw_stream" in inspect.getsource(owner.__init__), \
            f"openai changed {owner_name}: update instrumentation/openai/_fence.py"
    sentinel = object()
    fake = type("Helper", (), {})()
    fake._raw_stream = sentinel
    assert helper_raw_stream(fake) is sentinel
