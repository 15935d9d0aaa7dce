"""The openai adapter's one private import (``_fence.py``) still resolves: fail loudly, not silently degrade."""

from openai import OpenAI

from otel_llm.instrumentation.openai._fence import legacy_api_response


def test_legacy_api_response_is_what_with_raw_response_returns() -> None:
    legacy = legacy_api_response()
    assert legacy is not None, "openai moved LegacyAPIResponse: update instrumentation/openai/_fence.py"
    from openai._legacy_response import to_raw_response_wrapper
    assert "LegacyAPIResponse" in str(to_raw_response_wrapper.__annotations__.get("return", ""))
    assert OpenAI(api_key="x").chat.completions.with_raw_response is not None
