"""The collector's own telemetry: the upstream Collector's names where the concept is the same, ours beside them.

Two tables:

* the upstream Collector's self-metrics (``otelcol_receiver_accepted_spans{receiver,transport}``,
  ``otelcol_exporter_sent_spans{exporter}``, ``otelcol_exporter_queue_size{exporter,data_type}``,
  ``otelcol_processor_tail_sampling_*``, ...), with the labels the upstream components give them and the
  ``_total`` suffix its Prometheus exposition gives counters, so dashboards and alerts written for the
  upstream Collector read the gateway unchanged (``UPSTREAM_SPECS``);
* ours, ``otelcol_llm_*``, for what upstream has no name for (refusals by reason, label budgets, joins,
  evictions, export attempts). The table (names, kinds, labels, help) is the core's
  ``otel_llm.core.self_metrics.GATEWAY_METRICS``, where the dashboard reads it too.

An ``otelcol_llm_*`` series whose information the upstream name now carries is *renamed* (``RENAMED``): it
is still written, with "Deprecated" in its help, until ``RENAMED_REMOVED_IN``; the changelog says so.
``GatewayMetrics.inc``/``set`` take our short names as before and write the upstream series as well
(``_mirror``), so no call site needs to know both vocabularies.

``service.telemetry.metrics.level`` (upstream's levels): ``none`` exposes nothing of ours, ``basic`` the
upstream-named series only, ``normal`` (default) and ``detailed`` both tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from otel_llm.core.self_metrics import GATEWAY_METRICS, GATEWAY_PREFIX

PREFIX = GATEWAY_PREFIX
RECEIVER = "otlp"  # the gateway's one receiver, as upstream's ``receiver`` label names it
TRACES = "traces"  # upstream's ``data_type`` label on queue metrics
LEVELS = ("none", "basic", "normal", "detailed")
RENAMED_REMOVED_IN = "0.3.0"  # the release that stops writing the renamed otelcol_llm_* series


@dataclass(frozen=True)
class Spec:
    name: str
    kind: type
    labels: tuple[str, ...]
    doc: str


def _u(name: str, kind: type, labels: tuple[str, ...], doc: str) -> Spec:
    return Spec(name, kind, labels, doc)


_RX, _EX, _TS = ("receiver", "transport"), ("exporter",), "otelcol_processor_tail_sampling_"
UPSTREAM_SPECS: tuple[Spec, ...] = (
    _u("otelcol_receiver_accepted_spans", Counter, _RX, "Number of spans successfully pushed into the pipeline."),
    _u("otelcol_receiver_refused_spans", Counter, _RX, "Number of spans that could not be pushed into the pipeline."),
    _u("otelcol_receiver_accepted_metric_points", Counter, _RX,
       "Number of metric points successfully pushed into the pipeline."),
    _u("otelcol_receiver_refused_metric_points", Counter, _RX,
       "Number of metric points that could not be pushed into the pipeline."),
    _u("otelcol_receiver_accepted_log_records", Counter, _RX,
       "Number of log records successfully pushed into the pipeline."),
    _u("otelcol_receiver_refused_log_records", Counter, _RX,
       "Number of log records that could not be pushed into the pipeline."),
    _u("otelcol_exporter_sent_spans", Counter, _EX, "Number of spans successfully sent to destination."),
    _u("otelcol_exporter_send_failed_spans", Counter, _EX, "Number of spans in failed attempts to send to destination."),
    _u("otelcol_exporter_enqueue_failed_spans", Counter, _EX, "Number of spans failed to be added to the sending queue."),
    _u("otelcol_exporter_sent_metric_points", Counter, _EX, "Number of metric points successfully sent to destination."),
    _u("otelcol_exporter_send_failed_metric_points", Counter, _EX,
       "Number of metric points in failed attempts to send to destination."),
    _u("otelcol_exporter_enqueue_failed_metric_points", Counter, _EX,
       "Number of metric points failed to be added to the sending queue."),
    _u("otelcol_exporter_sent_log_records", Counter, _EX, "Number of log records successfully sent to destination."),
    _u("otelcol_exporter_send_failed_log_records", Counter, _EX,
       "Number of log records in failed attempts to send to destination."),
    _u("otelcol_exporter_enqueue_failed_log_records", Counter, _EX,
       "Number of log records failed to be added to the sending queue."),
    _u("otelcol_exporter_queue_size", Gauge, ("exporter", "data_type"), "Current size of the retry queue (in batches)"),
    _u("otelcol_exporter_queue_capacity", Gauge, ("exporter", "data_type"),
       "Fixed capacity of the retry queue (in batches)"),
    _u(_TS + "count_traces_sampled", Counter, ("policy", "sampled", "decision"),
       "Count of traces that were sampled or not per sampling policy (the gateway: per deciding policy)"),
    _u(_TS + "global_count_traces_sampled", Counter, ("sampled", "decision"),
       "Global count of traces that were sampled or not by at least one policy"),
    _u(_TS + "new_trace_id_received", Counter, (), "Counts the arrival of new traces"),
    _u(_TS + "early_releases_from_cache_decision", Counter, ("sampled",),
       "Number of spans that were able to be immediately released due to a decision cache hit."),
    _u(_TS + "sampling_policy_evaluation_error", Counter, ("policy",), "Count of sampling policy evaluation errors"),
    _u(_TS + "sampling_traces_on_memory", Gauge, (), "Tracks the number of traces current on memory"),
)
UPSTREAM_NAMES = frozenset(s.name for s in UPSTREAM_SPECS)

# our name -> the upstream series that now carries what it said (written both ways until RENAMED_REMOVED_IN)
RENAMED: dict[str, str] = {
    "receiver_accepted_spans": "otelcol_receiver_accepted_spans",
    "exporter_sent_spans": "otelcol_exporter_sent_spans",
    "exporter_queue_size": "otelcol_exporter_queue_size",
    "count_traces_sampled": _TS + "count_traces_sampled",
    "sampling_late_spans": _TS + "early_releases_from_cache_decision",
    "sampling_policy_errors": _TS + "sampling_policy_evaluation_error",
    "sampling_traces_on_memory": _TS + "sampling_traces_on_memory",
}


def _doc(name: str, doc: str) -> str:
    new = RENAMED.get(name)
    return f"Deprecated, removed in {RENAMED_REMOVED_IN}: use {new}. {doc}" if new else doc


# the table is the core's (otel_llm.core.self_metrics.GATEWAY_METRICS: the dashboard reads it too), plus the
# metrics and logs pipelines' own series (the dashboard does not read them)
SIGNAL_SPECS: tuple[Spec, ...] = (
    Spec("received_refused", Counter, ("signal", "reason"),
         "Metric points or log records refused by the gateway's metrics or logs pipeline (exponential_histogram, "
         "reserved_name: a name the gateway exposes itself, type_conflict, series_limit)"),
    Spec("received_unrouted", Counter, ("signal",),
         "Metric points or log records accepted with no exporter to pass them to (service.pipelines names none)"),
)
SPECS: tuple[Spec, ...] = tuple(Spec(g.name, {"counter": Counter, "gauge": Gauge}[g.kind], g.labels, _doc(g.name, g.doc))
                                for g in GATEWAY_METRICS) + SIGNAL_SPECS


def _sampled(decision: str) -> str:
    return "true" if decision == "sampled" else "false"  # Go's bool formatting, as upstream's label


# our series -> (upstream name, its labels from ours) for the upstream series an update of ours also writes
_Mirror = Callable[[dict[str, str]], tuple[str, dict[str, str]] | None]
_MIRROR: dict[str, tuple[_Mirror, ...]] = {
    "receiver_accepted_spans": (lambda l: ("otelcol_receiver_accepted_spans",
                                           {"receiver": RECEIVER, "transport": l.get("transport", "")}),),
    "receiver_refused_spans": (lambda l: ("otelcol_receiver_refused_spans",
                                          {"receiver": RECEIVER, "transport": l.get("transport", "")}),),
    "exporter_sent_spans": (lambda l: ("otelcol_exporter_sent_spans", {"exporter": l["exporter"]}),),
    # queue_full, disk_full (a durable queue's budget): never enqueued; every other reason: not delivered
    "exporter_dropped_spans": (lambda l: ("otelcol_exporter_enqueue_failed_spans"
                                          if l.get("reason") in ("queue_full", "disk_full")
                                          else "otelcol_exporter_send_failed_spans", {"exporter": l["exporter"]}),),
    "exporter_queue_size": (lambda l: ("otelcol_exporter_queue_size", {"exporter": l["exporter"], "data_type": TRACES}),),
    "count_traces_sampled": (
        lambda l: (_TS + "count_traces_sampled",
                   {"policy": l["policy"], "sampled": _sampled(l["decision"]), "decision": l["decision"]}),
        lambda l: (_TS + "global_count_traces_sampled",
                   {"sampled": _sampled(l["decision"]), "decision": l["decision"]})),
    "sampling_late_spans": (lambda l: (_TS + "early_releases_from_cache_decision",
                                       {"sampled": _sampled(l["decision"])}),),
    "sampling_policy_errors": (lambda l: (_TS + "sampling_policy_evaluation_error", {"policy": l["policy"]}),),
    "sampling_traces_on_memory": (lambda l: (_TS + "sampling_traces_on_memory", {}),),
}


class GatewayMetrics:
    """One set of registries per collector instance (several gateways can live in one test process)."""

    def __init__(self, registry: CollectorRegistry | None = None, level: str = "normal") -> None:
        if level not in LEVELS:
            raise ValueError(f"telemetry level {level!r}: expected one of {', '.join(LEVELS)}")
        self.level = level
        self.registry = registry or CollectorRegistry(auto_describe=True)  # ours (otelcol_llm_*)
        self.upstream_registry = CollectorRegistry(auto_describe=True)  # the upstream Collector's names
        self._m = {s.name: s.kind(PREFIX + s.name, s.doc, s.labels, registry=self.registry) for s in SPECS}
        self._u = {s.name: s.kind(s.name, s.doc, s.labels, registry=self.upstream_registry) for s in UPSTREAM_SPECS}
        self._children: dict[tuple, object] = {}

    def metric(self, name: str):
        return self._m[name] if name in self._m else self._u[name]

    def _child(self, name: str, labels: dict[str, str], table: dict):
        # prometheus_client's labels() validates and looks up under a lock on every call: remember the children
        key = (name, *labels.items())
        child = self._children.get(key)
        if child is None:
            child = table[name].labels(**labels)
            if len(self._children) < 10_000:  # label values are from small sets; bound it anyway
                self._children[key] = child
        return child

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Count ``amount`` on our series ``name`` (short name) or on an upstream one (full name); an update
        of ours writes the upstream series that carries the same information too."""
        self._update(name, labels, "inc", amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        self._update(name, labels, "set", value)

    def _update(self, name: str, labels: dict[str, str], op: str, value: float) -> None:
        if name in self._u:
            getattr(self._child(name, labels, self._u) if labels else self._u[name], op)(value)
            return
        getattr(self._child(name, labels, self._m) if labels else self._m[name], op)(value)
        for mirror in _MIRROR.get(name, ()):
            up, up_labels = mirror(labels)
            getattr(self._child(up, up_labels, self._u) if up_labels else self._u[up], op)(value)

    def _registry_of(self, name: str) -> tuple[CollectorRegistry, str, type]:
        if name in self._u:
            return self.upstream_registry, name, self._u[name].__class__
        return self.registry, PREFIX + name, self._m[name].__class__

    def value(self, name: str, **labels: str) -> float:
        """Current value (0 when never touched), for tests and the benchmark; ``name``: ours (short) or upstream."""
        registry, full, kind = self._registry_of(name)
        v = registry.get_sample_value(full + ("_total" if kind is Counter else ""), labels or None)
        return v or 0.0

    def total(self, name: str) -> float:
        """Sum over all label sets."""
        registry, full, kind = self._registry_of(name)
        sample = full + ("_total" if kind is Counter else "")
        out = 0.0
        for metric in registry.collect():
            for s in metric.samples:
                if s.name == sample:
                    out += s.value
        return out

    def exposition(self) -> bytes:
        """The own telemetry a scrape shows, by ``level``."""
        if self.level == "none":
            return b""
        upstream = generate_latest(self.upstream_registry)
        return upstream if self.level == "basic" else upstream + generate_latest(self.registry)
