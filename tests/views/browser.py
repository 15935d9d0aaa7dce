"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, on loopback only.

Opens one page, records console errors, uncaught exceptions, log errors and every network request,
evaluates expressions in the page and takes a screenshot. The flags keep Chromium off the network
(no component updates, sync, QUIC or background fetches) and in a throw-away profile.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0")


def chromium_binary() -> str | None:
    found = os.environ.get("CHROMIUM_BIN") or shutil.which("chromium") or shutil.which("chromium-browser")
    return found if found and os.access(found, os.X_OK) else None


@dataclass
class PageVisit:
    errors: list[str] = field(default_factory=list)  # console.error, uncaught exceptions, log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for


class Browser:
    def __init__(self, binary: str, timeout: float = 120.0) -> None:
        self._profile = tempfile.mkdtemp(prefix="otel-llm-chromium-")
        self._timeout = timeout
        self._proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._wait(lambda: (Path(self._profile) / "DevToolsActivePort").read_text().split()[0],
                          "Chromium's DevTools port")
        targets = self._wait(lambda: json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                                                      timeout=10)), "a page target")
        page = next(t for t in targets if t.get("type") == "page")
        self._connection = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
        self._ws = self._connection.__enter__()
        self._next = 0
        self._events: list[dict] = []

    def _wait(self, read, what: str) -> Any:
        """Poll the browser process until it is ready; the bound is for a hung browser, not a timing test."""
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited ({self._proc.returncode}) before {what}")
            try:
                value = read()
                if value:
                    return value
            except (OSError, ValueError, IndexError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"gave up waiting for {what}")

    def call(self, method: str, **params: Any) -> dict:
        self._next += 1
        ident = self._next
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv(timeout=self._timeout))
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._events.append(msg)

    def visit(self, url: str) -> PageVisit:
        """Load ``url`` and wait until its scripts have run (the page sets ``body[data-ready]``)."""
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable")
        self._events.clear()
        self.call("Emulation.setDeviceMetricsOverride", width=1440, height=900, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=url)
        self._wait(lambda: self.evaluate("document.readyState === 'complete' && "
                                         "document.body.getAttribute('data-ready') === '1'"), "the page to load")
        visit = PageVisit()
        for e in self._events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = p.get("exceptionDetails", {})
                visit.errors.append(f"{details.get('text', '')} {details.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                visit.errors.append(json.dumps(p.get("args", []))[:500])
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                visit.errors.append(p["entry"].get("text", "")[:500])
            elif method == "Network.requestWillBeSent":
                visit.requests.append(p.get("request", {}).get("url", ""))
        return visit

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        height = self.evaluate("Math.ceil(document.documentElement.scrollHeight)")
        self.call("Emulation.setDeviceMetricsOverride", width=1440, height=min(int(height), 4000),
                  deviceScaleFactor=1, mobile=False)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self._connection.__exit__(None, None, None)
        finally:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            shutil.rmtree(self._profile, ignore_errors=True)
