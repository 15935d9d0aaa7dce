"""The one private name of the ``openai`` package we rely on, fenced here with a test
(``tests/openai/test_fence.py``) that fails loudly when it moves.

``with_raw_response`` returns ``openai._legacy_response.LegacyAPIResponse`` (not exported at the
package's top level). Without it, raw responses are still measured, but as a call that ends when
its headers arrive (the behaviour this fence exists to prevent), so the test must fail rather than degrade.
"""

from __future__ import annotations


def legacy_api_response() -> type | None:
    try:
        from openai._legacy_response import LegacyAPIResponse
    except ImportError:  # pragma: no cover - the fence test reports this
        return None
    return LegacyAPIResponse


# The ``.stream()`` helpers (``ChatCompletionStream``, ``ResponseStream``, sync and async) iterate the
# stream ``create`` returned (our proxy, so the call is timed), but their ``close()`` closes the HTTP
# response directly. Their close is wrapped to end our stream as ``closed``; the helper holds the
# stream in its private ``_raw_stream``, and lives in private modules.
HELPER_MODULES = ("openai.lib.streaming.chat._completions", "openai.lib.streaming.responses._responses")
HELPER_CLOSES = (("openai.lib.streaming.chat._completions", "ChatCompletionStream.close", False),
                 ("openai.lib.streaming.chat._completions", "AsyncChatCompletionStream.close", True),
                 ("openai.lib.streaming.responses._responses", "ResponseStream.close", False),
                 ("openai.lib.streaming.responses._responses", "AsyncResponseStream.close", True))


def helper_raw_stream(helper: object) -> object:
    """The stream a ``.stream()`` helper reads (``None`` if openai renamed the attribute)."""
    return getattr(helper, "_raw_stream", None)
