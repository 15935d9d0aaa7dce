"""The telemetry modes the overhead benchmarks interleave on one engine, and switching between them.

    none       no telemetry (vLLM's per-request statistics on, as our instrumentation turns them on)
    default    otel_llm.instrument() defaults (tail decision + 5 % baseline at phase detail)
    full       every request kept at full detail (decode windows, engine-step spans)
    native     vLLM's own tracing, one span per request: what --otlp-traces-endpoint turns on (vLLM's global
               tracer provider, OutputProcessor.do_tracing), switched on for the same engine
    stamps     default with token_times="stamps": a stamp per output batch on vLLM's output thread (the
               default before token times came from the engine steps)
    deferred, full_deferred   default and full with step_reading="deferred"

One engine serves every mode (a second one's idle worker would steal CPU): it is built while instrumented
(statistics on, the EngineCore's step hooks armed), and each measurement then enters one mode.
"""

from __future__ import annotations

import os
from typing import Any, Callable

MODES: dict[str, Any] = {
    "none": None,
    "default": {},
    "full": {"sample_rate": 1.0, "baseline_detail": "steps"},
    "native": "native",
    "stamps": {"token_times": "stamps"},
    "deferred": {"step_reading": "deferred"},
    "full_deferred": {"sample_rate": 1.0, "baseline_detail": "steps", "step_reading": "deferred"},
}


class ModeSwitch:
    """``enter(mode)`` before a measurement, ``flush()`` inside it (the export is part of its CPU), ``leave()``
    after it. ``processors``: the engines' output processors (vLLM's tracing switch lives there)."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, sink: str) -> None:
        self.tp, self.mp, self.sink = tracer_provider, meter_provider, sink
        self.processors: list[Any] = []
        self.mode: str | None = None
        self.native_tp: Any = None

    def enter(self, mode: str) -> None:
        import otel_llm
        from otel_llm.instrumentation.vllm import VLLMInstrumentor

        self.leave()
        options = MODES[mode]
        if options == "native":
            if self.native_tp is None:
                from opentelemetry import trace
                from vllm.tracing import init_tracer

                os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"  # vLLM's exporter: gRPC else
                init_tracer("vllm.llm_engine", f"{self.sink}/v1/traces")
                self.native_tp = trace.get_tracer_provider()  # the one vLLM's init_tracer installed
            for processor in self.processors:
                processor.tracing_enabled = True
        elif options is not None:
            otel_llm.instrument(tracer_provider=self.tp, meter_provider=self.mp, **options)
            # the EngineCore's step records kept coming while nothing read them (the uninstrumented modes):
            # drop that backlog before the clock starts, or this measurement pays for other measurements' steps
            receiver = VLLMInstrumentor().step_receiver
            if receiver is not None:
                receiver.drain(lambda step: None)
        self.mode = mode

    def flush(self) -> None:
        import otel_llm

        options = MODES.get(self.mode)
        if options == "native":
            self.native_tp.force_flush()
        elif options is not None:
            otel_llm.flush()
            self.tp.force_flush()

    def leave(self) -> None:
        import otel_llm

        for processor in self.processors:
            processor.tracing_enabled = False
        if isinstance(MODES.get(self.mode), dict) or self.mode == "build":
            otel_llm.uninstrument()
        self.mode = None

    def start_build(self) -> None:
        """Instrumented with the defaults while the engine is built (the next ``enter`` or ``leave`` ends it)."""
        import otel_llm

        otel_llm.instrument(tracer_provider=self.tp, meter_provider=self.mp)
        self.mode = "build"

    def build(self, make: Callable[[], Any]) -> Any:
        """``make()`` (the engine) while instrumented with the defaults, then no mode."""
        self.start_build()
        try:
            return make()
        finally:
            self.leave()
