"""otel-llm's own health as metrics, beside the ones it derives: what it kept, sent and dropped, its errors.

"A dead exporter costs nothing but dropped telemetry, counted" needs the count somewhere an
operator looks. Observable counters cost nothing until the meter provider collects them;
``otel_llm.stats()`` returns the same numbers as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from .. import semconv as sc
from ..guard import Guard
from .metrics import InstrumentSpec

STATE, SITE, ENGINE = "otel_llm.state", "otel_llm.site", sc.ENGINE
REQUESTS = InstrumentSpec("otel_llm.requests", "{request}",
                          "Requests seen by otel-llm, by what happened to their telemetry",
                          kind="counter", attributes=(ENGINE, STATE))
ENGINE_STEPS = InstrumentSpec("otel_llm.engine_steps", "{step}",
                              "Engine steps recorded, emitted as spans, or settled early",
                              kind="counter", attributes=(ENGINE, STATE))
SPANS_SENT = InstrumentSpec("otel_llm.spans.sent_direct", "{span}",
                            "Spans otel-llm wrote as OTLP and sent with the provider's exporters",
                            kind="counter", attributes=(ENGINE,))
SPANS_DROPPED = InstrumentSpec("otel_llm.spans.dropped_direct", "{span}",
                               "Directly exported spans dropped (buffer full or export failed)",
                               kind="counter", attributes=(ENGINE,))
ERRORS = InstrumentSpec("otel_llm.errors", "{error}", "Instrumentation errors caught (the host's work went on)",
                        kind="counter", attributes=(SITE,))
AGENT_LOST = InstrumentSpec("otel_llm.agent.lost", "{record}",
                            "Records an agent process did not get or could not join, by state: engine_steps_dropped, "
                            "engine_requests_dropped (the engine's sink could not deliver them), orphans (finishes "
                            "whose start never arrived: in the request metrics, without their steps)",
                            kind="counter", attributes=(ENGINE, STATE))
SELF_METRICS: tuple[InstrumentSpec, ...] = (REQUESTS, ENGINE_STEPS, SPANS_SENT, SPANS_DROPPED, ERRORS, AGENT_LOST)


def register(meter: Meter, engine: str, stats: Callable[[], dict[str, Any]], guard: Guard) -> None:
    """Observable counters over ``stats()`` (Pipeline.stats) and ``guard``'s errors (the pipeline owner's: each
    instrumentor's meter reports its own, so the counters of all of them add up to ``otel_llm.stats()``)."""

    def by_state(prefix: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for key, value in stats().items():
                if key.startswith(prefix):
                    yield Observation(value, {ENGINE: engine, STATE: key[len(prefix):]})
        return observe

    def one(key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            value = stats().get(key)
            if value is not None:
                yield Observation(value, {ENGINE: engine})
        return observe

    for spec, callback in ((REQUESTS, by_state("requests_")), (ENGINE_STEPS, by_state("steps_")),
                           (SPANS_SENT, one("direct_spans_sent")), (SPANS_DROPPED, one("direct_spans_dropped"))):
        meter.create_observable_counter(spec.name, [callback], unit=spec.unit, description=spec.description)
    register_errors(meter, guard)


def register_agent(meter: Meter, engine: str, lost: Callable[[], dict[str, int]]) -> None:
    """The ``otel_llm.agent.lost`` counter over an agent's ``lost()`` (state -> count), in the agent process."""

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        for state, value in lost().items():
            yield Observation(value, {ENGINE: engine, STATE: state})

    meter.create_observable_counter(AGENT_LOST.name, [observe], unit=AGENT_LOST.unit,
                                    description=AGENT_LOST.description)


def register_errors(meter: Meter, guard: Guard) -> None:
    """The ``otel_llm.errors`` counter over ``guard``'s errors, by site (an instrumentor without a pipeline,
    the openai client's, registers this alone)."""

    def errors(options: CallbackOptions) -> Iterable[Observation]:
        for site, n in list(guard.errors.items()):
            yield Observation(n, {SITE: site})

    meter.create_observable_counter(ERRORS.name, [errors], unit=ERRORS.unit, description=ERRORS.description)


# -- the collector's (otel-llm-collector's) own telemetry -------------------------------------------
# Declared here, not in the collector, because the dashboard (otel_llm.views) queries it and the views
# must not import the collector; the collector builds its Prometheus instruments from this table.
# Names follow the upstream tail_sampling processor's self-metrics where the concept is the same
# (``sampling_traces_on_memory``, ``count_traces_sampled``, late spans, evictions).

GATEWAY_PREFIX = "otelcol_llm_"


@dataclass(frozen=True)
class GatewayMetric:
    name: str  # exposed as GATEWAY_PREFIX + name (+ "_total" for a counter)
    kind: Literal["counter", "gauge"]
    labels: tuple[str, ...]
    doc: str


GATEWAY_METRICS: tuple[GatewayMetric, ...] = (
    GatewayMetric("receiver_accepted_spans", "counter", ("transport",), "Spans accepted by a receiver"),
    GatewayMetric("receiver_refused_spans", "counter", ("transport", "reason"),
                  "Spans refused (invalid_trace_id, invalid_span_id, invalid_parent_span_id, non_finite_latency)"),
    GatewayMetric("receiver_bad_requests", "counter", ("transport", "reason"),
                  "Requests or connections refused or cut (malformed, too large, gzip bomb, busy, "
                  "too_many_connections, headers_too_large, header_timeout, read_timeout, disconnected, "
                  "unauthenticated, peer_share, unauthenticated_pool, json_budget, storage_full; evicted_idle, "
                  "evicted_slow: a slot taken for another peer under contention, ...)"),
    GatewayMetric("llm_metrics_requests", "counter", ("source",),
                  "Request spans the llm_metrics processor derived metrics from"),
    GatewayMetric("llm_metrics_labels_truncated", "counter", ("label",),
                  "Label values cut to max_label_length (service, model, operation, provider, error_type)"),
    GatewayMetric("llm_metrics_overflow_requests", "counter", ("budget", "tenant"),
                  "Requests recorded in an overflow series (label set not admitted), by the budget that refused it "
                  "(total, service, tenant, source) and the sender's tenant (empty without auth)"),
    GatewayMetric("llm_metrics_values_refused", "counter", ("reason",),
                  "Values not recorded (sum_overflow: the histogram's sum would become +Inf; bad_counts: bucket counts "
                  "that do not fit the histogram)"),
    GatewayMetric("ttft_join_joined", "counter", (),
                  "Client calls joined with their server request (TTFT overhead recorded)"),
    GatewayMetric("ttft_join_forgotten", "counter", (),
                  "Unjoined halves forgotten to stay under the join table's bound"),
    GatewayMetric("trace_join_joined", "counter", (),
                  "Server request traces without a caller moved into their client call's trace (by response id)"),
    GatewayMetric("trace_join_alone", "counter", ("side",),
                  "Halves whose partner did not come in time, gone on alone (server: a request trace; client: a call)"),
    GatewayMetric("trace_join_forgotten", "counter", (),
                  "Halves that went on alone early to stay under the join table's bound"),
    GatewayMetric("disagg_join_joined", "counter", (),
                  "Disaggregated user requests joined from their prefill and decode halves (recorded once, "
                  "llm.disagg.role=user)"),
    GatewayMetric("disagg_join_forgotten", "counter", (),
                  "Halves whose partner did not come in time (a decode half is then the user request alone)"),
    GatewayMetric("disagg_user_breaches", "counter", ("objective", "side", "cause"),
                  "Joined user requests that breached an objective, by the half (prefill, decode, unknown) and cause "
                  "the breach is charged to"),
    GatewayMetric("count_traces_sampled", "counter", ("policy", "decision"),
                  "Traces decided, by deciding policy and verdict"),
    GatewayMetric("sampling_late_spans", "counter", ("decision",), "Spans that arrived after their trace was decided"),
    GatewayMetric("sampling_evictions", "counter", ("reason",),
                  "Traces decided early to stay under num_traces / max_buffer_bytes"),
    GatewayMetric("sampling_policy_errors", "counter", ("policy",),
                  "Policy evaluations that raised (counted as no vote)"),
    GatewayMetric("sampling_traces_on_memory", "gauge", (), "Traces buffered, waiting for a decision"),
    GatewayMetric("sampling_bytes_on_memory", "gauge", (), "Encoded bytes of the buffered spans"),
    GatewayMetric("exporter_sent_spans", "counter", ("exporter",), "Spans an exporter delivered"),
    GatewayMetric("exporter_send_failures", "counter", ("exporter",), "Failed export attempts (each retry counts)"),
    GatewayMetric("exporter_dropped_spans", "counter", ("exporter", "reason"),
                  "Spans an exporter gave up on (queue_full, disk_full, retries_exhausted, permanent_error, rejected: "
                  "the backend's partial_success, shutdown: not delivered within service.shutdown_timeout)"),
    GatewayMetric("exporter_queue_size", "gauge", ("exporter",), "Batches waiting in an exporter's queue"),
    GatewayMetric("storage_records", "counter", ("storage", "outcome"),
                  "Records of a durable log (tail_sampling: the undecided batches; exporter/<name>: a sending queue) "
                  "by outcome: written, replayed at start (each a possible duplicate), torn (a crash mid-write: "
                  "skipped), corrupt, full (refused: the disk budget is spent)"),
    GatewayMetric("storage_bytes", "gauge", ("storage",), "Bytes of a durable log's segments on disk"),
)




def gateway_metric(name: str) -> str:
    """The Prometheus name the collector exposes ``name`` under (a KeyError: not in the table)."""
    spec = _GATEWAY_BY_NAME[name]
    return GATEWAY_PREFIX + spec.name + ("_total" if spec.kind == "counter" else "")


_GATEWAY_BY_NAME = {g.name: g for g in GATEWAY_METRICS}
