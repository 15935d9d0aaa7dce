"""Processor ``ttft_join``: what the caller waited beyond the engine's time to first token.

A streamed client call (our openai adapter) reports its time to the first chunk; the server
request span in the same trace (``vllm serve`` under our SDK, or vLLM's native span) reports
the engine's time to first token. Neither process knows the other's number; the gateway sees
both spans of the trace. Their difference — transport, HTTP and serving-layer overhead — is
recorded as the histogram ``llm.client.overhead.time_to_first_chunk`` for 100% of traffic
(before sampling), by model and client service.

Halves wait for their partner in a bounded table (oldest forgotten first, counted): the two
spans come from different processes, in either order, usually within seconds. A request span
without a parent waits for nobody: no caller traced it, so no client span will come.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from otel_llm import semconv as sc
from otel_llm.core.disagg import HALVES
from otel_llm.core.metrics import CLIENT_OVERHEAD, create

from .spans import Extracted
from .telemetry import GatewayMetrics

OVERHEAD = CLIENT_OVERHEAD.name  # declared once, in the core's metric tables


class TTFTJoin:
    def __init__(self, meter_provider: Any, telemetry: GatewayMetrics, max_pending: int = 100_000,
                 max_label_length: int = 256) -> None:
        self._max_len = max_label_length  # model and service come from clients: cut them (as llm_metrics)
        meter = meter_provider.get_meter("otel_llm_collector.ttft_join")
        self._hist = create(meter, CLIENT_OVERHEAD)
        self._t = telemetry
        self._max = max_pending
        self._clients: OrderedDict[bytes, tuple[float, str | None, str]] = OrderedDict()
        self._servers: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def process(self, batch: Extracted) -> None:
        joined: list[tuple[float, str | None, str]] = []
        forgotten = 0
        with self._lock:
            clients, servers = self._clients, self._servers
            for c in batch.clients or ():
                server_ttft = servers.pop(c.trace_id, None)
                if server_ttft is None:
                    forgotten += self._remember(clients, c.trace_id, (c.ttfc, c.model, c.service))
                else:
                    joined.append((c.ttfc - server_ttft, c.model, c.service))
            for r in batch.requests:
                if not r.parented or r.summary.ttft is None or r.summary.disagg_role in HALVES:
                    continue  # (a disaggregated request's halves: the user's request joined from them comes later)
                client = clients.pop(r.trace_id, None) if clients else None
                if client is None:
                    forgotten += self._remember(servers, r.trace_id, r.summary.ttft)
                else:
                    joined.append((client[0] - r.summary.ttft, client[1], client[2]))
        if forgotten:
            self._t.inc("ttft_join_forgotten", forgotten)
        for overhead, model, service in joined:
            attrs = {sc.SERVICE_NAME: service[:self._max_len]}
            if model:
                attrs[sc.REQUEST_MODEL] = model[:self._max_len]
            self._hist.record(overhead, attrs)
        if joined:
            self._t.inc("ttft_join_joined", len(joined))

    def _remember(self, table: OrderedDict, key: bytes, value: Any) -> int:
        """Keep ``key`` waiting for its partner; returns how many waiting entries were forgotten for it."""
        table[key] = value
        if len(table) > self._max:
            table.popitem(last=False)
            return 1
        return 0
