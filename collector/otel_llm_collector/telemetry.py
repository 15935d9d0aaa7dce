"""The collector's own telemetry on the Prometheus endpoint, next to the derived metrics.

The table (names, kinds, labels, help) is the core's ``otel_llm.core.self_metrics.GATEWAY_METRICS``,
where the dashboard reads it too; this module builds the prometheus_client instruments from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from otel_llm.core.self_metrics import GATEWAY_METRICS, GATEWAY_PREFIX

PREFIX = GATEWAY_PREFIX


@dataclass(frozen=True)
class Spec:
    name: str
    kind: type
    labels: tuple[str, ...]
    doc: str


# the table is the core's (otel_llm.core.self_metrics.GATEWAY_METRICS: the dashboard reads it too)
SPECS: tuple[Spec, ...] = tuple(Spec(g.name, {"counter": Counter, "gauge": Gauge}[g.kind], g.labels, g.doc)
                                for g in GATEWAY_METRICS)


class GatewayMetrics:
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
