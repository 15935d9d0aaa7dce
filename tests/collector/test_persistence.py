"""Durable when asked: the ``file_storage`` extension behind the exporters' sending queues and the tail
sampler's write-ahead log. Nothing a receiver acknowledged and a policy keeps is lost to a killed gateway
(at least once: duplicates counted); a torn last record is skipped and counted; the disk budget refuses.

The crash test runs the real gateway (``python -m otel_llm_collector.cli``) as a subprocess on loopback, kills
it with SIGKILL while a client exports, and restarts it on the same directory. Every wait is bounded; the
assertions are about trace ids and counters, never about how fast.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector_testkit import FakeClock, export_request, loopback_config, request_attrs, span, wait_for
from peer_clients import http_export
from otel_llm_collector.config import ConfigError
from otel_llm_collector.exporters.queue import QueuedExporter
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.storage import DurableLog, StorageFull
from otel_llm_collector.telemetry import GatewayMetrics


def _counts() -> tuple[dict[str, int], object]:
    seen: dict[str, int] = {}

    def count(outcome: str, n: int) -> None:
        seen[outcome] = seen.get(outcome, 0) + n
    return seen, count


def _last_segment(directory: str) -> str:
    return os.path.join(directory, sorted(n for n in os.listdir(directory) if n.endswith(".log"))[-1])


TORN = struct.pack("<II", 100, 0) + b"0123456789"  # a header promising 100 bytes, then 10 of them: a torn write


# -- the log ---------------------------------------------------------------------------------------

def test_a_log_replays_what_was_not_acknowledged_and_cuts_a_torn_last_record(tmp_path) -> None:
    d = str(tmp_path / "log")
    log = DurableLog(d)
    positions = [log.append(f"record-{i}".encode()) for i in range(3)]
    log.ack(positions[0])
    log.close()
    with open(_last_segment(d), "ab") as f:  # a crash in the middle of the fourth write
        f.write(TORN)
    seen, count = _counts()
    log = DurableLog(d, count=count)
    assert [p for _, p in log.replay()] == [b"record-1", b"record-2"]
    assert seen == {"replayed": 2, "torn": 1}
    log.append(b"after")  # appends after the cut are clean
    log.close()
    seen, count = _counts()
    log = DurableLog(d, count=count)
    assert [p for _, p in log.replay()] == [b"record-1", b"record-2", b"after"] and seen == {"replayed": 3}
    with pytest.raises(Exception, match="in use"):  # one process per directory
        DurableLog(d)
    log.close()


def test_acknowledged_segments_are_deleted_and_the_disk_budget_refuses(tmp_path) -> None:
    seen, count = _counts()
    log = DurableLog(str(tmp_path / "log"), max_bytes=4096, count=count, segment_bytes=1024)
    last = None
    for _ in range(3):
        last = log.append(b"x" * 1000)  # three segments of one record each
    with pytest.raises(StorageFull):
        log.append(b"x" * 2000)  # past the 4 KiB budget: refused, nothing written
    assert seen == {"written": 3, "full": 1} and log.size == 3 * 1008
    assert last is not None
    log.ack(last)
    assert log.size == 1008  # the segments wholly before the cursor are gone
    assert list(DurableLog.replay(log)) == []
    log.close()


# -- config ----------------------------------------------------------------------------------------

def test_storage_keys_are_checked_at_load(tmp_path) -> None:
    ext = {"file_storage": {"directory": str(tmp_path)}}
    otlp = {"endpoint": "127.0.0.1:1"}
    with pytest.raises(ConfigError, match="not a file_storage extension"):
        loopback_config(exporters={"otlp": {**otlp, "sending_queue": {"storage": "file_storage/other"}}},
                        extensions=ext)
    with pytest.raises(ConfigError, match="keep their queue in memory"):  # kept traces would not be durable
        loopback_config(exporters={"otlp": otlp}, extensions=ext, processors={"tail_sampling": {"storage": "file_storage"}})
    with pytest.raises(ConfigError, match="not a writable directory"):
        loopback_config(extensions={"file_storage": {"directory": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match="unknown key"):
        loopback_config(extensions={"file_storage": {"directory": str(tmp_path), "compaction": {}}})
    cfg = loopback_config(exporters={"otlp": {**otlp, "sending_queue": {"storage": "file_storage"}}},
                          extensions={"file_storage": {"directory": str(tmp_path / "new"), "create_directory": True,
                                                       "fsync": True, "max_size": "64MiB"}},
                          processors={"tail_sampling": {"storage": "file_storage"}})
    storage = cfg.storage.received
    assert storage is not None and storage.fsync and storage.max_bytes == 64 << 20
    assert cfg.storage.for_exporter("otlp") == storage and os.path.isdir(tmp_path / "new")
    assert loopback_config().storage.received is None  # memory only by default


# -- the exporter's queue --------------------------------------------------------------------------

class _Sender:
    def __init__(self, up: bool) -> None:
        self.up, self.sent = up, []

    def send(self, payload: bytes):
        if not self.up:
            raise ConnectionError("backend down")
        self.sent.append(payload)
        return None

    def close(self) -> None:
        pass


def test_a_durable_sending_queue_keeps_what_it_could_not_deliver_for_the_next_start(tmp_path) -> None:
    cfg = loopback_config(exporters={"otlp": {"endpoint": "127.0.0.1:1", "retry_on_failure": {"max_elapsed_time": "1h"},
                                               "sending_queue": {"storage": "file_storage"}}},
                          extensions={"file_storage": {"directory": str(tmp_path)}}).exporters[0]
    t = GatewayMetrics()
    d = str(tmp_path / "queue")
    down = QueuedExporter(cfg, _Sender(False), t, sleep=lambda s: False, log=DurableLog(d))
    for i in range(3):
        assert down.submit(f"batch-{i}".encode(), 2)
    assert down.close(0.2) == 0  # kept on disk, not lost
    assert t.value("exporter_dropped_spans", exporter="otlp", reason="shutdown") == 0
    up = _Sender(True)
    again = QueuedExporter(cfg, up, t, log=DurableLog(d))
    assert again.flush(10) and up.sent == [b"batch-0", b"batch-1", b"batch-2"]
    assert t.value("exporter_sent_spans", exporter="otlp") == 6
    again.close(1)
    assert list(DurableLog(d).replay()) == []  # all acknowledged


# -- the write-ahead log in the gateway ------------------------------------------------------------

def _durable_gateway(tmp_path, clock: FakeClock, max_size: str = "1GiB") -> Gateway:
    cfg = loopback_config(
        extensions={"file_storage": {"directory": str(tmp_path), "max_size": max_size}},
        receivers={"otlp": {"protocols": {"grpc": None, "http": {"endpoint": "127.0.0.1:0"}}}},
        processors={"tail_sampling": {"storage": "file_storage", "decision_wait": "10s",
                                      "decision_wait_after_root_received": "1s",
                                      "policies": [{"name": "errors", "type": "error"}]}},
        exporters={"file": {"path": str(tmp_path / "out.jsonl"), "sending_queue": {"storage": "file_storage"}}})
    return Gateway(cfg, clock=clock, manual_ticks=True)


def test_the_gateway_replays_undecided_batches_and_refuses_when_its_disk_budget_is_spent(tmp_path) -> None:
    clock = FakeClock()
    g = _durable_gateway(tmp_path, clock).start()
    body = export_request(span(7, 1, attrs=request_attrs(), error=True)).SerializeToString()
    assert http_export(g.http.port, body) == 200
    assert g.sampler is not None and g.sampler.holds((7).to_bytes(16, "big"))
    # a crash here: the trace is undecided; nothing is flushed or closed
    g.http.stop()
    for e in g.exporters:
        e._log.close()  # type: ignore[union-attr]  # stands for the process going away
    assert g.received_log is not None
    g.received_log.close()
    again = _durable_gateway(tmp_path, clock).start()
    try:
        assert again.sampler is not None and again.sampler.holds((7).to_bytes(16, "big"))  # replayed
        assert again.telemetry.value("storage_records", storage="tail_sampling", outcome="replayed") == 1
        clock.advance(2)
        again.tick()  # decided again by the policies on what was logged: kept
        assert again.received_log is not None and again.received_log.waiting == 0
        assert again.flush(10)
        assert "0000000000000007" in (tmp_path / "out.jsonl").read_text()
    finally:
        again.shutdown()
    os.makedirs(tmp_path / "full")
    full = _durable_gateway(tmp_path / "full", FakeClock(), max_size="64").start()
    try:
        assert http_export(full.http.port, body) == 503  # refused before anything was taken; the client retries
        assert full.telemetry.value("receiver_bad_requests", transport="http", reason="storage_full") == 1
        assert full.sampler is not None and not full.sampler.holds((7).to_bytes(16, "big"))
    finally:
        full.shutdown()


# -- with the upstream vocabulary: queue series, pipelines, metrics and logs -------------------------

def test_a_durable_queue_writes_upstreams_queue_series(tmp_path) -> None:
    cfg = loopback_config(exporters={"otlp_grpc": {"endpoint": "127.0.0.1:1", "sending_queue": {"queue_size": 7},
                                                   "retry_on_failure": {"max_elapsed_time": "1h"}}}).exporters[0]
    d = str(tmp_path / "queue")
    log = DurableLog(d)
    for i in range(3):  # what a crash left
        log.append(struct.pack("<I", 2) + f"batch-{i}".encode())
    log.close()
    t = GatewayMetrics()
    down = QueuedExporter(cfg, _Sender(False), t, log=DurableLog(d, max_bytes=4096))
    try:
        assert t.value("otelcol_exporter_queue_capacity", exporter="otlp_grpc", data_type="traces") == 7
        assert t.value("otelcol_exporter_queue_size", exporter="otlp_grpc", data_type="traces") == 3  # replayed
        assert not down.submit(b"x" * 8192, 5)  # past the disk budget: never enqueued
        assert t.value("otelcol_exporter_enqueue_failed_spans", exporter="otlp_grpc") == 5
        assert t.value("otelcol_exporter_send_failed_spans", exporter="otlp_grpc") == 0
    finally:
        down.close(0)


def test_metrics_and_logs_skip_the_write_ahead_log(tmp_path) -> None:
    g = _durable_gateway(tmp_path, FakeClock()).start()
    try:
        metrics = ExportMetricsServiceRequest()
        m = metrics.resource_metrics.add().scope_metrics.add().metrics.add(name="orders")
        m.gauge.data_points.add(as_double=1)
        logs = ExportLogsServiceRequest()
        logs.resource_logs.add().scope_logs.add().log_records.add().body.string_value = "hello"
        for path, body in (("/v1/metrics", metrics), ("/v1/logs", logs)):
            conn = http.client.HTTPConnection("127.0.0.1", g.http.port, timeout=10)
            conn.request("POST", path, body=body.SerializeToString(),
                         headers={"Content-Type": "application/x-protobuf"})
            assert conn.getresponse().status == 200
            conn.close()
        t = g.telemetry
        assert t.value("otelcol_receiver_accepted_metric_points", receiver="otlp", transport="http") == 1
        assert t.value("otelcol_receiver_accepted_log_records", receiver="otlp", transport="http") == 1
        assert t.value("storage_records", storage="tail_sampling", outcome="written") == 0  # traces only
        body = export_request(span(7, 1, attrs=request_attrs(), error=True)).SerializeToString()
        assert http_export(g.http.port, body) == 200
        assert t.value("storage_records", storage="tail_sampling", outcome="written") == 1
    finally:
        g.shutdown()


def test_only_the_traces_pipelines_exporters_need_a_durable_queue(tmp_path) -> None:
    durable = {"endpoint": "127.0.0.1:1", "sending_queue": {"storage": "file_storage"}}
    mimir = {"endpoint": "http://127.0.0.1:1"}
    pipelines = {"traces": {"receivers": ["otlp"], "processors": ["tail_sampling"], "exporters": ["otlp_grpc"]},
                 "metrics": {"receivers": ["otlp"], "exporters": ["otlphttp/mimir"]}}
    common = {"extensions": {"file_storage": {"directory": str(tmp_path)}},
              "processors": {"llm_metrics": None, "tail_sampling": {"storage": "file_storage"}}}
    cfg = loopback_config(exporters={"otlp_grpc": durable, "otlphttp/mimir": mimir},
                          service={"pipelines": pipelines}, **common)
    assert [e.name for e in cfg.exporters] == ["otlp_grpc"] and cfg.storage.received is not None
    assert [e.name for e in cfg.signal_exporters] == ["otlphttp/mimir"]
    pipelines["traces"]["exporters"] = ["otlp_grpc", "otlphttp/mimir"]
    with pytest.raises(ConfigError, match="keep their queue in memory"):
        loopback_config(exporters={"otlp_grpc": durable, "otlphttp/mimir": mimir},
                        service={"pipelines": pipelines}, **common)


# -- a real gateway, killed --------------------------------------------------------------------------

class _Sink:
    """An OTLP/HTTP backend on loopback: answers 503 while ``down`` (the exporter retries and its queue
    grows), records every span it accepts."""

    def __init__(self) -> None:
        self.down = True
        self.spans: list[tuple[bytes, bytes]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if sink.down:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        sink.spans.extend((s.trace_id, s.span_id) for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _start(config: str) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen([sys.executable, "-m", "otel_llm_collector.cli", "--config", config],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = [""]
    reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(120)
    m = re.search(r"OTLP/HTTP http://127\.0\.0\.1:(\d+).*Prometheus http://127\.0\.0\.1:(\d+)", line[0])
    if m is None:
        proc.kill()
        raise AssertionError(f"the gateway did not start: {line[0]!r}")
    threading.Thread(target=lambda: proc.stdout.read(), daemon=True).start()  # type: ignore[union-attr]
    return proc, int(m.group(1)), int(m.group(2))


def _counter(port: int, name: str, **labels: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f"otelcol_llm_{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigkill_loses_nothing_acknowledged_that_a_policy_keeps(tmp_path) -> None:
    sink = _Sink()
    state = tmp_path / "state"
    config = tmp_path / "gateway.yaml"
    config.write_text(f"""
extensions:
  file_storage: {{directory: "{state}", create_directory: true}}
receivers:
  otlp: {{protocols: {{grpc: null, http: {{endpoint: "127.0.0.1:0"}}}}}}
processors:
  tail_sampling:
    storage: file_storage
    decision_wait: 5s
    decision_wait_after_root_received: 500ms
    policies: [{{name: errors, type: error}}]
exporters:
  prometheus: {{endpoint: "127.0.0.1:0"}}
  otlphttp:
    endpoint: "http://127.0.0.1:{sink.port}"
    retry_on_failure: {{initial_interval: 50ms, max_interval: 200ms, max_elapsed_time: 10m}}
    sending_queue: {{storage: file_storage}}
""")
    proc, port, _ = _start(str(config))
    acked: list[tuple[int, bool]] = []  # (trace, kept by the policy) of every export answered 200
    stop = threading.Event()

    def client() -> None:
        for trace in range(1, 2001):  # bounded: at most 2,000 exports, stopped by the kill long before
            if stop.is_set():
                return
            error = trace % 2 == 0
            body = export_request(span(trace, 1, attrs=request_attrs(), error=error)).SerializeToString()
            if http_export(port, body, timeout=5) == 200:
                acked.append((trace, error))
            time.sleep(0.01)

    exporter = threading.Thread(target=client, daemon=True)
    exporter.start()
    try:
        # mid-run: some traces decided and waiting in the exporter's queue (the sink is down), the newest
        # ones still undecided in the write-ahead log
        assert wait_for(lambda: len(acked) >= 60, timeout=120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        stop.set()
        exporter.join(30)
        wal = state / "tail_sampling"
        with open(_last_segment(str(wal)), "ab") as f:  # and a torn last record, as a crash mid-write leaves
            f.write(TORN)
        kept = {t for t, error in acked if error}
        assert len(kept) >= 30

        sink.down = False
        proc, port, prom = _start(str(config))
        want = {t.to_bytes(16, "big") for t in kept}
        assert wait_for(lambda: want <= {tid for tid, _ in sink.spans}, timeout=120), \
            f"{len(want - {tid for tid, _ in sink.spans})} of {len(want)} kept traces did not arrive"
        assert _counter(prom, "storage_records_total", storage="tail_sampling", outcome="torn") == 1
        from_log = _counter(prom, "storage_records_total", storage="tail_sampling", outcome="replayed")
        from_queue = _counter(prom, "storage_records_total", storage="exporter/otlphttp", outcome="replayed")
        assert from_log > 0 and from_queue > 0  # both were holding something at the kill
        replayed = from_log + from_queue
        delivered = [tid for tid, _ in sink.spans]
        duplicates = len(delivered) - len(set(delivered))
        assert duplicates <= replayed  # at least once: every duplicate comes from a replayed record
        not_kept = {t.to_bytes(16, "big") for t, error in acked if not error}
        assert not (not_kept & set(delivered))  # the policy still decides
        print(f"kept {len(kept)} of {len(acked)} acknowledged; delivered {len(set(delivered))} traces, "
              f"{duplicates} duplicate spans, {replayed:.0f} records replayed")
    finally:
        stop.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        sink.close()
