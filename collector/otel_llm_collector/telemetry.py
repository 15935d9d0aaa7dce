"""The collector's own telemetry, declared as a table, on the Prometheus endpoint next to the derived metrics.

Names follow the upstream tail_sampling processor's self-metrics where the concept is the
same (``sampling_traces_on_memory``, ``count_traces_sampled``, late spans, evictions).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

PREFIX = "otelcol_llm_"


@dataclass(frozen=True)
class Spec:
    name: str
    kind: type
    labels: tuple[str, ...]
    doc: str


SPECS: tuple[Spec, ...] = (
    Spec("receiver_accepted_spans", Counter, ("transport",), "Spans accepted by a receiver"),
    Spec("receiver_refused_spans", Counter, ("transport", "reason"),
         "Spans refused (invalid_trace_id, invalid_span_id, invalid_parent_span_id)"),
    Spec("receiver_bad_requests", Counter, ("transport", "reason"),
         "Requests or connections refused or cut (malformed, too large, gzip bomb, busy, too_many_connections, "
         "headers_too_large, header_timeout, read_timeout, disconnected, unauthenticated, ...)"),
    Spec("llm_metrics_requests", Counter, ("source",), "Request spans the llm_metrics processor derived metrics from"),
    Spec("llm_metrics_labels_truncated", Counter, ("label",),
         "Label values cut to max_label_length (service, model, operation, provider, error_type)"),
    Spec("llm_metrics_overflow_requests", Counter, (),
         "Requests recorded in their service's overflow series (label set not admitted: max_series[_per_service])"),
    Spec("llm_metrics_values_refused", Counter, ("reason",),
         "Values not recorded (sum_overflow: the histogram's sum would become +Inf)"),
    Spec("ttft_join_joined", Counter, (), "Client calls joined with their server request (TTFT overhead recorded)"),
    Spec("ttft_join_forgotten", Counter, (), "Unjoined halves forgotten to stay under the join table's bound"),
    Spec("count_traces_sampled", Counter, ("policy", "decision"), "Traces decided, by deciding policy and verdict"),
    Spec("sampling_late_spans", Counter, ("decision",), "Spans that arrived after their trace was decided"),
    Spec("sampling_evictions", Counter, ("reason",), "Traces decided early to stay under num_traces / max_buffer_bytes"),
    Spec("sampling_policy_errors", Counter, ("policy",), "Policy evaluations that raised (counted as no vote)"),
    Spec("sampling_traces_on_memory", Gauge, (), "Traces buffered, waiting for a decision"),
    Spec("sampling_bytes_on_memory", Gauge, (), "Encoded bytes of the buffered spans"),
    Spec("exporter_sent_spans", Counter, ("exporter",), "Spans an exporter delivered"),
    Spec("exporter_send_failures", Counter, ("exporter",), "Failed export attempts (each retry counts)"),
    Spec("exporter_dropped_spans", Counter, ("exporter", "reason"),
         "Spans an exporter gave up on (queue_full, retries_exhausted, permanent_error, rejected: the "
         "backend's partial_success, shutdown: not delivered within service.shutdown_timeout)"),
    Spec("exporter_queue_size", Gauge, ("exporter",), "Batches waiting in an exporter's queue"),
)


class SelfTelemetry:
    """One registry per collector instance (several gateways can live in one test process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._m = {s.name: s.kind(PREFIX + s.name, s.doc, s.labels, registry=self.registry) for s in SPECS}
        self._children: dict[tuple, object] = {}

    def metric(self, name: str):
        return self._m[name]

    def _child(self, name: str, labels: dict[str, str]):
        # prometheus_client's labels() costs a few microseconds a call: remember the children
        key = (name, *labels.items())
        child = self._children.get(key)
        if child is None:
            child = self._m[name].labels(**labels)
            if len(self._children) < 10_000:  # label values are from small sets; bound it anyway
                self._children[key] = child
        return child

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        (self._child(name, labels) if labels else self._m[name]).inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        (self._child(name, labels) if labels else self._m[name]).set(value)

    def value(self, name: str, **labels: str) -> float:
        """Current value (0 when never touched), for tests and the benchmark."""
        suffix = "_total" if self._m[name].__class__ is Counter else ""
        v = self.registry.get_sample_value(PREFIX + name + suffix, labels or None)
        return v or 0.0

    def total(self, name: str) -> float:
        """Sum over all label sets."""
        suffix = "_total" if self._m[name].__class__ is Counter else ""
        out = 0.0
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name == PREFIX + name + suffix:
                    out += s.value
        return out
