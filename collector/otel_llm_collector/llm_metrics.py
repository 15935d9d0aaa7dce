"""Processor ``llm_metrics``: derive the core's server metrics from request spans, for 100% of traffic.

Runs on every received request span before sampling. The derivation is the core's
(``RequestSummary.from_attributes`` + ``ServerMetrics``), so the collector's histograms
are the SDK's, bucket for bucket; here they are labelled by ``service.name`` as well. The
instruments are the core's too; the gateway hands them a light aggregation backend
(``aggregation.py``) instead of the OpenTelemetry SDK, whose per-call work would dominate the receive path.

Label values come from clients, so what they can cost is bounded (``LabelLimits``): every label
value (service, model, operation, provider, error type, LoRA adapter, request tenant: cleaned as the SDK cleans
it, core/tenant.py) is cut to ``max_label_length`` characters
(counted in ``llm_metrics_labels_truncated``); the bound label sets of all services share one LRU
cache with a byte budget (``label_cache_size``; a label set that fell out is bound again on its next
request). Label sets (model, operation, provider, error type, adapter, tenant) are admitted per service up to
``max_series_per_service``, per tenant (``max_series_per_tenant``: the bearer token's) and per source address
(``max_series_per_source``; trusted peers exempt) and ``max_series`` in all, so a flooder rotating service
names still spends only its own budget; a request whose label set is not admitted is
recorded in its service's overflow label set (``otel.metric.overflow=true``, no model or provider,
operation and error type ``_OTHER``, judged by the default SLO; one per service, and it counts toward
``max_series`` too) or, once ``max_series`` is reached, in the global overflow label set (no service
either), and counted in ``llm_metrics_overflow_requests{budget, tenant}``. So at most ``max_series + 1`` label sets
exist, and the scrape's size is bounded by that. Admission is decided here, once per label set, so a flood of junk
label values costs a set lookup per request, not a new binding; the aggregation backend caps series
per instrument as well (a backstop, and for instruments with several series per label set).
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from typing import Any, Iterable

from otel_llm.core.summary import RequestSummary
from otel_llm.core.slo import SLOTable

from .aggregation import attributes_key
from .config import LabelLimits
from .exemplars import EXEMPLAR_HISTOGRAMS, ExemplarStore
from .fairness import Peer
from .fast.metrics import BatchMetrics, label_key
from .spans import SERVICE_NAME, RequestFacts
from .telemetry import GatewayMetrics

# what one bound label set costs besides its label values (measured with tracemalloc: a _Bound with its
# 3 dicts, ~12 recorder closures and the cache entry; tests/collector/test_label_memory.py checks it)
BOUND_LABEL_SET_BYTES = 6000
_LABEL_FIELDS = ("model", "operation", "provider", "error_type", "lora", "disagg_role", "tenant")
OTHER = "_OTHER"
_SLOTS = RequestSummary.__slots__
OVERFLOW_KEY = "otel.metric.overflow"


class ByteBudgetLRU:
    """The label-set cache: least recently used entries go once their estimated bytes exceed ``budget``."""

    def __init__(self, budget: int, cost: Any) -> None:
        self._budget = budget
        self._cost = cost  # key -> estimated bytes
        self._d: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def get(self, key: tuple) -> Any:
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: tuple, bound: Any) -> None:
        cost = self._cost(key)
        if cost > self._budget:
            return
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._d[key] = (bound, cost)
        self.bytes += cost
        while self.bytes > self._budget:
            _, (_, c) = self._d.popitem(last=False)
            self.bytes -= c
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._d)


def _key_cost(key: tuple) -> int:
    """A label-set key's estimated bytes: the fixed part plus its strings, held by ~3 dicts and the key."""
    strings = 0
    for part in key:
        if isinstance(part, str):
            strings += sys.getsizeof(part)
        elif isinstance(part, tuple):  # extra: ((name, value), ...)
            strings += sum(sys.getsizeof(v) for kv in part for v in kv if isinstance(v, str))
    return BOUND_LABEL_SET_BYTES + strings


class LLMMetricsProcessor:
    def __init__(self, meter_provider: Any, slos: SLOTable, telemetry: GatewayMetrics,
                 limits: LabelLimits = LabelLimits()) -> None:
        """``meter_provider``: the collector's ``AggregationBackend`` (its instruments take lists of values)."""
        self._meter = meter_provider.get_meter("otel_llm_collector.llm_metrics")
        self._slos = slos
        self._telemetry = telemetry
        self._max_len = limits.max_label_length
        self.label_sets = ByteBudgetLRU(limits.label_cache_bytes, _key_cost)
        self._metrics = BatchMetrics(self._meter, slos, self.label_sets)
        self._extra: dict[str, tuple[tuple[str, str], ...]] = {}  # service -> its extra labels (interned)
        self._max_series = limits.max_series
        self._share = limits.max_series_per_service
        self._admitted: dict[str, set[tuple]] = {}  # service -> label sets with series of their own
        self._overflowing: set[str] = set()  # services with an overflow label set of their own
        self._n_admitted = 0
        # label sets (and overflow label sets) each tenant / source address made exist: a flooder rotating
        # service names still spends one budget. A key exists only once it holds one, so each table has at
        # most max_series entries whatever the number of sources.
        self._per_tenant = limits.max_series_per_tenant
        self._per_source = limits.max_series_per_source
        self._budgets: dict[str, int] = {}
        # set by the gateway: candidate exemplars per request (``exemplars_kept``: no tail sampler, all are kept)
        self.exemplars: ExemplarStore | None = None
        self.exemplars_kept = False

    def process(self, requests: Iterable[RequestFacts], peer: Peer | None = None) -> None:
        """Record ``requests`` (all from ``peer``: who sent them, for the tenant and source budgets)."""
        budgets = _budget_keys(peer)
        counts: dict[str, int] = {}
        by_service: dict[Any, dict[tuple, list]] = {}  # service -> label key -> its requests
        n = self._max_len
        overflowed: dict[str, int] = {}  # the budget that refused -> requests
        admitted_of = self._admitted.get
        offers: list | None = [] if self.exemplars is not None else None
        for r in requests:
            s = r.summary
            service = r.service
            key = label_key(s)
            admitted = admitted_of(service)
            # an admitted label set's values (and its service) were cut already: only a new one is looked at
            if admitted is None or key not in admitted:
                for name in _LABEL_FIELDS:  # cut client-chosen label values
                    v = getattr(s, name)
                    if v is not None and len(v) > n:
                        setattr(s, name, v[:n])
                        self._telemetry.inc("llm_metrics_labels_truncated", label=name)
                if len(service) > n:
                    service = service[:n]
                    self._telemetry.inc("llm_metrics_labels_truncated", label="service")
                key = label_key(s)
                admitted = admitted_of(service)
                if admitted is None or key not in admitted:
                    refused_by = self._admit(service, admitted, key, budgets)
                    if refused_by is not None:
                        s = _overflow(s)
                        key = label_key(s)
                        service = self._overflow_group(service, budgets)
                        overflowed[refused_by] = overflowed.get(refused_by, 0) + 1
            groups = by_service.get(service)
            if groups is None:
                by_service[service] = {key: [s]}
            else:
                group = groups.get(key)
                if group is None:
                    groups[key] = [s]
                else:
                    group.append(s)
            counts[r.source] = counts.get(r.source, 0) + 1
            if offers is not None:
                offers.append((r.trace_id, s, service, key))
        for service, groups in by_service.items():  # each under the backend's lock (BatchMetrics holds it)
            self._metrics.record_grouped(groups, self._service_labels(service))
        if offers:
            self._offer(offers)
        for source, n_requests in counts.items():
            self._telemetry.inc("llm_metrics_requests", n_requests, source=source)
        if overflowed:
            tenant = peer.tenant if peer is not None and peer.tenant is not None else ""
            for budget, n_refused in overflowed.items():
                self._telemetry.inc("llm_metrics_overflow_requests", n_refused, budget=budget, tenant=tenant)

    def _offer(self, offers: list) -> None:
        """Each request's latencies as exemplar candidates of the series it was recorded in (the bound label
        set's attributes, as the Prometheus endpoint reads them)."""
        store, now = self.exemplars, time.time()
        assert store is not None
        candidate = store.candidate
        series: dict[tuple, tuple | None] = {}
        out = []
        for trace_id, s, service, key in offers:
            full = key + (self._service_labels(service),)
            skey = series.get(full, ())
            if skey == ():
                bound = self._metrics._cache.get(full)
                skey = series[full] = attributes_key(bound.attributes) if bound is not None else None
            if skey is None:  # the label-set cache forgot it already: no exemplar for this one
                continue
            values = [candidate(spec.name, skey, spec.buckets, v, now)
                      for spec in EXEMPLAR_HISTOGRAMS if (v := spec.value(s)) is not None]
            if values:
                out.append((trace_id, values))
        store.offer(out, self.exemplars_kept)

    def _admit(self, service: str, admitted: set[tuple] | None, key: tuple, budgets: tuple[str, ...]) -> str | None:
        """Admit a new label set; else the budget that refuses it (``total``, ``service``, ``tenant``, ``source``)."""
        if self._n_admitted >= self._max_series:
            return "total"
        if admitted is not None and len(admitted) >= self._share:
            return "service"
        refused = self._over_budget(budgets)
        if refused is not None:
            return refused
        if admitted is None:
            admitted = self._admitted[service] = set()
        admitted.add(key)
        self._charge(budgets)
        self._n_admitted += 1
        return None

    def _over_budget(self, budgets: tuple[str, ...]) -> str | None:
        for b in budgets:
            if self._budgets.get(b, 0) >= (self._per_tenant if b[0] == "t" else self._per_source):
                return "tenant" if b[0] == "t" else "source"
        return None

    def _charge(self, budgets: tuple[str, ...]) -> None:
        for b in budgets:
            self._budgets[b] = self._budgets.get(b, 0) + 1

    def _overflow_group(self, service: str, budgets: tuple[str, ...] = ()) -> Any:
        """The service's overflow group while ``max_series`` and the sender's budgets allow one more label set,
        else the global one (so rotating service names cannot spend ``max_series`` on overflow sets either)."""
        if service in self._overflowing:
            return (service, OVERFLOW_KEY)
        if self._n_admitted < self._max_series and self._over_budget(budgets) is None:
            self._overflowing.add(service)
            self._charge(budgets)
            self._n_admitted += 1
            return (service, OVERFLOW_KEY)
        return (None, OVERFLOW_KEY)

    def _service_labels(self, service: Any) -> tuple[tuple[str, Any], ...]:
        extra = self._extra.get(service)
        if extra is None:
            if isinstance(service, tuple):
                extra = (((SERVICE_NAME, service[0]),) if service[0] is not None else ()) + ((OVERFLOW_KEY, True),)
            else:
                extra = ((SERVICE_NAME, service),)
            if len(self._extra) < 4096:  # bounded: service names come from clients
                self._extra[service] = extra  # type: ignore[index]
        return extra


def _budget_keys(peer: Peer | None) -> tuple[str, ...]:
    """The budgets a sender's new label sets are charged to: its tenant's (with auth) and its source address's
    (not for a trusted peer: the load-balancing tier forwards everyone's spans)."""
    if peer is None:
        return ()
    keys = ("t" + peer.tenant,) if peer.tenant is not None else ()
    return keys if peer.trusted else keys + ("s" + peer.address,)


def _overflow(s: Any) -> Any:
    """A copy of a summary with its client-chosen labels folded into the overflow label set."""
    o = object.__new__(type(s))
    for name in _SLOTS:
        setattr(o, name, getattr(s, name))
    o.model = o.provider = o.lora = o.tenant = None
    o.operation = OTHER
    if o.error_type is not None:
        o.error_type = OTHER  # still failed, as far as goodput is concerned
    return o
