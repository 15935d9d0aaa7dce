"""A disaggregated-serving proxy: prefill on one vLLM instance, decode on another, one trace.

The reference proxy's behaviour (vLLM's ``disagg_proxy_demo.py``): each completion request goes
first to the prefill instance (P) with ``max_tokens=1`` -- P computes the prompt's KV cache and its
KV connector hands it over -- then, whole, to the decode instance (D), whose connector loads that
KV and which streams the answer back. ``kv_transfer_params`` that P returns (NIXL-style connectors)
go on to D; with ``ExampleConnector`` the two share a storage directory instead.

Traced: one ``router`` span (SERVER) per user request, under the caller's ``traceparent``; under it
one CLIENT span per hop (``prefill``, ``decode``), whose context goes to P and D in ``traceparent``, so
their request spans join the caller's trace. The router span says what the user waited for:
``llm.disagg.time_to_first_token`` is the time from the request's arrival here to the first byte of
D's answer sent on (the user's TTFT, as the proxy sees it). Spans go where the standard ``OTEL_*``
variables say (OTLP/HTTP; ``OTEL_TRACES_EXPORTER=none`` turns them off).

    python examples/disagg_proxy.py --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --port 8000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import httpx
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from otel_llm import semconv as sc

ROUTES = ("/v1/completions", "/v1/chat/completions")


def tracer_from_env() -> tuple[trace.Tracer, TracerProvider | None]:
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none":
        return trace.NoOpTracer(), None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create())  # service.name from OTEL_SERVICE_NAME
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider.get_tracer("otel_llm.disagg_proxy"), provider


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """P's request: the same prompt, one token, no stream (only its KV cache is wanted)."""
    p = dict(body)
    p["max_tokens"] = 1
    if "max_completion_tokens" in p:
        p["max_completion_tokens"] = 1
    p["stream"] = False
    p.pop("stream_options", None)
    p.setdefault("kv_transfer_params", {"do_remote_decode": True})
    return p


class DisaggProxy:
    def __init__(self, prefill: str, decode: str, tracer: trace.Tracer, timeout: float = 600.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.prefill_url, self.decode_url = prefill.rstrip("/"), decode.rstrip("/")
        self.tracer = tracer
        self.client = httpx.AsyncClient(timeout=timeout, transport=transport)

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            try:
                yield
            finally:
                await self.client.aclose()

        return Starlette(routes=[Route(path, self.handle, methods=["POST"]) for path in ROUTES], lifespan=lifespan)

    def _hop(self, role: str, base: str, parent: trace.Span) -> tuple[trace.Span, dict[str, str]]:
        host, port = _address(base)
        span = self.tracer.start_span(f"{role} {host}:{port}", kind=SpanKind.CLIENT,
                                      context=trace.set_span_in_context(parent),
                                      attributes={sc.DISAGG_HOP: role, sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port})
        headers = {"content-type": "application/json"}
        propagate.inject(headers, context=trace.set_span_in_context(span))
        return span, headers

    async def handle(self, request: Request) -> Response:
        arrived = time.monotonic()
        path = request.url.path
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise ValueError("the request body is not a JSON object")
        except ValueError as exc:
            return JSONResponse({"error": {"message": f"bad request body: {exc}", "type": "invalid_request_error"}},
                                status_code=400)
        router = self.tracer.start_span(f"router {path}", kind=SpanKind.SERVER,
                                        context=propagate.extract(dict(request.headers)),
                                        attributes={"http.request.method": "POST", "url.path": path,
                                                    sc.DISAGG_PREFILL: self.prefill_url,
                                                    sc.DISAGG_DECODE: self.decode_url})
        try:
            # 1. prefill on P: one token, and the KV hand-off parameters P answers with (if any)
            hop, headers = self._hop(sc.DISAGG_ROLE_PREFILL, self.prefill_url, router)
            try:
                p = await self.client.post(self.prefill_url + path, json=prefill_body(body), headers=headers)
                hop.set_attribute("http.response.status_code", p.status_code)
            finally:
                hop.end()
            if p.status_code != 200:
                router.set_status(Status(StatusCode.ERROR, f"prefill instance answered {p.status_code}"))
                router.end()
                return Response(p.content, status_code=p.status_code, media_type="application/json")
            params = p.json().get("kv_transfer_params")
            decode = dict(body)
            if params:
                decode["kv_transfer_params"] = params
            # 2. the whole request on D, streamed back as it comes
            hop, headers = self._hop(sc.DISAGG_ROLE_DECODE, self.decode_url, router)
            upstream = await self.client.send(
                self.client.build_request("POST", self.decode_url + path, json=decode, headers=headers), stream=True)
            hop.set_attribute("http.response.status_code", upstream.status_code)
        except BaseException as exc:
            router.record_exception(exc)
            router.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            router.end()
            raise
        return StreamingResponse(self._relay(upstream, router, hop, arrived), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    async def _relay(self, upstream: httpx.Response, router: trace.Span, hop: trace.Span,
                     arrived: float) -> AsyncIterator[bytes]:
        first = True
        try:
            async for chunk in upstream.aiter_bytes():  # decoded: the content-encoding is not passed on
                if first and chunk:
                    first = False
                    router.set_attribute(sc.DISAGG_TTFT, time.monotonic() - arrived)
                yield chunk
        finally:
            await upstream.aclose()
            hop.end()
            router.set_attribute(sc.DISAGG_E2E, time.monotonic() - arrived)
            if upstream.status_code != 200:
                router.set_status(Status(StatusCode.ERROR, f"decode instance answered {upstream.status_code}"))
            router.end()


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefill", required=True, help="the prefill instance's base URL (http://host:port)")
    p.add_argument("--decode", required=True, help="the decode instance's base URL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args()
    tracer, provider = tracer_from_env()
    try:
        uvicorn.run(DisaggProxy(args.prefill, args.decode, tracer).app(), host=args.host, port=args.port,
                    log_level="warning")
    finally:
        if provider is not None:
            provider.shutdown()


if __name__ == "__main__":
    main()
