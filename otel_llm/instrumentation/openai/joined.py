"""The client's view against the server's, for one joined trace: what transport and serving cost.

The client cannot know the server's TTFT when its own span ends (the server reports it in
its own span), so the difference is computed where both spans meet: a test, the collector,
or a query. ``ttft_overhead`` is the one definition; the collector stamps it on the client
span as ``llm.client.overhead.time_to_first_chunk``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...core import semconv as sc

OVERHEAD_TTFT = sc.CLIENT_OVERHEAD_TTFC


def ttft_overhead(client: Mapping[str, Any], server: Mapping[str, Any]) -> float | None:
    """Client time to first chunk minus the server's time to first token, in seconds:
    HTTP, the frontend's request handling and detokenization, and the SSE hop back."""
    ttfc = client.get(sc.RESPONSE_TIME_TO_FIRST_CHUNK)
    ttft = server.get(sc.LATENCY_TTFT)
    if isinstance(ttfc, (int, float)) and isinstance(ttft, (int, float)):
        return float(ttfc) - float(ttft)
    return None
