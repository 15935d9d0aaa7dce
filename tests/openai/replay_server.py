"""Replay published OpenAI exchanges over a real loopback socket, and record what the client sent.

Each recording (``tests/openai/recordings/*.json``, see the README there) is one response: a JSON body
with its status, or a server-sent-event stream, optionally dropped mid-body (``cut_after``: the
connection closes after that many events without ending the chunked body, as a network failure does).
The server listens on 127.0.0.1 only; the recording is chosen by the URL's path prefix
(``/rec/{name}/v1/...``), so the client's request itself is untouched by the choice. Every request
received is kept as ``Received`` (method, path, the header list in wire order, the body bytes).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RECORDINGS = Path(__file__).resolve().parent / "recordings"


@dataclass(frozen=True)
class Recording:
    name: str
    api: str  # chat | responses | embeddings
    request: dict[str, Any]
    status: int
    json: Any = None
    sse: str | None = None
    cut_after: int | None = None
    source: dict[str, Any] = field(default_factory=dict)
    provenance: str = ""

    @property
    def stream(self) -> bool:
        return self.sse is not None

    def events(self) -> list[str]:
        """The SSE events as sent, one string per event (``data: ...`` lines, ``event:`` lines)."""
        assert self.sse is not None
        return [e for e in self.sse.split("\n\n") if e.strip()]

    def payloads(self) -> list[dict[str, Any]]:
        """The JSON payloads of the events the client receives (before ``[DONE]`` and any cut)."""
        out = []
        for event in self.events()[:self.cut_after]:
            data = "".join(line[len("data: "):] for line in event.split("\n") if line.startswith("data: "))
            if data.startswith("[DONE]"):
                break
            out.append(json.loads(data))
        return out


def load(name: str) -> Recording:
    raw = json.loads((RECORDINGS / f"{name}.json").read_text())
    return Recording(**{k: raw[k] for k in raw if k in Recording.__dataclass_fields__})


def all_names() -> list[str]:
    return sorted(p.stem for p in RECORDINGS.glob("*.json"))


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]  # in wire order, names as sent
    body: bytes


class ReplayServer:
    """``with ReplayServer() as s: OpenAI(base_url=s.base_url("chat_text"), ...)``."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with server._lock:
                    server.received.append(Received("POST", self.path, tuple(self.headers.items()), body))
                parts = self.path.split("/")
                if len(parts) < 3 or parts[1] != "rec":
                    self.send_error(404)
                    return
                rec = load(parts[2])
                if rec.stream:
                    self._stream(rec)
                else:
                    self._json(rec)

            def _json(self, rec: Recording) -> None:
                data = json.dumps(rec.json).encode()
                self.send_response(rec.status)
                self.send_header("content-type", "application/json")
                self.send_header("x-request-id", f"req_{rec.name}")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, rec: Recording) -> None:
                self.send_response(rec.status)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("x-request-id", f"req_{rec.name}")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    for i, event in enumerate(rec.events()):
                        if rec.cut_after is not None and i == rec.cut_after:
                            self.wfile.flush()
                            self.close_connection = True
                            self.connection.shutdown(2)  # mid-body: no terminating chunk
                            return
                        chunk = (event + "\n\n").encode()
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except ConnectionError:  # the client walked away (an abandoned or closed stream)
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                import sys
                if isinstance(sys.exc_info()[1], ConnectionError):
                    return  # a client that closed its stream early, while the handler finished up
                super().handle_error(request, client_address)

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def base_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/rec/{name}/v1"

    def take(self) -> list[Received]:
        with self._lock:
            got, self.received = self.received, []
        return got

    def __enter__(self) -> "ReplayServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
