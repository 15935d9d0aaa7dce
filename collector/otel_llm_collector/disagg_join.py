"""Processor ``disagg_join``: a disaggregated user request, joined from its prefill and decode halves.

Under disaggregated serving the prefill instance (P) and the decode instance (D) each report their half of a
user request (``llm.disagg.role``: ``prefill``, ``decode``); neither is the user's request. The gateway sees
both request spans of the trace: it joins them (``otel_llm.core.disagg``) into the user's request, recorded
once in the derived metrics with ``llm.disagg.role=user`` (the halves' own series keep their roles and stay
out of the goodput counters), its breaches judged on the user's figures against its SLO scope (its model and
tenant: the prefill half's tenant, else the decode half's) and charged to the half whose cause weighs more
(``otelcol_llm_disagg_user_breaches_total{objective, side, cause}``).

Halves wait for their partner in a bounded table, for at most ``wait`` seconds of the gateway's clock: a
decode half whose prefill half never came (P not instrumented, its span lost) is then recorded as the user's
request on its own (D served every token the user got); a lone prefill half is forgotten. Both are counted.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any, Callable

from otel_llm import semconv as sc
from otel_llm.core.disagg import HALVES, USER, join, verdict
from otel_llm.core.slo import SLOTable

from .spans import Extracted, RequestFacts
from .telemetry import GatewayMetrics

Record = Callable[[list[RequestFacts], Any], None]  # (user requests, the peer that sent the second half)


class DisaggJoin:
    def __init__(self, record: Record, slos: SLOTable, telemetry: GatewayMetrics, clock: Callable[[], float],
                 wait: float = 60.0, max_pending: int = 100_000) -> None:
        self._record = record
        self._slos = slos
        self._t = telemetry
        self._clock = clock
        self._wait = wait
        self._max = max_pending
        # trace id -> (arrived at, the half): in arrival order, so the oldest expire first
        self._pending: OrderedDict[bytes, tuple[float, RequestFacts]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Halves waiting for their partner (each later batch settles those past ``wait``)."""
        return len(self._pending)

    def process(self, batch: Extracted, peer: Any = None) -> list[RequestFacts]:
        """Join the halves in ``batch`` with those waiting; returns the user requests recorded."""
        halves = [r for r in batch.requests if r.summary.disagg_role in HALVES]
        if not halves and not self._pending:
            return []
        users: list[RequestFacts] = []
        forgotten = 0
        with self._lock:
            now = self._clock()
            pending = self._pending
            for r in halves:
                waiting = pending.get(r.trace_id)
                if waiting is None or waiting[1].summary.disagg_role == r.summary.disagg_role:
                    pending[r.trace_id] = (now, r)  # (a second span of the same half: the later one waits)
                    if len(pending) > self._max:
                        _, (_, old) = pending.popitem(last=False)
                        forgotten += self._expired(old, users)
                    continue
                del pending[r.trace_id]
                users.append(self._joined(waiting[1], r))
            while pending:  # partners that did not come in time
                tid, (at, old) = next(iter(pending.items()))
                if at + self._wait > now:
                    break
                del pending[tid]
                forgotten += self._expired(old, users)
        if forgotten:
            self._t.inc("disagg_join_forgotten", forgotten)
        if users:
            self._t.inc("disagg_join_joined", len(users))
            self._record(users, peer)
        return users

    def _joined(self, a: RequestFacts, b: RequestFacts) -> RequestFacts:
        prefill, decode = (a, b) if a.summary.disagg_role == sc.DISAGG_ROLE_PREFILL else (b, a)
        user = join(prefill.summary, decode.summary)
        breached = self._slos.for_request(user.model, user.tenant).breaches(user)
        if breached:
            v = verdict(prefill.summary, decode.summary, breached)
            user.slow_cause = v.cause
            for objective in breached:
                self._t.inc("disagg_user_breaches", objective=objective, side=v.side or sc.SLOW_UNKNOWN,
                            cause=v.cause)
        return RequestFacts(decode.trace_id, decode.service, user, decode.source, None, True)

    def _expired(self, half: RequestFacts, users: list[RequestFacts]) -> int:
        """A half whose partner never came: a decode half is the user's request on its own (counted as
        forgotten either way)."""
        if half.summary.disagg_role == sc.DISAGG_ROLE_DECODE:
            users.append(RequestFacts(half.trace_id, half.service, dataclasses.replace(half.summary, disagg_role=USER),
                                      half.source, None, half.parented))
        return 1
