"""The gateway: receivers -> llm_metrics -> tail_sampling -> exporters, plus the Prometheus endpoint.

One object owns the pipeline. ``clock`` is injected (the tail sampler's windows, the
rate limiters and the receivers' shares read it); with ``manual_ticks=True`` no ticker thread runs and the caller
decides when time passes by calling ``tick()`` - that is how tests drive decisions.

With ``processors.tail_sampling.storage`` every received batch is written to a write-ahead log before it is
acknowledged (``received_log.py``), and read back through the pipeline at start; the exporters' queues are
durable then too (``sending_queue.storage``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from otel_llm import semconv as sc
from otel_llm.otlp.messages import ExportTraceServiceRequest
from otel_llm.core.sampling import Policy, attribute_keys
from otel_llm.core.sampling.registry import build

from otel_llm.core.prometheus_names import prom_name

from .aggregation import AggregationBackend, SeriesLimits
from .auth import BearerAuth, warn_unprotected
from .disagg_join import DisaggJoin
from .trace_join import TraceJoin
from .ttft_join import TTFTJoin
from .config import CollectorConfig
from .exporters import QueuedExporter, make_exporter
from .exporters.signals import SignalExporter
from .exemplars import ExemplarStore
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from .fairness import Peer
from .llm_metrics import LLMMetricsProcessor
from .prometheus import OtelBridge, PrometheusEndpoint
from .received_metrics import REFUSED_MESSAGE as METRICS_REFUSED, ReceivedMetrics
from .receivers.grpc_receiver import GrpcReceiver
from .receivers.http_receiver import HttpReceiver
from .received_log import STORAGE, ReceivedLog
from .storage import DurableLog, log_directory
from .fast import wire
from .spans import REQUEST, TRACE_ID, Extracted, Received, RequestFacts, encode_request, extract, read_request
from .tail_sampling import Item, TailSampler
from .telemetry import RECEIVER, GatewayMetrics
from otel_llm.otlp.messages import MalformedRequest
from otel_llm.otlp.signals import log_record_count, metric_point_count, parse_logs_request, parse_metrics_request

Clock = Callable[[], float]
INGEST_CHUNK = 1000  # spans processed per hold of the pipeline lock
log = logging.getLogger("otel_llm_collector")


class Gateway:
    def __init__(self, config: CollectorConfig, clock: Clock = time.monotonic, manual_ticks: bool = False,
                 policies: Sequence[Policy] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.manual_ticks = manual_ticks
        self.telemetry = GatewayMetrics(level=config.telemetry.level)
        # ``registry``: everything (own telemetry + derived metrics) for programmatic reads; the endpoint
        # renders the derived metrics with the bridge's own fast text writer (``exposition``)
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Registry(self.telemetry.upstream_registry))
        self.registry.register(_Registry(self.telemetry.registry))
        # derived metrics: the core's instruments on a light cumulative backend (aggregation.py), read on
        # scrape; it is both the meter provider the core records into and the reader the bridge reads
        labels = config.labels
        self.meter_provider = AggregationBackend(
            Resource.create({sc.SERVICE_NAME: "otel-llm-collector"}),
            # a backstop behind llm_metrics' admission (which keeps label sets <= max_series + 1): token usage
            # has two series per label set; ttft_join's label sets are admitted here only
            limits=SeriesLimits(2 * labels.max_series + 4, 2 * labels.max_series_per_service + 2),
            on_refused=lambda reason, n: self.telemetry.inc("llm_metrics_values_refused", n, reason=reason))
        self.metric_reader = self.meter_provider
        # exemplars on the derived latency histograms, for traces the tail sampler keeps (exemplars.py)
        self.exemplars = ExemplarStore(max_pending=max(config.tail_sampling.num_traces, 1024)
                                       if config.tail_sampling else 1024)
        self.bridge = OtelBridge(self.metric_reader, self.exemplars)
        self.registry.register(self.bridge)
        self.metrics = LLMMetricsProcessor(self.meter_provider, config.slo, self.telemetry, labels) \
            if config.llm_metrics else None
        self.ttft_join = TTFTJoin(self.meter_provider, self.telemetry, max_label_length=labels.max_label_length) \
            if config.llm_metrics else None
        # disaggregated serving: the user's request from its prefill and decode halves, recorded once
        self.disagg_join = DisaggJoin(self._record_users, config.slo, self.telemetry, clock) \
            if config.llm_metrics else None
        self.exporters: list[QueuedExporter] = []
        self.received_log: ReceivedLog | None = None
        # metrics and logs received (service.pipelines.metrics / .logs): Prometheus and/or OTLP exporters; they
        # skip the write-ahead log and their queues stay in memory (durability covers traces)
        routes = config.pipelines
        self.signal_exporters: dict[str, SignalExporter] = {}
        try:  # a durable queue replays what it held when it starts
            for e in config.exporters:
                self.exporters.append(make_exporter(e, self.telemetry, config.storage.for_exporter(e.name)))
            received = config.storage.received
            if received is not None and config.tail_sampling is not None:
                self.received_log = ReceivedLog(DurableLog(
                    log_directory(received.directory, STORAGE), received.fsync, received.max_bytes,
                    lambda outcome, n: self.telemetry.inc("storage_records", n, storage=STORAGE, outcome=outcome)))
            for e in config.signal_exporters:
                self.signal_exporters[e.name] = SignalExporter(e, self.telemetry)
        except BaseException:
            for q in self.exporters:
                q.close(0)
            for s in self.signal_exporters.values():
                s.close(0)
            if self.received_log is not None:
                self.received_log.close()
            raise
        self._routes = {signal: [self.signal_exporters[n] for n in names if n in self.signal_exporters]
                        for signal, names in (("metrics", routes.metrics), ("logs", routes.logs)) if names is not None}
        self.received_metrics: ReceivedMetrics | None = None
        if routes.metrics is not None and "prometheus" in routes.metrics and config.prometheus is not None:
            self.received_metrics = ReceivedMetrics(
                lambda reason, n: self.telemetry.inc("received_refused", n, signal="metrics", reason=reason),
                self._reserved_names, max_label_length=labels.max_label_length)
        self._own_names: frozenset[str] | None = None
        # the OpenMetrics exposition (exemplars): the same families through prometheus_client's writer
        self._openmetrics = CollectorRegistry(auto_describe=False)
        if config.telemetry.address is None and config.telemetry.level != "none":
            self._openmetrics.register(_Registry(self.telemetry.upstream_registry))
            if config.telemetry.level != "basic":
                self._openmetrics.register(_Registry(self.telemetry.registry))
        self._openmetrics.register(self.bridge)
        if self.received_metrics is not None:
            self._openmetrics.register(self.received_metrics)
        self._warned_unrouted: set[str] = set()
        ts = config.tail_sampling
        self.sampler: TailSampler | None = None
        self._keys: frozenset[str] = frozenset()  # attribute keys the policies read (collected per trace)
        if ts is not None:
            built = list(policies) if policies is not None else build(ts.policies, clock, config.slo)
            self.sampler = TailSampler(ts, built, clock, self.telemetry, self._emit)
            self.sampler.on_decided = self.exemplars.decided
            self._keys = attribute_keys(built)
        if self.metrics is not None and config.prometheus_openmetrics:  # exemplars show in OpenMetrics only
            self.metrics.exemplars = self.exemplars
            self.metrics.exemplars_kept = self.sampler is None  # no tail sampling: every trace goes on
        # a server request trace without a caller (vLLM's Rust frontend), into its client call's trace, before
        # the tail decision; it waits on the sampler's ticks, so it runs with tail sampling
        self.trace_join: TraceJoin | None = None
        if self.sampler is not None:
            self.trace_join = TraceJoin(self.telemetry, clock)
            self._keys = self._keys | {sc.RESPONSE_ID}
        self.grpc: GrpcReceiver | None = None
        self.http: HttpReceiver | None = None
        self.prometheus: PrometheusEndpoint | None = None
        self.own_telemetry: PrometheusEndpoint | None = None  # service.telemetry.metrics.address, when set
        # The pipeline runs on one thread at a time: receivers parse and ingest under this lock and the
        # ticker decides under it. Python threads cannot run it in parallel anyway (the GIL), and letting
        # handler threads interleave parsing and processing of different requests cost the receive path
        # its caches, and a separate deciding thread cost more (benchmarks/collector_throughput.py, loopback).
        self.serial = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "Gateway":
        cfg = self.config
        warn_unprotected(cfg)
        if cfg.telemetry.log_level is not None:
            log.setLevel(cfg.telemetry.log_level)
        if self.sampler is not None and not self.exporters:
            log.warning("tail_sampling keeps traces but no exporter sends them anywhere: kept traces are dropped "
                        "(only the derived metrics remain); add an otlp_grpc, otlphttp or file exporter")
        if not wire.AVAILABLE and (cfg.grpc is not None or cfg.http is not None):
            log.warning("receivers validate and read each request in two passes (%s); the one-pass path needs the "
                        "C extension built by `pip install ./collector` with a C compiler", wire.REASON)
        try:
            self._replay()  # before any receiver opens: what was acknowledged before a crash goes first
            if cfg.prometheus is not None:
                self.prometheus = PrometheusEndpoint(cfg.prometheus[0], cfg.prometheus[1], self.exposition,
                                                     BearerAuth(cfg.prometheus_auth) if cfg.prometheus_auth else None,
                                                     openmetrics=self.openmetrics if cfg.prometheus_openmetrics
                                                     else None)
            if cfg.telemetry.address is not None:  # own telemetry on its own port, as upstream's :8888
                self.own_telemetry = PrometheusEndpoint(*cfg.telemetry.address, self.telemetry.exposition)
            signals = {signal: (lambda raw, transport, peer=None, _s=signal: self.ingest_signal(_s, raw, transport))
                       for signal in self._routes}
            if cfg.grpc is not None:
                self.grpc = GrpcReceiver(cfg.grpc, self.ingest, self.telemetry, self.read_request, signals,
                                         clock=self.clock)
                self.grpc.start()
            if cfg.http is not None:
                self.http = HttpReceiver(cfg.http, self.ingest, self.telemetry, self.read_request, signals,
                                         clock=self.clock)
                self.http.start()
        except Exception:
            self.shutdown()
            raise
        if self.sampler is not None and not self.manual_ticks:
            self._ticker = threading.Thread(target=self._tick_loop, name="tail-sampling-ticker", daemon=True)
            self._ticker.start()
        return self

    def shutdown(self, timeout: float | None = None) -> int:
        """Stop receiving, decide what is buffered, deliver what can be delivered in ``timeout``
        (default: ``service.shutdown_timeout``). Returns the spans that could not be delivered: each
        exporter counts them (``exporter_dropped_spans{reason="shutdown"}``) and they are logged."""
        timeout = self.config.shutdown_timeout if timeout is None else timeout
        self._stop.set()
        if self.grpc is not None:
            self.grpc.stop()
        if self.http is not None:
            self.http.stop()
        if self._ticker is not None:
            self._ticker.join(timeout)
        if self.sampler is not None:
            with self.serial:  # after a request already in the pipeline: what it buffered is decided too
                self._expire_joins(drain=True)
                self.sampler.decide_all()
                self._decided()
        # one grace for all exporters together: they drain in parallel (each has its own worker)
        deadline = time.monotonic() + timeout
        for e in self.exporters:
            e.flush(max(0.0, deadline - time.monotonic()))
        lost = {e.name: e.close(0) for e in self.exporters}
        for s in self.signal_exporters.values():
            s.close(max(0.0, deadline - time.monotonic()))
        if self.received_log is not None:  # after the exporters: what they did not deliver stays logged
            self.received_log.close()
        if self.prometheus is not None:
            self.prometheus.close()
        if self.own_telemetry is not None:
            self.own_telemetry.close()
        self.meter_provider.shutdown()
        total = sum(lost.values())
        if total:
            log.error("shutdown: %d spans could not be delivered within %gs (%s); counted in "
                      "otelcol_llm_exporter_dropped_spans_total{reason=\"shutdown\"}", total, timeout,
                      ", ".join(f"{name}: {n}" for name, n in lost.items() if n))
        return total

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- pipeline ------------------------------------------------------------------------------

    def read_request(self, raw: bytes) -> "ExportTraceServiceRequest | Received":
        """What the receivers run on a protobuf body before ``ingest``: validation (``MalformedRequest``: refused)
        and, with the C extension built, the reading ``extract`` needs, in one pass (``spans.read_request``)."""
        return read_request(raw, self._keys)

    def ingest(self, request: "ExportTraceServiceRequest | Received", transport: str = "direct",
               raw: bytes | None = None, peer: Peer | None = None) -> int:
        """Process one export request; returns the number of spans refused (invalid trace, span or parent id).

        ``raw``: the protobuf bytes ``request`` was parsed from, when at hand (the receivers pass them).
        Reading the request (``extract``) needs no shared state, so it runs before the pipeline lock is
        taken: a large request delays nobody else's while it is read. Traces that are due are decided
        right after, on the same thread, while their data is still in cache. ``peer``: who sent it (the
        receivers' tenant or source address), for the per-tenant and per-source series budgets."""
        batch = extract(request, raw, self._keys)
        logged = None
        if self.received_log is not None and batch.spans:  # durable before it is acknowledged
            with self.serial:
                logged = self.received_log.append(raw if raw is not None else request.SerializeToString())
        if len(batch.spans) > INGEST_CHUNK:  # a big request: other clients' exports get the lock in between
            for part in split(batch, INGEST_CHUNK):
                with self.serial:
                    self._ingest(part, transport, peer)
            batch_done = True
        else:
            batch_done = False
        with self.serial:
            if not batch_done:
                self._ingest(batch, transport, peer)
            if logged is not None and self.received_log is not None and self.sampler is not None:
                self.received_log.hold(logged, (rec[TRACE_ID] for rec in batch.spans), self._holds)
            if self.sampler is not None:
                self._expire_joins()
                self.sampler.tick()
                self._decided()
        return batch.rejected

    def _decided(self) -> None:
        """After decisions (under the pipeline lock): the logged batches whose traces are all decided are done."""
        if self.received_log is not None and self.sampler is not None:
            self.received_log.advance(self._holds)

    def _holds(self, trace_id: bytes) -> bool:
        """Spans of the trace wait for a decision (in the tail sampler, or for their partner in ``trace_join``)."""
        assert self.sampler is not None
        return self.sampler.holds(trace_id) or (self.trace_join is not None and self.trace_join.holds(trace_id))

    def _expire_joins(self, drain: bool = False) -> None:
        """Hand the halves that waited long enough for their partner (all, when ``drain``) to the tail sampler."""
        if self.trace_join is not None and self.sampler is not None and (drain or self.trace_join.waiting):
            released = self.trace_join.drain() if drain else self.trace_join.expire()
            if released.spans:
                self.sampler.add(released)

    def _replay(self) -> None:
        """Read the batches a crash left in the write-ahead log back through the pipeline (policies run again on
        what was logged); each stays in the log until its traces are decided again."""
        if self.received_log is None or self.sampler is None:
            return
        for position, raw in self.received_log.replay():
            try:
                batch = extract(self.read_request(raw), raw, self._keys)
            except Exception:  # noqa: BLE001 - a record that passed its crc but does not parse: skip, counted
                self.telemetry.inc("storage_records", storage=STORAGE, outcome="corrupt")
                batch = None
            with self.serial:
                if batch is not None:
                    self._ingest(batch, "replay", None)
                self.received_log.hold(position, (rec[TRACE_ID] for rec in batch.spans) if batch else (),
                                       self.sampler.holds)
        with self.serial:
            self._expire_joins()
            self.sampler.tick()
            self._decided()

    def _ingest(self, batch: Extracted, transport: str, peer: Peer | None = None) -> None:
        if batch.spans:
            self.telemetry.inc("receiver_accepted_spans", len(batch.spans), transport=transport)
        for reason, n in (batch.rejected_by or {}).items():
            self.telemetry.inc("receiver_refused_spans", n, transport=transport, reason=reason)
        if self.metrics is not None and batch.requests:
            self.metrics.process(batch.requests, peer)
        if self.ttft_join is not None and (batch.clients or batch.requests):
            self.ttft_join.process(batch)
        if self.disagg_join is not None and (batch.requests or self.disagg_join.waiting):
            self.disagg_join.process(batch, peer)
        if self.sampler is not None:
            self.sampler.add(self.trace_join.process(batch) if self.trace_join is not None and batch.spans else batch)
        elif batch.spans:
            self._emit([(group, raw) for _, group, raw, *_ in batch.spans])

    def _record_users(self, users: list[RequestFacts], peer: Peer | None) -> None:
        """User requests joined from their halves: in the derived metrics, and the client's overhead over them."""
        if self.metrics is not None:
            self.metrics.process(users, peer)
        if self.ttft_join is not None:
            self.ttft_join.process(Extracted([], users))

    def exposition(self) -> bytes:
        """What a scrape returns: own telemetry (prometheus_client; unless it has its own endpoint) + derived
        metrics (the bridge's writer)."""
        own = self.telemetry.exposition() if self.config.telemetry.address is None else b""
        received = self.received_metrics.text().encode() if self.received_metrics is not None else b""
        return own + self.bridge.text().encode() + received

    def openmetrics(self) -> bytes:
        """What a scrape asking for OpenMetrics returns: the same series, with the histograms' exemplars."""
        return openmetrics_latest(self._openmetrics)

    # -- metrics and logs ---------------------------------------------------------------------------

    def ingest_signal(self, signal: str, raw: bytes, transport: str) -> tuple[int, str]:
        """One OTLP metrics or logs export request (protobuf) through its pipeline: received metrics onto
        the Prometheus endpoint, the request as received to the pipeline's OTLP exporters. Returns (items
        refused, why) for the response's ``partial_success``; ``MalformedRequest`` for bytes that are not one."""
        unit = "metric_points" if signal == "metrics" else "log_records"
        refused, message = 0, ""
        try:
            if signal == "metrics" and self.received_metrics is not None:
                accepted, refused = self.received_metrics.ingest(raw)
                total, message = accepted + refused, METRICS_REFUSED if refused else ""
            else:
                total = _count(signal, raw)
        except MalformedRequest:
            raise
        except Exception as exc:  # noqa: BLE001 - a processing bug is the request's refusal, never the receiver's end
            raise MalformedRequest(f"cannot process the {signal} request: {type(exc).__name__}") from None
        labels = {"receiver": RECEIVER, "transport": transport}
        if total - refused:
            self.telemetry.inc(f"otelcol_receiver_accepted_{unit}", total - refused, **labels)
        if refused:
            self.telemetry.inc(f"otelcol_receiver_refused_{unit}", refused, **labels)
        exporters = self._routes.get(signal, [])
        for e in exporters:
            e.submit(signal, raw, total)
        if not exporters and not (signal == "metrics" and self.received_metrics is not None) and total:
            self.telemetry.inc("received_unrouted", total, signal=signal)
            if signal not in self._warned_unrouted:
                self._warned_unrouted.add(signal)
                log.warning("%s received and accepted, but no exporter takes them: name an otlp_grpc or otlphttp "
                            "exporter in service.pipelines.%s.exporters (counted in "
                            "otelcol_llm_received_unrouted_total)", signal, signal)
        return refused, message

    def _reserved_names(self) -> frozenset[str]:
        """Names the gateway exposes itself (own telemetry, derived metrics): received metrics may not take them."""
        if self._own_names is None:
            self._own_names = frozenset(n for r in (self.telemetry.registry, self.telemetry.upstream_registry)
                                        for m in r.collect() for n in (m.name, m.name + "_total"))
        derived = set()
        with self.meter_provider.lock:
            meters = list(self.meter_provider._meters.values())
            for meter in meters:
                for inst in meter.instruments.values():
                    name = prom_name(inst.name, inst.unit)
                    derived.update((name, name + "_total"))
        return self._own_names | derived

    def tick(self) -> int:
        """Decide the traces that are due (the ticker calls this when no request arrives to do it)."""
        if self.sampler is None:
            return 0
        with self.serial:
            self._expire_joins()
            n = self.sampler.tick()
            self._decided()
            return n

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every exporter has sent (or given up on) what it was handed."""
        return all([e.flush(timeout) for e in self.exporters])

    def _emit(self, items: list[Item]) -> None:
        if not self.exporters or not items:
            return
        payload = encode_request(items)  # encoded once for every exporter
        for e in self.exporters:
            e.submit(payload, len(items))

    def _tick_loop(self) -> None:
        interval = self.config.tail_sampling.tick_interval if self.config.tail_sampling else 1.0
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - keep deciding; the policy errors are counted inside
                pass

    # -- addresses, for tests and logs -----------------------------------------------------------

    @property
    def grpc_endpoint(self) -> str:
        assert self.grpc is not None and self.config.grpc is not None
        return f"{self.config.grpc.host}:{self.grpc.port}"

    @property
    def http_endpoint(self) -> str:
        assert self.http is not None and self.config.http is not None
        scheme = "https" if self.config.http.tls is not None else "http"
        return f"{scheme}://{self.config.http.host}:{self.http.port}"

    @property
    def telemetry_endpoint(self) -> str:
        assert self.own_telemetry is not None and self.config.telemetry.address is not None
        return f"{self.config.telemetry.address[0]}:{self.own_telemetry.port}"

    @property
    def prometheus_endpoint(self) -> str:
        assert self.prometheus is not None and self.config.prometheus is not None
        return f"{self.config.prometheus[0]}:{self.prometheus.port}"


class _Registry:
    """Another registry's metrics, as one collector (so one registry can hold both kinds)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        return self._registry.collect()


def _count(signal: str, raw: bytes) -> int:
    """Data points or log records in an encoded metrics or logs export request (validating it)."""
    if signal == "metrics":
        return metric_point_count(parse_metrics_request(raw))
    return log_record_count(parse_logs_request(raw))


def split(batch: Extracted, n: int):
    """``batch`` as consecutive parts of at most ``n`` spans, each with its own request facts and attribute
    values; client facts and refusals go with the first part (every item is processed exactly once)."""
    attributes = batch.attributes
    for i in range(0, len(batch.spans), n):
        spans = batch.spans[i:i + n]
        requests = [rec[REQUEST] for rec in spans if rec[REQUEST] is not None]
        attrs = None
        if attributes:
            attrs = {tid: attributes[tid] for tid in {rec[TRACE_ID] for rec in spans} if tid in attributes} or None
        first = i == 0
        yield Extracted(spans, requests, batch.rejected if first else 0, batch.clients if first else None, attrs,
                        batch.rejected_by if first else None)
