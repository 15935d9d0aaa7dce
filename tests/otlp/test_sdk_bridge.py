"""The fence around opentelemetry-sdk internals (otel_llm/otlp/sdk_bridge.py).

These run in the shared venv and, by tests/otlp/test_sdk_floor.py, in a venv with the oldest SDK that
direct export supports (``sdk_bridge.MIN_SDK``). A release that moves an internal fails here, by name,
instead of silently sending every span through the SDK's ~10x slower path.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter

from otel_llm.guard import Guard
from otel_llm.otlp import sdk_bridge
from otel_llm.otlp.routes import Router

ROOT = Path(__file__).resolve().parents[2]


def test_every_sdk_internal_the_bridge_reads_is_where_it_reads_it():
    from importlib.metadata import version

    problems = sdk_bridge.check()
    assert problems == [], (f"opentelemetry-sdk {version('opentelemetry-sdk')} moved what direct export reads "
                            f"(tested with {sdk_bridge.TESTED_WITH}): {problems}")


def test_a_moved_internal_fails_the_check_and_turns_direct_export_off_with_a_warning(monkeypatch, caplog):
    original = BatchSpanProcessor.__init__

    def without_inner(self, *args, **kwargs):  # a release that renamed BatchSpanProcessor._batch_processor
        original(self, *args, **kwargs)
        self._renamed, self._batch_processor = self._batch_processor, None
        del self._batch_processor

    monkeypatch.setattr(BatchSpanProcessor, "__init__", without_inner)
    monkeypatch.setattr(BatchSpanProcessor, "shutdown", lambda self: self._renamed.shutdown())
    monkeypatch.setattr(BatchSpanProcessor, "force_flush", lambda self, timeout_millis=None: True)
    problems = sdk_bridge.check()
    assert problems and "_batch_processor" in problems[0]

    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint="http://127.0.0.1:9/v1/traces")))
    tracer = tp.get_tracer("t")
    guard = Guard()  # an owner's (an instrumentor's): the warning is said once per owner
    with caplog.at_level(logging.WARNING, logger=sdk_bridge.__name__):
        assert sdk_bridge.senders_of(tracer, guard) is None
        assert sdk_bridge.senders_of(tracer, guard) is None
    warnings = [r for r in caplog.records if "direct export is off" in r.getMessage()]
    assert len(warnings) == 1 and "_batch_processor" in warnings[0].getMessage()  # once, naming it
    assert any("_batch_processor" in key for key in guard.told)
    assert Router(tracer, tracer, guard=guard).route.kind == "sdk"  # spans still go out, through the SDK
    tp.shutdown()


def test_the_route_is_wire_only_for_the_sdks_own_processors_around_otlp_exporters():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tp = TracerProvider()
    tracer = tp.get_tracer("t")
    router = Router(tracer, tracer)
    assert router.current().kind == "sdk"  # no processor yet: nothing to send with
    tp.add_span_processor(BatchSpanProcessor(HTTPExporter(endpoint="http://127.0.0.1:9/v1/traces")))
    assert router.current().kind == "wire"  # the provider is inspected again when its processors change
    tp.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert router.current().kind == "sdk"  # another exporter must see every span
    assert Router(tracer, tracer, direct_export=False).current().kind == "sdk"
    tp.shutdown()


def test_the_sdk_floor_is_declared_once_in_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {d.split(">=")[0]: d.split(">=")[1] for d in deps if d.startswith("opentelemetry-") and ">=" in d}
    for name in ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-http"):
        assert floors[name] == sdk_bridge.MIN_SDK, name
    assert sdk_bridge.MIN_SDK in sdk_bridge.TESTED_WITH


def test_any_other_tracer_takes_the_public_api():
    from opentelemetry import trace

    assert Router(trace.NoOpTracer(), trace.NoOpTracer()).current().kind == "api"
