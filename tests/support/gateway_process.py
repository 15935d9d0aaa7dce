"""The real gateway (``python -m otel_llm_collector.cli``) as a subprocess on loopback, for tests that put it between
a traced process and an OTLP sink."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path


class GatewayProcess:
    """``with GatewayProcess(config_dir, sink.endpoint) as gw:`` export to ``gw.traces_endpoint``; every trace is kept
    (``always_sample``) and goes on to ``sink_endpoint`` over OTLP/HTTP."""

    def __init__(self, directory: Path, sink_endpoint: str, decision_wait: str = "5s") -> None:
        self.config = Path(directory) / "gateway.yaml"
        self.config.write_text(f"""
receivers:
  otlp: {{protocols: {{grpc: null, http: {{endpoint: "127.0.0.1:0"}}}}}}
processors:
  tail_sampling:
    decision_wait: {decision_wait}
    decision_wait_after_root_received: 500ms
    policies: [{{name: all, type: always_sample}}]
exporters:
  prometheus: {{endpoint: "127.0.0.1:0"}}
  otlphttp: {{endpoint: "{sink_endpoint}"}}
""")
        self.proc: subprocess.Popen | None = None
        self.http_port = self.prometheus_port = 0
        self.output: list[str] = []

    def __enter__(self) -> "GatewayProcess":
        self.proc = subprocess.Popen([sys.executable, "-m", "otel_llm_collector.cli", "--config", str(self.config)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started = threading.Event()
        pattern = re.compile(r"OTLP/HTTP http://127\.0\.0\.1:(\d+).*Prometheus http://127\.0\.0\.1:(\d+)")

        def read() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                self.output.append(line)
                m = pattern.search(line)
                if m is not None and not started.is_set():
                    self.http_port, self.prometheus_port = int(m.group(1)), int(m.group(2))
                    started.set()

        threading.Thread(target=read, daemon=True).start()
        if not started.wait(120):
            self.proc.kill()
            raise AssertionError(f"the gateway did not start: {''.join(self.output)!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()  # SIGTERM: the gateway decides what it holds and delivers it
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    @property
    def base_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def traces_endpoint(self) -> str:
        return f"{self.base_endpoint}/v1/traces"

    def export(self, body: bytes) -> int:
        """POST one encoded ``ExportTraceServiceRequest``; returns the HTTP status."""
        req = urllib.request.Request(self.traces_endpoint, data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status

    def counter(self, name: str) -> float:
        """A gateway's own counter (``otelcol_llm_<name>_total``), all labels added."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.prometheus_port}/metrics", timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f"otelcol_llm_{name}_total"))
