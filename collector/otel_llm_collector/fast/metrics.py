"""The core's server metrics, recorded a list of requests at a time into the collector's aggregation backend.

The instruments are the core's (``ServerMetrics`` creates them from its table on the backend's meter, and
hands them out as ``Instruments``); so are the label sets (``label_attributes``, ``breach_attributes``) and
the SLO judgement. What is the collector's own: requests are grouped by label set and each histogram gets
the group's values in one call (``bind_many``), each counter one ``add`` per group. Same points as
``ServerMetrics.record`` one request at a time (tests/collector/test_aggregation.py holds them against the
OpenTelemetry SDK).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Protocol, Sequence

from otel_llm import semconv as sc
from otel_llm.core.metrics import ServerMetrics, breach_attributes
from otel_llm.core.slo import SLO, SLOTable
from otel_llm.core.summary import RequestSummary

from ..aggregation import AggregatingMeter

Extra = tuple[tuple[str, Any], ...]
_INPUT_TOKENS = attrgetter("input_tokens")
_OUTPUT_TOKENS = attrgetter("output_tokens")


# What a request's label set depends on (with the caller's ``extra``): (model, operation, provider, error_type,
# LoRA adapter, disaggregated role, tenant).
# An attrgetter builds the tuple in C: no Python frame per request (called once or twice per request span).
label_key: Callable[[RequestSummary], tuple] = attrgetter("model", "operation", "provider", "error_type", "lora",
                                                          "disagg_role", "tenant")
_ROLE = 5  # the key's disagg_role
# halves of a disaggregated request: not user requests, so not in the goodput counters (the user request the
# disagg_join processor joins from them is)
_HALVES = frozenset(("prefill", "decode"))


class LabelSetCache(Protocol):
    """Remembers bound label sets by key; may forget any of them (they are bound again on the next miss)."""

    def get(self, key: tuple) -> Any: ...
    def put(self, key: tuple, bound: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class BoundSet:
    """One label set's recorders, bound once: (value of a summary, record a list of values) per histogram
    (token usage last), the counters' adds, the model's SLO and the breach counter's label set."""

    attributes: dict
    histograms: tuple[tuple[Callable[[RequestSummary], Any], Callable[[list], None]], ...]
    chars: Callable[..., None] | None
    requests: Callable[..., None]
    good: Callable[..., None]
    slo: SLO
    breaches: "_Breaches | None"
    inter_token: Callable[..., None] | None  # adds one request's inter-token bucket counts (its gap summary)
    spec_tokens: tuple[Callable[..., None], Callable[..., None]] | None  # speculative (drafted, accepted) adds


class BatchMetrics:
    """``ServerMetrics`` for lists of requests, on an ``AggregatingMeter`` (which binds label sets once)."""

    def __init__(self, meter: AggregatingMeter, slos: SLOTable, label_sets: LabelSetCache) -> None:
        # The recorders are bound with ``caller_holds_lock``: they are called only inside ``record_grouped``,
        # which holds the backend's lock for the whole batch (one hold, not one per record).
        self._lock = meter.lock
        self._core = ServerMetrics(meter, slos)  # creates the core's instruments from its table, on this meter
        self._instruments = self._core.instruments
        self._slos = slos
        self._cache = label_sets

    def record(self, summaries: Sequence[RequestSummary], extra: Extra = ()) -> int:
        """Record a batch of requests (the same points as ``ServerMetrics.record`` for each, in order);
        returns how many met every SLO."""
        groups: dict[tuple, list[RequestSummary]] = {}
        for s in summaries:
            key = label_key(s)
            group = groups.get(key)
            if group is None:
                groups[key] = [s]
            else:
                group.append(s)
        return self.record_grouped(groups, extra)

    def record_grouped(self, groups: dict[tuple, list[RequestSummary]], extra: Extra = ()) -> int:
        """``record`` of requests already grouped by ``label_key`` (the caller computed it anyway)."""
        with self._lock:
            return self._record_grouped(groups, extra)

    def _record_grouped(self, groups: dict[tuple, list[RequestSummary]], extra: Extra) -> int:
        good = 0
        for key, group in groups.items():
            b = self._bound(key + (extra,), group[0], extra)
            for value_of, record in b.histograms:
                values = list(map(value_of, group))  # in C; filtered in Python only when some are None
                if None in values:
                    values = [v for v in values if v is not None]
                if values:
                    record(values)
            slo, n_good, breaches, itl = b.slo, 0, b.breaches, b.inter_token
            for s in group:
                if itl is not None and s.gaps is not None:
                    g = s.gaps
                    itl(g.counts, g.total, g.lo, g.hi)
                missed = slo.breaches(s)
                if missed:
                    if breaches is not None:
                        for objective in missed:
                            breaches.recorder(objective, s.slow_cause)(1)
                elif s.error_type is None:
                    n_good += 1
            if b.spec_tokens is not None:
                drafted = [s.spec_draft_tokens for s in group if s.spec_draft_tokens is not None]
                if drafted:
                    accepted = [s.spec_accepted_tokens for s in group if s.spec_accepted_tokens is not None]
                    b.spec_tokens[0](sum(d for d in drafted if d >= 0))
                    b.spec_tokens[1](sum(a for a in accepted if a >= 0))
            if b.chars is not None:
                # a negative count is ignored by a counter's add, so it must not lower the sum either
                chars = [s.output_characters for s in group
                         if s.output_characters is not None and s.output_characters >= 0]
                if chars:
                    b.chars(sum(chars))
            if key[_ROLE] in _HALVES:
                continue
            b.requests(len(group))
            if n_good:
                b.good(n_good)
            good += n_good
        return good

    def _bound(self, key: tuple, s: RequestSummary, extra: Extra) -> BoundSet:
        found = self._cache.get(key)
        if found is None:
            ins = self._instruments
            attrs = self._core.label_attributes(s, extra)
            held = True  # see __init__: called only under the backend's lock
            histograms = [(spec.value, hist.bind_many(attrs, held)) for spec, hist in ins.histograms]
            histograms += [(_INPUT_TOKENS, ins.tokens.bind_many({**attrs, sc.TOKEN_TYPE: "input"}, held)),
                           (_OUTPUT_TOKENS, ins.tokens.bind_many({**attrs, sc.TOKEN_TYPE: "output"}, held))]
            found = BoundSet(attrs, tuple(histograms),
                             ins.chars.bind(attrs, held) if ins.chars is not None else None,
                             ins.requests.bind(attrs, held), ins.good.bind(attrs, held),
                             self._slos.for_request(s.model, s.tenant),
                             _Breaches(ins.breaches, attrs) if ins.breaches is not None else None,
                             ins.inter_token[1].bind_counts(attrs, held) if ins.inter_token is not None else None,
                             (ins.spec_tokens.bind({**attrs, sc.SPEC_TOKEN_KIND: "drafted"}, held),
                              ins.spec_tokens.bind({**attrs, sc.SPEC_TOKEN_KIND: "accepted"}, held))
                             if ins.spec_tokens is not None else None)
            self._cache.put(key, found)  # bounded by the cache: label values come from clients
        return found


class _Breaches:
    """The breach counter for one label set: an ``add`` per (objective, cause), bound on first use."""

    __slots__ = ("_counter", "_attributes", "_bound")

    def __init__(self, counter: Any, attributes: dict) -> None:
        self._counter = counter
        self._attributes = attributes
        self._bound: dict[tuple[str, str | None], Callable[..., None]] = {}

    def recorder(self, objective: str, cause: str | None) -> Callable[..., None]:
        found = self._bound.get((objective, cause))
        if found is None:
            found = self._counter.bind(breach_attributes(self._attributes, objective, cause), True)  # under the lock
            if len(self._bound) < 64:
                self._bound[(objective, cause)] = found
        return found
