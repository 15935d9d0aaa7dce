"""Debian's Prometheus as a subprocess on loopback, scraping given targets every second, with its HTTP API.

``with Prometheus(directory, {"otel-llm-collector": gateway.prometheus_endpoint}) as prom: prom.api.query(...)``:
the configuration is written into ``directory`` (with the rule files given), the binary started on a free port,
and the context waits until the server answers ``/-/ready``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Sequence

from .server import free_port, wait_ready


def prometheus_binary() -> str | None:
    """``PROMETHEUS_BIN``, else ``prometheus`` on PATH, else Debian's ``/usr/bin/prometheus``; None when absent."""
    path = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"
    return path if os.path.exists(path) and os.access(path, os.X_OK) else None


class PromAPI:
    """Prometheus' HTTP API (``/api/v1``): a query that does not parse fails with Prometheus' reason."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: Any) -> Any:
        url = f"{self.base}/{path}?" + urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)["data"]
        except urllib.error.HTTPError as exc:
            if exc.code == 503:  # still starting (replaying its WAL): not an answer yet, pollers retry
                raise ConnectionError(f"Prometheus not ready: {exc}") from None
            raise AssertionError(f"{path} {params}: {exc.code} {exc.read().decode()[:300]}") from None

    def query(self, expr: str) -> list:
        return self.get("query", query=expr)["result"]


class Prometheus:
    """One Prometheus server: ``targets`` maps a job name to its ``host:port``; ``rule_files`` are loaded;
    ``flags`` go to the command line (e.g. ``--enable-feature=exemplar-storage``)."""

    def __init__(self, directory: Path, targets: Mapping[str, str], rule_files: Sequence[Path] = (),
                 flags: Sequence[str] = (), binary: str | None = None) -> None:
        found = binary or prometheus_binary()
        if found is None:
            raise RuntimeError("Prometheus not installed (Debian package `prometheus`, or set PROMETHEUS_BIN)")
        self.binary = found
        self.directory = Path(directory)
        self.config = self.directory / "prometheus.yml"
        jobs = "".join(f"""
  - job_name: {job}
    static_configs: [{{targets: ["{target}"]}}]""" for job, target in targets.items())
        rules = f"\nrule_files: [{', '.join(json.dumps(str(p)) for p in rule_files)}]" if rule_files else ""
        self.config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}{rules}
scrape_configs:{jobs}
""")
        self.flags = tuple(flags)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._api: PromAPI | None = None

    @property
    def api(self) -> PromAPI:
        assert self._api is not None, "Prometheus not started"
        return self._api

    def start(self, timeout: float = 120.0) -> "Prometheus":
        """Start it and wait until it is ready (the bound is for a hung server, not a speed)."""
        self.port = free_port()
        self.proc = subprocess.Popen([self.binary, f"--config.file={self.config}",
                                      f"--storage.tsdb.path={self.directory / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", *self.flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._api = PromAPI(self.port)
        if wait_ready(self.proc, f"http://127.0.0.1:{self.port}/-/ready", timeout,
                      lambda: f"prometheus exited with {self.proc.returncode} (config {self.config})"):
            return self
        self.stop()
        raise AssertionError(f"Prometheus not ready after {timeout:.0f} s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
