"""Server-side request metrics, declared as a table and recorded from a ``RequestSummary``.

The SDK records them for 100% of requests, whatever the sampling; the collector records
the same table from spans. Bucket boundaries are the GenAI semantic conventions' where
they define the metric. Exemplars: pass the request span's context and the SDK's
trace-based exemplar filter attaches its trace id.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable

from opentelemetry.context import Context
from opentelemetry.metrics import Meter

from .. import semconv as sc
from .diagnosis.causes import NAMES as CAUSE_NAMES
from .sdk_metrics import CountsRecorder, bind_counts, bind_value
from .buckets import (ACCEPTANCE_LENGTH_BUCKETS, ACCEPTANCE_RATE_BUCKETS, DURATION_BUCKETS, INTER_TOKEN_BUCKETS,
                      PHASE_BUCKETS, RATE_BUCKETS, TOKEN_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS)
from .lora import AdapterLabels
from .tenant import TenantLabels
from .slo import SLO, SLOTable
from .summary import ATTRIBUTE_OF_FIELD, RequestSummary



@dataclass(frozen=True)
class InstrumentSpec:
    """One instrument: its name, unit, description, kind and (histograms) bucket boundaries; ``attributes``
    are the attributes it is recorded with beyond the request labels (documented in the docs' metrics tables)."""

    name: str
    unit: str
    description: str
    buckets: tuple[float, ...] = ()
    kind: str = "histogram"  # histogram | counter | gauge | updowncounter (gauges and up-down: observable)
    attributes: tuple[str, ...] = ()


TOKEN_UNIT, CHARACTER_UNIT, REQUEST_UNIT, BREACH_UNIT = "{token}", "{character}", "{request}", "{breach}"


def create(meter: Meter, spec: InstrumentSpec) -> Any:
    """A synchronous instrument from its row (histogram or counter)."""
    if spec.kind == "histogram":
        return meter.create_histogram(spec.name, unit=spec.unit, description=spec.description,
                                      explicit_bucket_boundaries_advisory=list(spec.buckets))
    if spec.kind == "counter":
        return meter.create_counter(spec.name, unit=spec.unit, description=spec.description)
    raise ValueError(f"{spec.name}: a {spec.kind} is observable, built with its callback")


def _if_succeeded(field: str) -> Callable[[RequestSummary], float | None]:
    """The GenAI conventions define TTFT and TPOT for successful responses: none for a failed one."""
    get = attrgetter(field)
    return lambda s: None if s.error_type else get(s)


@dataclass(frozen=True)
class HistogramSpec:
    name: str
    unit: str
    buckets: tuple[float, ...]
    description: str
    value: Callable[[RequestSummary], float | None]
    field: str | None = None  # the RequestSummary field ``value`` reads, where it reads one as it is
    attributes: tuple[str, ...] = ()  # beyond the request labels (none: the table's columns line up)
    kind = "histogram"

    @property
    def attribute(self) -> str | None:
        """The request span's attribute that carries ``field`` (what the collector and the upstream
        connector read), or ``None`` for a value derived from several (the rates)."""
        return ATTRIBUTE_OF_FIELD.get(self.field) if self.field else None


def _server(name: str, unit: str, buckets: tuple[float, ...], description: str, field: str,
            successful_only: bool = False) -> HistogramSpec:
    """A server histogram of one ``RequestSummary`` field (or property)."""
    return HistogramSpec(name, unit, buckets, description,
                         _if_succeeded(field) if successful_only else attrgetter(field), field)


SERVER_HISTOGRAMS: tuple[HistogramSpec, ...] = (
    _server("gen_ai.server.time_to_first_token", "s", TTFT_BUCKETS,
            "Time from arrival to the first output token (queue + prefill), successful requests", "ttft",
            successful_only=True),
    _server("gen_ai.server.time_per_output_token", "s", TPOT_BUCKETS,
            "Mean time per output token after the first (decode time / (output tokens - 1)), "
            "successful requests", "tpot", successful_only=True),
    _server("gen_ai.server.request.duration", "s", DURATION_BUCKETS, "End-to-end request duration", "e2e"),
    _server("llm.server.queue.duration", "s", PHASE_BUCKETS,
            "Time waiting in the engine's queue before first scheduled", "queue"),
    _server("llm.server.prefill.duration", "s", PHASE_BUCKETS, "Time from first scheduled to the first token",
            "prefill"),
    _server("llm.server.decode.duration", "s", PHASE_BUCKETS, "Time from the first to the last token", "decode"),
    _server("llm.server.output.tokens_per_second", f"{TOKEN_UNIT}/s", RATE_BUCKETS,
            "Output tokens over end-to-end time, per request", "output_tokens_per_second"),
    _server("llm.server.output.characters_per_second", f"{CHARACTER_UNIT}/s", RATE_BUCKETS,
            "Output characters over end-to-end time, per request (tokenizer-independent)",
            "output_characters_per_second"),
    _server("llm.server.inter_token.max_gap", "s", PHASE_BUCKETS,
            "Per request, the longest gap between two engine steps that produced its tokens (a stall detector)",
            "max_gap"),
    _server("llm.server.spec_decode.acceptance_rate", "1", ACCEPTANCE_RATE_BUCKETS,
            "Per request with speculative decoding, accepted draft tokens over drafted ones", "spec_acceptance_rate"),
    _server("llm.server.spec_decode.acceptance_length", "{token}", ACCEPTANCE_LENGTH_BUCKETS,
            "Per request with speculative decoding, tokens per verify step (1 + accepted drafts / verify steps; "
            "the target model's own token included, as vLLM's mean acceptance length)", "spec_acceptance_length"),
    # SLO operations (core/diagnosis/engine_time.py): a histogram per request, whose _sum is the counter of
    # engine-seconds (and of seconds of delay caused) by model, adapter and tenant
    _server("llm.server.request.engine_time", "s", PHASE_BUCKETS,
            "Engine-step seconds charged to a request: each step's measured duration split across the requests it "
            "served by their share of its work (roofline cost where known, tokens otherwise); the sum over "
            "requests is the steps' time", "engine_time"),
    _server("llm.server.request.interference_caused", "s", PHASE_BUCKETS,
            "Seconds of prefill interference a request's prompt cost other requests: each victim's "
            "prefill_interference seconds in a step shared among the step's prefilling requests by their prefill "
            "tokens", "interference_caused"),
)
# One value per output token after the first, for every request: recorded as each request's bucket counts
# (core/inter_token.py, core/sdk_metrics.py), not through ``HistogramSpec.value``.
INTER_TOKEN_LATENCY = HistogramSpec(
    "llm.server.inter_token.latency", "s", INTER_TOKEN_BUCKETS,
    "Time between consecutive output tokens, every token of every request (a step that produced k tokens "
    "after a gap g counts k tokens of g/k)", attrgetter("gaps"))
# the server histograms by summary field, for code that names one (the dashboard's panels)
SERVER_HISTOGRAM = {spec.field: spec for spec in SERVER_HISTOGRAMS}
TOKEN_USAGE = "llm.server.token.usage"
OUTPUT_CHARACTERS = "llm.server.output.characters"
REQUESTS = "llm.server.requests"
GOOD_REQUESTS = "llm.server.requests.good"
SLO_BREACHES = "llm.server.slo.breaches"
SPEC_TOKENS = "llm.server.spec_decode.tokens"


@dataclass(frozen=True)
class UsageSpec:
    """A token instrument of its own (the latest GenAI conventions' usage counters): its row, the count it
    adds from a summary (``None``: nothing to add) and the attributes it adds to the request labels."""

    spec: InstrumentSpec
    value: Callable[[RequestSummary], int | None]
    attributes: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class MetricSet:
    """One side's metrics (server, client): the histogram table, token usage and the goodput counters."""

    histograms: tuple[HistogramSpec, ...]
    token_usage: str | None  # one histogram by gen_ai.token.type; None: ``usage`` counts tokens
    requests: str
    good_requests: str
    characters: str | None = None
    noun: str = "request"
    slo_breaches: str | None = None  # a counter of breaches by objective and slow cause
    inter_token: HistogramSpec | None = None  # per-token latencies, from RequestSummary.gaps' bucket counts
    spec_tokens: str | None = None  # a counter of speculative draft tokens, drafted and accepted
    usage: tuple[UsageSpec, ...] = ()  # token instruments of their own (each recorded when its value is known)

    @property
    def token_usage_spec(self) -> InstrumentSpec | None:
        return InstrumentSpec(self.token_usage, TOKEN_UNIT, f"Input and output tokens per {self.noun}",
                              TOKEN_BUCKETS, attributes=(sc.TOKEN_TYPE,)) if self.token_usage else None

    @property
    def requests_spec(self) -> InstrumentSpec:
        return InstrumentSpec(self.requests, REQUEST_UNIT, f"Finished {self.noun}s", kind="counter")

    @property
    def good_requests_spec(self) -> InstrumentSpec:
        return InstrumentSpec(self.good_requests, REQUEST_UNIT,
                              f"Finished {self.noun}s that met every SLO at once (goodput = good / all)",
                              kind="counter")

    @property
    def characters_spec(self) -> InstrumentSpec | None:
        return InstrumentSpec(self.characters, CHARACTER_UNIT, "Output characters (tokenizer-independent)",
                              kind="counter") if self.characters else None

    @property
    def slo_breaches_spec(self) -> InstrumentSpec | None:
        return InstrumentSpec(
            self.slo_breaches, BREACH_UNIT,
            f"SLO breaches, one per {self.noun} and objective missed, by objective "
            f"({sc.SLO_OBJECTIVE}) and slow cause ({sc.SLOW_CAUSE}; unknown where none was decided)",
            kind="counter", attributes=(sc.SLO_OBJECTIVE, sc.SLOW_CAUSE)) if self.slo_breaches else None

    @property
    def spec_tokens_spec(self) -> InstrumentSpec | None:
        return InstrumentSpec(
            self.spec_tokens, TOKEN_UNIT,
            f"Speculative draft tokens of finished {self.noun}s by {sc.SPEC_TOKEN_KIND}: drafted (verified by the "
            "target model) and accepted", kind="counter", attributes=(sc.SPEC_TOKEN_KIND,)) if self.spec_tokens else None

    def instruments(self) -> tuple[InstrumentSpec, ...]:
        """Every instrument of the set but the histograms, in the docs table's order."""
        specs = (self.token_usage_spec, *(u.spec for u in self.usage), self.characters_spec, self.requests_spec,
                 self.good_requests_spec, self.slo_breaches_spec, self.spec_tokens_spec)
        return tuple(spec for spec in specs if spec is not None)


SERVER_METRICS = MetricSet(SERVER_HISTOGRAMS, TOKEN_USAGE, REQUESTS, GOOD_REQUESTS, OUTPUT_CHARACTERS,
                           slo_breaches=SLO_BREACHES, inter_token=INTER_TOKEN_LATENCY, spec_tokens=SPEC_TOKENS)


@dataclass(frozen=True)
class Instruments:
    """A metric set's instruments as created on one meter (public, so a recorder other than ``record`` can
    bind them: the collector records lists of requests into its own aggregation backend)."""

    histograms: tuple[tuple[HistogramSpec, Any], ...]
    tokens: Any | None  # token usage, by ``gen_ai.token.type`` (input, output); None: the set counts by ``usage``
    chars: Any | None
    requests: Any
    good: Any
    breaches: Any | None
    inter_token: tuple[Any, Any] | None = None  # (its spec, the histogram): a request's gap counts, added whole
    spec_tokens: Any | None = None  # speculative draft tokens, by llm.spec_decode.token.kind (drafted, accepted)
    usage: tuple[tuple[UsageSpec, Any], ...] = ()  # the set's own token instruments


class RequestMetrics:
    """A metric set's instruments, built once per meter; ``record`` is called once per finished request."""

    def __init__(self, meter: Meter, slos: SLOTable, metric_set: MetricSet,
                 extra_attributes: dict[str, Any] | None = None) -> None:
        self._slos = slos
        self._extra = dict(extra_attributes or {})
        self._histograms = [
            (spec, meter.create_histogram(spec.name, unit=spec.unit, description=spec.description,
                                          explicit_bucket_boundaries_advisory=list(spec.buckets)))
            for spec in metric_set.histograms
        ]
        tokens = metric_set.token_usage_spec
        self._tokens = create(meter, tokens) if tokens is not None else None
        self._usage = tuple((u, create(meter, u.spec)) for u in metric_set.usage)
        chars, breaches = metric_set.characters_spec, metric_set.slo_breaches_spec
        self._chars = create(meter, chars) if chars is not None else None
        self._requests = create(meter, metric_set.requests_spec)
        self._good = create(meter, metric_set.good_requests_spec)
        self._breaches = create(meter, breaches) if breaches is not None else None
        itl = metric_set.inter_token
        self._itl = (itl, meter.create_histogram(itl.name, unit=itl.unit, description=itl.description,
                                                 explicit_bucket_boundaries_advisory=list(itl.buckets))
                     ) if itl is not None else None
        spec_tokens = metric_set.spec_tokens_spec
        self._spec_tokens = create(meter, spec_tokens) if spec_tokens is not None else None
        self.instruments = Instruments(tuple(self._histograms), self._tokens, self._chars, self._requests, self._good,
                                       self._breaches, self._itl, self._spec_tokens, self._usage)
        self._attr_cache = FirstN(4096)  # a process's label sets are few; a flood of new ones is not remembered
        self.adapters = AdapterLabels()  # the LoRA adapter label: bounded (adapter names come from users)
        self.tenants = TenantLabels()  # the tenant label: bounded the same way (tenants come from requests)
        self.tenants.reserve(t for _, t, _ in slos.scopes() if t is not None)  # the SLO table's tenants first

    def breaches(self, s: RequestSummary) -> tuple[str, ...]:
        return self._slos.for_request(s.model, s.tenant).breaches(s)

    def record(self, s: RequestSummary, context: Context | None = None,
               extra: tuple[tuple[str, Any], ...] = ()) -> bool:
        """Record one request; returns whether it met every SLO (and did not fail)."""
        if s.lora is not None:
            extra = extra + ((sc.LORA_NAME, self.adapters.label(s.lora)),)
        if s.tenant is not None:
            extra = extra + ((sc.REQUEST_TENANT, self.tenants.label(s.tenant)),)
        b = self._bound(s, extra)
        for value_of, record in b.histograms:
            value = value_of(s)
            if value is not None:
                record(value, context)
        if s.input_tokens is not None and b.input_tokens is not None:
            b.input_tokens(s.input_tokens, context)
        if s.output_tokens is not None and b.output_tokens is not None:
            b.output_tokens(s.output_tokens, context)
        for count_of, add in b.usage:
            count = count_of(s)
            if count is not None:
                add(count, context)
        if b.chars is not None and s.output_characters is not None:
            b.chars(s.output_characters, context)
        if s.gaps is not None and b.inter_token is not None:
            g = s.gaps
            b.inter_token(g.counts, g.total, g.lo, g.hi)
        if s.spec_draft_tokens is not None and b.spec_drafted is not None:
            b.spec_drafted(s.spec_draft_tokens, context)
            if s.spec_accepted_tokens is not None:
                b.spec_accepted(s.spec_accepted_tokens, context)
        missed = b.slo.breaches(s)
        good = not s.failed and not missed
        if s.disagg_role != sc.DISAGG_ROLE_PREFILL:  # a prefill half is not a user request (its decode half is)
            b.requests(1, context)
            if good:
                b.good(1, context)
        if missed and b.breaches is not None:
            for objective in missed:
                b.breaches.recorder(objective, s.slow_cause)(1, context)
        return good

    def label_attributes(self, s: RequestSummary, extra: tuple[tuple[str, Any], ...] = ()) -> dict[str, Any]:
        """The label set of a request's metrics (token usage adds ``gen_ai.token.type``)."""
        attrs = dict(self._extra)
        attrs[sc.OPERATION_NAME] = s.operation
        if s.provider:
            attrs[sc.PROVIDER_NAME] = s.provider
        if s.model:
            attrs[sc.REQUEST_MODEL] = s.model
        if s.error_type:
            attrs[sc.ERROR_TYPE] = s.error_type
        if s.lora is not None:  # (the SDK's record passes its bounded label in ``extra``, which wins)
            attrs[sc.LORA_NAME] = s.lora
        if s.tenant is not None:  # (the same: the SDK's bounded label wins; the collector's series budgets bound it)
            attrs[sc.REQUEST_TENANT] = s.tenant
        role = DISAGG_ROLES.get(s.disagg_role) if s.disagg_role is not None else None
        if role is not None:  # disaggregated serving: which half (or the joined user request); others unlabelled
            attrs[sc.DISAGG_ROLE] = role
        attrs.update(extra)
        return attrs

    def _bound(self, s: RequestSummary, extra: tuple[tuple[str, Any], ...]) -> "_Bound":
        key = (s.model, s.operation, s.provider, s.error_type, s.disagg_role, extra)
        found = self._attr_cache.get(key)
        if found is None:
            attrs = self.label_attributes(s, extra)
            input_attrs, output_attrs = {**attrs, sc.TOKEN_TYPE: "input"}, {**attrs, sc.TOKEN_TYPE: "output"}
            found = _Bound(
                tuple((spec.value, _bind(hist, attrs)) for spec, hist in self._histograms),
                *((_bind(self._tokens, input_attrs), _bind(self._tokens, output_attrs))
                  if self._tokens is not None else (None, None)),
                _bind(self._chars, attrs) if self._chars is not None else None,
                _bind(self._requests, attrs), _bind(self._good, attrs),
                self._slos.for_request(s.model, dict(extra).get(sc.REQUEST_TENANT, s.tenant)),
                _Breaches(self._breaches, attrs) if self._breaches is not None else None,
                bind_counts(self._itl[1], attrs, self._itl[0].buckets) if self._itl is not None else None,
                *((_bind(self._spec_tokens, {**attrs, sc.SPEC_TOKEN_KIND: "drafted"}),
                   _bind(self._spec_tokens, {**attrs, sc.SPEC_TOKEN_KIND: "accepted"}))
                  if self._spec_tokens is not None else (None, None)),
                tuple((u.value, _bind(inst, {**attrs, **dict(u.attributes)})) for u, inst in self._usage))
            self._attr_cache.put(key, found)  # bounded: model names come from users
        return found


# llm.disagg.role label values: an instance's half, or the user request the collector joined from both (a span
# may carry any string: only these become label values)
DISAGG_ROLES = {r: r for r in (sc.DISAGG_ROLE_PREFILL, sc.DISAGG_ROLE_DECODE, sc.DISAGG_ROLE_BOTH, "user")}


class FirstN:
    """The first ``n`` label sets seen, kept for good (the SDK's case: a process's label sets are few)."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._d: dict[tuple, Any] = {}
        self.get = self._d.get

    def put(self, key: tuple, bound: Any) -> None:
        if len(self._d) < self._n:
            self._d[key] = bound

    def __len__(self) -> int:
        return len(self._d)


Recorder = Callable[[float, "Context | None"], None]


@dataclass(frozen=True, slots=True)
class _Bound:
    """One label set's instruments, bound once: a request then costs one cache lookup, not one per metric."""

    histograms: tuple[tuple[Callable[[RequestSummary], float | None], Recorder], ...]
    input_tokens: Recorder | None  # the token-usage histogram's two label sets (None: the set has none)
    output_tokens: Recorder | None
    chars: Recorder | None
    requests: Recorder
    good: Recorder
    slo: SLO  # the model's (and tenant's) objectives (both are part of the label set)
    breaches: "_Breaches | None"
    inter_token: CountsRecorder | None  # adds one request's inter-token bucket counts
    spec_drafted: Recorder | None  # speculative draft tokens (kind drafted / accepted)
    spec_accepted: Recorder | None
    usage: tuple[tuple[Callable[[RequestSummary], int | None], Recorder], ...] = ()  # the set's own token counts


class _Breaches:
    """The breach counter for one label set: a recorder per (objective, cause), bound on first use."""

    __slots__ = ("_counter", "_attributes", "_bound")

    def __init__(self, counter: Any, attributes: dict) -> None:
        self._counter = counter
        self._attributes = attributes
        self._bound: dict[tuple[str, str | None], Recorder] = {}

    def recorder(self, objective: str, cause: str | None) -> Recorder:
        found = self._bound.get((objective, cause))
        if found is None:
            found = _bind(self._counter, breach_attributes(self._attributes, objective, cause))
            if len(self._bound) < 64:
                self._bound[(objective, cause)] = found
        return found


_CAUSES = frozenset(CAUSE_NAMES)  # the declared causes (diagnosis/causes.py)


def breach_attributes(attributes: dict, objective: str, cause: str | None) -> dict:
    """A breach counter's label set: the request's, the objective missed and the slow cause. The cause may
    come from a span (the collector): only the declared causes become label values, others ``unknown``."""
    return {**attributes, sc.SLO_OBJECTIVE: objective, sc.SLOW_CAUSE: cause if cause in _CAUSES else sc.SLOW_UNKNOWN}


def _bind(instrument: Any, attributes: dict) -> Recorder:
    """A recorder for one label set: ``sdk_metrics.bind_value`` (the SDK's own aggregations without its per-call
    machinery; a closure over ``record`` / ``add`` for any other instrument)."""
    return bind_value(instrument, attributes)


# Recorded by the collector, which sees a client's call and the server's request in one trace.
CLIENT_OVERHEAD = InstrumentSpec(sc.CLIENT_OVERHEAD_TTFC, "s",
                                 "Client time to first chunk minus the engine's time to first token, same trace",
                                 TTFT_BUCKETS, attributes=(sc.REQUEST_MODEL, sc.SERVICE_NAME))


class ServerMetrics(RequestMetrics):
    def __init__(self, meter: Meter, slos: SLOTable, extra_attributes: dict[str, Any] | None = None) -> None:
        super().__init__(meter, slos, SERVER_METRICS, extra_attributes)


# -- engine steps and the GPU (core/diagnosis): one row per instrument -----------------------------

UTILIZATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
STEP_TIME_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64,
                     1.28, 2.56, 5.12, 10.24)


# the step-scoped metrics' adapter label: one value per step (core/lora.py says why)
_STEP_ADAPTER = (f"; {sc.LORA_NAME}: the LoRA adapter the step ran ({sc.LORA_MULTIPLE}: several, none: the base "
                 "model only; bounded as the request metrics' label)")
STEP_DURATION = InstrumentSpec(
    "llm.server.engine.step.duration", "s",
    "Engine-step time by part (llm.engine.step.part: schedule, execute, model, output, total; idle: the gap "
    "before the step) and step phase (prefill, decode, mixed)" + _STEP_ADAPTER, STEP_TIME_BUCKETS,
    attributes=(sc.STEP_PHASE, sc.STEP_PART, sc.LORA_NAME))
STEP_MFU = InstrumentSpec("llm.server.engine.step.mfu", "1",
                          "Model FLOPs utilization per engine step (estimated FLOPs / measured time / peak)"
                          + _STEP_ADAPTER, UTILIZATION_BUCKETS, attributes=(sc.STEP_PHASE, sc.STEP_BOUND, sc.LORA_NAME))
STEP_MBU = InstrumentSpec("llm.server.engine.step.mbu", "1",
                          "Memory bandwidth utilization per engine step (estimated bytes / measured time / peak)"
                          + _STEP_ADAPTER, UTILIZATION_BUCKETS, attributes=(sc.STEP_PHASE, sc.STEP_BOUND, sc.LORA_NAME))
STEPS = InstrumentSpec("llm.server.engine.steps", "{step}",
                       "Engine steps by phase and roofline bound (compute, memory; unknown without device peaks)"
                       + _STEP_ADAPTER, kind="counter", attributes=(sc.STEP_PHASE, sc.STEP_BOUND, sc.LORA_NAME))
SPEC_POSITION_TOKENS = InstrumentSpec(
    "llm.server.spec_decode.position.tokens", "{token}",
    f"Speculative draft tokens by draft position ({sc.SPEC_POSITION}, 0-based) and {sc.SPEC_TOKEN_KIND} (drafted, "
    "accepted), over every engine step: accepted / drafted at a position is its acceptance rate (vLLM's "
    "num_accepted_tokens_per_pos over num_draft_tokens_per_pos); no adapter label (acceptance by adapter: the "
    "request metrics')", kind="counter",
    attributes=(sc.SPEC_POSITION, sc.SPEC_TOKEN_KIND))
LORA_LOAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LORA_LOAD_DURATION = InstrumentSpec(
    "llm.server.lora.load.duration", "s",
    f"LoRA adapter loads into the model runner's adapter cache, by adapter ({sc.LORA_NAME}, bounded as the request "
    "metrics' label): its count is the loads, each value a load's time where it ran (read, cache insert, slot "
    "copy)", LORA_LOAD_BUCKETS, attributes=(sc.LORA_NAME,))
LORA_EVICTIONS = InstrumentSpec(
    "llm.server.lora.evictions", "{adapter}",
    f"LoRA adapters dropped from the model runner's adapter cache (least recently used, or removed), by {sc.LORA_NAME}",
    kind="counter", attributes=(sc.LORA_NAME,))
LORA_STEPS = InstrumentSpec(
    "llm.server.lora.steps", "{step}",
    f"Engine steps each LoRA adapter was active in, by {sc.LORA_NAME}: one point per adapter of the step, so a step "
    "that ran two adapters counts once for each (the sum over adapters is adapter-steps, not steps)",
    kind="counter", attributes=(sc.LORA_NAME,))
STEP_METRICS: tuple[InstrumentSpec, ...] = (STEP_DURATION, STEPS, STEP_MFU, STEP_MBU, SPEC_POSITION_TOKENS,
                                            LORA_LOAD_DURATION, LORA_EVICTIONS, LORA_STEPS)
# OpenTelemetry hardware semantic conventions (hw.gpu.*, hw.power); SM clock and throttling have none: ours
_HW = (sc.HW_ID, sc.HW_NAME, sc.HW_TYPE, sc.HW_VENDOR)
GPU_UTILIZATION = InstrumentSpec("hw.gpu.utilization", "1",
                                 "Fraction of time the GPU was busy over NVML's sample period",
                                 kind="gauge", attributes=_HW)
GPU_MEMORY_UTILIZATION = InstrumentSpec("hw.gpu.memory.utilization", "1",
                                        "Fraction of time GPU memory was read or written",
                                        kind="gauge", attributes=_HW)
GPU_MEMORY_USAGE = InstrumentSpec("hw.gpu.memory.usage", "By", "GPU memory used", kind="updowncounter", attributes=_HW)
GPU_MEMORY_LIMIT = InstrumentSpec("hw.gpu.memory.limit", "By", "GPU memory size", kind="updowncounter", attributes=_HW)
GPU_POWER = InstrumentSpec("hw.power", "W", "Power drawn by the GPU (hw.type=gpu)", kind="gauge", attributes=_HW)
GPU_SM_CLOCK = InstrumentSpec("llm.gpu.clock.sm", "MHz", "SM clock of the GPU", kind="gauge", attributes=_HW)
GPU_THROTTLED = InstrumentSpec("llm.gpu.throttled", "1", "1 for each clock throttle reason active at the last sample",
                               kind="gauge", attributes=(*_HW, sc.GPU_THROTTLE_REASON))
GPU_METRICS: tuple[InstrumentSpec, ...] = (GPU_UTILIZATION, GPU_MEMORY_UTILIZATION, GPU_MEMORY_USAGE, GPU_MEMORY_LIMIT,
                                           GPU_POWER, GPU_SM_CLOCK, GPU_THROTTLED)
