"""The one private name of the ``openai`` package we rely on, fenced here with a test
(``tests/openai/test_fence.py``) that fails loudly when it moves.

``with_raw_response`` returns ``openai._legacy_response.LegacyAPIResponse`` (not exported at the
package's top level). Without it, raw responses are still measured, but as a call that ends when
its headers arrive (the behaviour issue 15 fixed), so the test must fail rather than degrade.
"""

from __future__ import annotations


def legacy_api_response() -> type | None:
    try:
        from openai._legacy_response import LegacyAPIResponse
    except ImportError:  # pragma: no cover - the fence test reports this
        return None
    return LegacyAPIResponse
