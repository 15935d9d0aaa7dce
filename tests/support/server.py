"""A real ``vllm serve`` (the tiny model, loopback) under ``opentelemetry-instrument``, for tests,
benchmarks and the client-server example.

The server is instrumented with zero code, as users would: ``opentelemetry-instrument``
loads our ``vllm`` entry point, and its spans go over OTLP/HTTP to ``otlp_endpoint`` (an
``OTLPSink`` in tests, a collector or Jaeger otherwise). Every request is kept at the
baseline detail (``OTEL_LLM_SAMPLE_RATE=1``) unless ``env`` says otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import pythonpath_env
from .engine import ENV, serve_command
from .tiny_model import ensure_tiny_model

# The tiny model's tokenizer has no chat template; chat endpoints need one.
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                 "{% endfor %}assistant:")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen, url: str, timeout: float, exited: Any) -> bool:
    """Poll ``url`` until it answers 200 (True) or ``timeout`` seconds pass (False; the caller stops ``proc``
    and says why); RuntimeError(``exited()``) if ``proc`` exits first. The bound is for a hung process, not a
    speed: the tests start servers on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(exited())
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


class VLLMServer:
    """``with VLLMServer(otlp_endpoint=sink.endpoint) as server: OpenAI(base_url=server.base_url)``."""

    def __init__(self, otlp_endpoint: str | None = None, port: int | None = None, env: dict[str, str] | None = None,
                 instrumented: bool = True, service_name: str = "vllm-server", extra_args: tuple[str, ...] = (),
                 cli: bool = False, **engine_overrides: Any) -> None:
        self.port = port or free_port()
        self.model = ensure_tiny_model()
        self._dir = tempfile.TemporaryDirectory(prefix="otel-llm-serve-")
        template = Path(self._dir.name) / "chat_template.jinja"
        template.write_text(CHAT_TEMPLATE)
        self.log_path = Path(self._dir.name) / "server.log"
        cmd = [sys.executable, *serve_command(self.port, cli=cli, **engine_overrides), "--chat-template", str(template),
               *extra_args]
        if instrumented:
            cmd = [str(Path(sys.executable).parent / "opentelemetry-instrument"), *cmd]
        self.command = cmd
        self.env = {**os.environ, **ENV, "VLLM_LOGGING_LEVEL": "WARNING", "OTEL_SERVICE_NAME": service_name,
                    "OTEL_LLM_SAMPLE_RATE": "1", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none",
                    "OTEL_BSP_SCHEDULE_DELAY": "200"}
        if otlp_endpoint:
            self.env.update({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
                             "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
        else:
            self.env["OTEL_TRACES_EXPORTER"] = "none"
        self.env.update(env or {})
        if cli:  # ``python -m support.vllm_cli``: the child must find the helpers too
            self.env = pythonpath_env(self.env)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 540.0) -> "VLLMServer":
        """Wait until the server answers ``/v1/models``. The bound is for a hung start, not a speed: on a loaded
        2-core machine ``--api-server-count 2`` took 350 s to come up (four processes importing vLLM), past the
        240 s this used to allow; 540 s keeps it under pytest's 600 s per test. A ``--headless`` engine serves
        no HTTP: it is started, not waited for (its head is ready once it has registered)."""
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # its own group: stop() ends the EngineCore too
        if "--headless" in self.command:
            return self
        if wait_ready(self.proc, f"{self.base_url}/models", timeout,
                      lambda: f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}"):
            return self
        self.stop()
        raise TimeoutError(f"vllm serve not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the group we started: server and EngineCore
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self._dir.cleanup()
