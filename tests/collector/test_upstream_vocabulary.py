"""The gateway in the upstream Collector's vocabulary: its self-metrics' names and labels, the config keys
today's upstream configs use (``otlp_grpc``, ``service.pipelines``, ``service.telemetry``), ``--version``,
the warning when kept traces go nowhere, and OTLP metrics and logs on the standard paths (real SDK exporters)."""

from __future__ import annotations

import logging
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

from collector_testkit import export_request, loopback_config, request_attrs, span, wait_for
from otel_llm_collector import __version__
from otel_llm_collector.config import CollectorConfig, ConfigError
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.telemetry import RENAMED, RENAMED_REMOVED_IN

TS = "otelcol_processor_tail_sampling_"


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def post(url: str, body: bytes, ctype: str = "application/x-protobuf") -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class GrpcSink:
    """A real OTLP/gRPC server (TraceService, MetricsService, LogsService) keeping what it receives."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        for service, kind, store, reply in (
                ("trace.v1.TraceService", ExportTraceServiceRequest, self.traces, ExportTraceServiceResponse),
                ("metrics.v1.MetricsService", ExportMetricsServiceRequest, self.metrics, ExportMetricsServiceResponse),
                ("logs.v1.LogsService", ExportLogsServiceRequest, self.logs, ExportTraceServiceResponse)):
            def export(raw: bytes, context, kind=kind, store=store, reply=reply) -> bytes:
                store.append(kind.FromString(raw))
                return reply().SerializeToString()

            handler = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)
            self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                f"opentelemetry.proto.collector.{service}", {"Export": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def spans(self) -> int:
        return sum(len(ss.spans) for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans)

    def close(self) -> None:
        self.server.stop(0)


@pytest.fixture
def sink():
    s = GrpcSink()
    yield s
    s.close()


# -- self-telemetry ----------------------------------------------------------------------------------


def test_received_exported_and_sampled_carry_the_upstream_names_and_labels(clock, sink) -> None:
    cfg = loopback_config(exporters={"otlp_grpc/sink": {"endpoint": f"127.0.0.1:{sink.port}"}})
    with Gateway(cfg, clock=clock, manual_ticks=True) as g:
        g.ingest(export_request(span(1, 1, attrs=request_attrs(ttft=0.1)), span(1, 2, parent=1)), "grpc")
        g.ingest(export_request(span(2, 1, attrs=request_attrs(ttft=0.1)), span(2, 2, parent=1, error=True)), "http")
        clock.advance(60)
        g.tick()
        assert g.flush(10)
        text = scrape(f"http://{g.prometheus_endpoint}/metrics")
    assert 'otelcol_receiver_accepted_spans_total{receiver="otlp",transport="grpc"} 2.0' in text
    assert 'otelcol_receiver_accepted_spans_total{receiver="otlp",transport="http"} 2.0' in text
    assert 'otelcol_exporter_sent_spans_total{exporter="otlp_grpc/sink"}' in text
    assert 'otelcol_exporter_queue_capacity{data_type="traces",exporter="otlp_grpc/sink"} 1000.0' in text
    assert 'otelcol_exporter_queue_size{data_type="traces",exporter="otlp_grpc/sink"}' in text
    assert f'{TS}new_trace_id_received_total 2.0' in text
    assert f'{TS}global_count_traces_sampled_total{{decision="sampled",sampled="true"}}' in text
    assert f'{TS}count_traces_sampled_total{{decision="sampled",policy="errors",sampled="true"}} 1.0' in text
    assert f'{TS}sampling_traces_on_memory 0.0' in text
    # the renamed series are still written, saying when they go
    assert 'otelcol_llm_receiver_accepted_spans_total{transport="grpc"} 2.0' in text
    assert (f"# HELP otelcol_llm_receiver_accepted_spans_total Deprecated, removed in {RENAMED_REMOVED_IN}: use "
            "otelcol_receiver_accepted_spans.") in text
    # the sink received what was kept: the error trace at least
    assert sink.spans() >= 2


def test_every_renamed_series_names_an_upstream_series_the_gateway_writes() -> None:
    g = Gateway(loopback_config(), manual_ticks=True)
    names = {m.name for m in g.telemetry.upstream_registry.collect()}
    assert set(RENAMED.values()) <= names
    own = {m.name for m in g.telemetry.registry.collect()}
    assert {"otelcol_llm_" + k for k in RENAMED} <= own


def test_refused_and_failed_spans_use_the_upstream_names(clock) -> None:
    cfg = loopback_config(processors={"tail_sampling": None},
                          exporters={"otlp_grpc": {"endpoint": "127.0.0.1:1", "timeout": "100ms",
                                                   "retry_on_failure": {"enabled": False}}})
    with Gateway(cfg, clock=clock, manual_ticks=True) as g:
        bad = span(3, 1, attrs=request_attrs())
        bad.trace_id = b"\0" * 16
        g.ingest(export_request(bad, span(4, 1, attrs=request_attrs())), "grpc")
        assert g.flush(10)
        t = g.telemetry
        assert t.value("otelcol_receiver_refused_spans", receiver="otlp", transport="grpc") == 1
        assert t.value("otelcol_exporter_send_failed_spans", exporter="otlp_grpc") == 1


def test_telemetry_level_and_address(clock) -> None:
    cfg = loopback_config(service={"telemetry": {"metrics": {"level": "basic", "address": "127.0.0.1:0"}}})
    with Gateway(cfg, clock=clock, manual_ticks=True) as g:
        g.ingest(export_request(span(1, 1, attrs=request_attrs())), "grpc")
        own = scrape(f"http://{g.telemetry_endpoint}/metrics")
        main = scrape(f"http://{g.prometheus_endpoint}/metrics")
    assert "otelcol_receiver_accepted_spans_total" in own and "otelcol_llm_" not in own
    assert "otelcol_" not in main and "gen_ai_server_time_to_first_token_seconds_bucket" in main
    none = loopback_config(service={"telemetry": {"metrics": {"level": "none"}}})
    with Gateway(none, clock=clock, manual_ticks=True) as g:
        assert "otelcol_" not in g.exposition().decode()


def test_upstream_readers_form_of_the_telemetry_address() -> None:
    cfg = CollectorConfig.from_mapping({"service": {"telemetry": {"metrics": {"readers": [
        {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": 8888}}}}]}}}})
    assert cfg.telemetry.address == ("127.0.0.1", 8888)
    with pytest.raises(ConfigError, match="periodic: the gateway does not push"):
        CollectorConfig.from_mapping({"service": {"telemetry": {"metrics": {"readers": [
            {"periodic": {"exporter": {"otlp": {}}}}]}}}})


# -- config keys ---------------------------------------------------------------------------------------


def test_an_upstream_pipeline_config_is_honoured(clock, sink) -> None:
    cfg = loopback_config(
        exporters={"otlp_grpc/tempo": {"endpoint": f"127.0.0.1:{sink.port}"},
                   "otlp_grpc/unused": {"endpoint": "127.0.0.1:1"}},
        service={"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["llm_metrics"],
                                          "exporters": ["otlp_grpc/tempo"]}}})
    assert cfg.tail_sampling is None  # not in the pipeline: not run, as upstream
    assert [e.name for e in cfg.exporters] == ["otlp_grpc/tempo"]
    assert cfg.pipelines.metrics is None and cfg.pipelines.logs is None
    with Gateway(cfg, clock=clock, manual_ticks=True) as g:
        g.ingest(export_request(span(1, 1, attrs=request_attrs())))
        assert g.flush(10)
        assert sink.spans() == 1
        # no metrics pipeline: the standard path answers it has none, as upstream's receiver does
        status, body = post(f"{g.http_endpoint}/v1/metrics", ExportMetricsServiceRequest().SerializeToString())
        assert status == 404 and b"no metrics pipeline" in body


@pytest.mark.parametrize("pipelines, error", [
    ({"traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["file"]}},
     r"traces.processors: the gateway has no processor 'batch'"),
    ({"traces": {"receivers": ["otlp"], "processors": ["tail_sampling", "llm_metrics"], "exporters": ["file"]}},
     r"derives metrics before it samples"),
    ({"traces": {"receivers": ["jaeger"], "exporters": ["file"]}}, r"one receiver, otlp; got \['jaeger'\]"),
    ({"traces": {"receivers": ["otlp"], "exporters": ["file"]}, "traces/2": {"receivers": ["otlp"],
                                                                           "exporters": ["file"]}},
     r"traces/2: the gateway runs one traces pipeline"),
    ({"traces": {"receivers": ["otlp"], "exporters": ["prometheus"]}}, r"prometheus exporter 'prometheus' cannot take traces"),
    ({"traces": {"receivers": ["otlp"], "exporters": ["otlp_grpc/missing"]}}, r"'otlp_grpc/missing' is not configured"),
    ({"traces": {"receivers": ["otlp"], "exporters": ["file"]},
      "metrics": {"receivers": ["otlp"], "processors": ["llm_metrics"], "exporters": ["prometheus"]}},
     r"metrics.processors: the gateway passes metrics on unprocessed"),
    ({"traces": {"receivers": ["otlp"], "exporters": ["file"]}, "logs": {"receivers": ["otlp"], "exporters": ["file"]}},
     r"the file exporter 'file' cannot take logs"),
    ({"metrics": {"receivers": ["otlp"], "exporters": ["prometheus"]}}, r"a traces pipeline is required"),
])
def test_a_pipeline_the_gateway_cannot_honour_is_refused_by_name(tmp_path, pipelines, error) -> None:
    with pytest.raises(ConfigError, match=error):
        CollectorConfig.from_mapping({"exporters": {"file": {"path": str(tmp_path / "t.jsonl")}},
                                      "service": {"pipelines": pipelines}})


def test_otlp_grpc_checks_its_endpoint_like_otlp() -> None:
    with pytest.raises(ConfigError, match=r"exporters.otlp_grpc.endpoint"):
        CollectorConfig.from_mapping({"exporters": {"otlp_grpc": {"endpoint": "no-port"}}})


def test_kept_traces_going_nowhere_is_said(caplog) -> None:
    with caplog.at_level(logging.WARNING, "otel_llm_collector"), Gateway(loopback_config(), manual_ticks=True):
        pass
    assert any("no exporter sends them anywhere" in r.getMessage() for r in caplog.records)
    caplog.clear()
    quiet = loopback_config(processors={"tail_sampling": None})
    with caplog.at_level(logging.WARNING, "otel_llm_collector"), Gateway(quiet, manual_ticks=True):
        pass
    assert not any("no exporter sends them anywhere" in r.getMessage() for r in caplog.records)


def test_version_on_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "otel_llm_collector.cli", "--version"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.startswith(f"otel-llm-collector {__version__}")


# -- metrics and logs on the standard paths -----------------------------------------------------------


def _sdk_metrics(exporter) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider([reader], resource=Resource.create({"service.name": "shop",
                                                                 "service.instance.id": "pod-1"}))
    meter = provider.get_meter("test")
    meter.create_counter("orders", unit="{order}", description="Orders placed").add(3, {"region": "eu"})
    meter.create_histogram("checkout.duration", unit="s").record(0.25, {"region": "eu"})
    meter.create_up_down_counter("queue.depth").add(5)
    provider.shutdown()  # one export (its last collection)


def test_an_sdk_pointed_at_the_gateway_exports_metrics_and_logs_without_error(caplog, monkeypatch) -> None:
    """The standard OTEL_EXPORTER_OTLP_ENDPOINT, the real SDK exporters (HTTP), no error logged."""
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    with Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True) as g:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", g.http_endpoint)
        with caplog.at_level(logging.WARNING):
            _sdk_metrics(OTLPMetricExporter())
            logs = LoggerProvider()
            logs.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter()))
            handler = __import__("opentelemetry.sdk._logs", fromlist=["LoggingHandler"]).LoggingHandler(
                logger_provider=logs)
            app = logging.getLogger("shop.app")
            app.addHandler(handler)
            app.propagate = False
            app.error("payment declined")
            app.removeHandler(handler)
            logs.shutdown()
        sdk_errors = [r for r in caplog.records if r.name.startswith("opentelemetry")]
        assert not sdk_errors, [r.getMessage() for r in sdk_errors]
        text = g.exposition().decode()
        t = g.telemetry
        assert t.value("otelcol_receiver_accepted_log_records", receiver="otlp", transport="http") == 1
        assert t.value("received_unrouted", signal="logs") == 1  # no logs pipeline named an exporter: counted
    assert 'orders_total{instance="pod-1",job="shop",region="eu"} 3.0' in text
    assert 'checkout_duration_seconds_bucket{instance="pod-1",job="shop",region="eu",le="5.0"} 1' in text
    assert 'queue_depth{instance="pod-1",job="shop"} 5.0' in text
    assert "# TYPE orders_total counter" in text
    assert 'otelcol_receiver_accepted_metric_points_total{receiver="otlp",transport="http"} 3.0' in text


def test_metrics_and_logs_pass_on_to_an_otlp_grpc_exporter(sink) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    cfg = loopback_config(
        processors={"tail_sampling": None},
        exporters={"otlp_grpc/down": {"endpoint": f"127.0.0.1:{sink.port}"}},
        service={"pipelines": {
            "traces": {"receivers": ["otlp"], "processors": ["llm_metrics"], "exporters": ["otlp_grpc/down"]},
            "metrics": {"receivers": ["otlp"], "exporters": ["prometheus", "otlp_grpc/down"]},
            "logs": {"receivers": ["otlp"], "exporters": ["otlp_grpc/down"]}}})
    with Gateway(cfg, manual_ticks=True) as g:
        _sdk_metrics(OTLPMetricExporter(endpoint=g.grpc_endpoint, insecure=True))  # the SDK's gRPC exporter
        logs = ExportLogsServiceRequest()
        logs.resource_logs.add().scope_logs.add().log_records.add().body.string_value = "hello"
        channel = grpc.insecure_channel(g.grpc_endpoint)
        call = channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                                   request_serializer=None, response_deserializer=None)
        call(logs.SerializeToString(), timeout=10)
        channel.close()
        assert wait_for(lambda: sink.metrics and sink.logs, 10)
        t = g.telemetry
        assert t.value("otelcol_receiver_accepted_metric_points", receiver="otlp", transport="grpc") == 3
        assert wait_for(lambda: t.value("otelcol_exporter_sent_metric_points", exporter="otlp_grpc/down") == 3, 10)
        assert wait_for(lambda: t.value("otelcol_exporter_sent_log_records", exporter="otlp_grpc/down") == 1, 10)
        assert "orders_total" in g.exposition().decode()
    assert sink.logs[0].resource_logs[0].scope_logs[0].log_records[0].body.string_value == "hello"


def test_bad_metrics_input_is_refused_clearly() -> None:
    with Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True) as g:
        url = f"{g.http_endpoint}/v1/metrics"
        status, _ = post(url, b"\xff\xff\xff")
        assert status == 400
        status, body = post(url, b"{}", "application/json")
        assert status == 415 and b"OTLP/JSON is taken for traces only" in body
        # an exponential histogram and a name the gateway derives itself: refused, said in partial_success
        req = ExportMetricsServiceRequest()
        sm = req.resource_metrics.add().scope_metrics.add()
        m = sm.metrics.add(name="latency")
        m.exponential_histogram.data_points.add(count=1)
        own = sm.metrics.add(name="gen_ai.server.time_to_first_token", unit="s")
        own.histogram.data_points.add(count=1, bucket_counts=[1], sum=0.1)
        status, body = post(url, req.SerializeToString())
        assert status == 200
        reply = ExportMetricsServiceResponse.FromString(body)
        assert reply.partial_success.rejected_data_points == 2
        t = g.telemetry
        assert t.value("received_refused", signal="metrics", reason="exponential_histogram") == 1
        assert t.value("received_refused", signal="metrics", reason="reserved_name") == 1
        assert "# TYPE latency" not in g.exposition().decode()


def test_received_series_are_bounded_and_expire() -> None:
    from otel_llm_collector.received_metrics import ReceivedMetrics

    now = [0.0]
    refused: dict[str, int] = {}
    held = ReceivedMetrics(lambda r, n: refused.__setitem__(r, refused.get(r, 0) + n), max_series=2,
                           expiration=300, clock=lambda: now[0])
    req = ExportMetricsServiceRequest()
    m = req.resource_metrics.add().scope_metrics.add().metrics.add(name="g")
    for i in range(3):
        p = m.gauge.data_points.add(as_double=i)
        p.attributes.add(key="k").value.string_value = str(i)
    assert held.ingest(req.SerializeToString()) == (2, 1)
    assert refused == {"series_limit": 1} and held.series == 2
    now[0] = 301
    assert held.text() == "" and held.series == 0


# -- exemplars -------------------------------------------------------------------------------------------


def _scrape_openmetrics(endpoint: str) -> tuple[str, str]:
    req = urllib.request.Request(f"http://{endpoint}/metrics", headers={
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            import gzip
            body = gzip.decompress(body)
        return r.headers["Content-Type"], body.decode()


def test_exemplars_name_only_kept_traces_and_only_in_openmetrics(clock) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    cfg = loopback_config(processors={"tail_sampling": {"policies": [{"name": "errors", "type": "error"}]}},
                          exporters={"prometheus": {"endpoint": "127.0.0.1:0", "enable_open_metrics": True}})
    with Gateway(cfg, clock=clock, manual_ticks=True) as g:
        g.ingest(export_request(span(1, 1, attrs=request_attrs(ttft=0.3)), span(1, 2, parent=1, error=True)))
        g.ingest(export_request(span(2, 1, attrs=request_attrs(ttft=0.3))))  # same bucket, not kept
        g.ingest(export_request(span(3, 1, attrs=request_attrs(ttft=2.0))))  # its own bucket, not kept
        ctype, before = _scrape_openmetrics(g.prometheus_endpoint)
        assert ctype.startswith("application/openmetrics-text") and " # {" not in before  # nothing decided yet
        clock.advance(60)
        g.tick()
        assert g.exemplars.pending == 0  # every decided trace released its candidates
        ctype, text = _scrape_openmetrics(g.prometheus_endpoint)
    exemplars = [(s.labels["le"], s.exemplar) for f in text_string_to_metric_families(text)
                 if f.name == "gen_ai_server_time_to_first_token_seconds" for s in f.samples if s.exemplar]
    assert [(le, e.labels["trace_id"], e.value) for le, e in exemplars] == [("0.5", f"{1:032x}", 0.3)]
    with Gateway(loopback_config(), manual_ticks=True) as plain:  # upstream's default: enable_open_metrics false
        ctype, _ = _scrape_openmetrics(plain.prometheus_endpoint)
        assert ctype.startswith("text/plain")


def test_grpc_metrics_refused_clearly_and_absent_without_a_pipeline(sink) -> None:
    method = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
    with Gateway(loopback_config(processors={"tail_sampling": None}), manual_ticks=True) as g:
        with grpc.insecure_channel(g.grpc_endpoint) as channel:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as bad:
                call(b"\xff\xff\xff", timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed ExportMetricsServiceRequest" in bad.value.details()
        assert g.telemetry.value("receiver_bad_requests", transport="grpc", reason="malformed") == 1
    traces_only = loopback_config(
        exporters={"otlp_grpc": {"endpoint": f"127.0.0.1:{sink.port}"}},
        service={"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["otlp_grpc"]}}})
    with Gateway(traces_only, manual_ticks=True) as g:
        with grpc.insecure_channel(g.grpc_endpoint) as channel:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as absent:
                call(ExportMetricsServiceRequest().SerializeToString(), timeout=10)
        assert absent.value.code() == grpc.StatusCode.UNIMPLEMENTED  # as upstream's receiver without the pipeline
