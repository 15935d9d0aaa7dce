"""The telemetry modes the overhead benchmarks interleave on one engine, and switching between them.

    none       no telemetry (vLLM's per-request statistics on, as our instrumentation turns them on)
    default    otel_llm.instrument() defaults (tail decision + 5 % baseline at phase detail)
    full       every request kept at full detail (decode windows, engine-step spans)
    native     vLLM's own tracing, one span per request: what --otlp-traces-endpoint turns on (vLLM's global
               tracer provider, OutputProcessor.do_tracing), switched on for the same engine

One engine serves every mode (a second one's idle worker would steal CPU): it is built while instrumented
(statistics on, the EngineCore's step hooks armed), and each measurement then enters one mode.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

MODES: dict[str, Any] = {
    "none": None,
    "default": {},
    "full": {"sample_rate": 1.0, "baseline_detail": "steps"},
    "native": "native",
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
            inst = VLLMInstrumentor()
            # (the per-process runtime holds the receiver; an older tree under benchmarks/ab.py: the instrumentor)
            receiver = getattr(getattr(inst, "runtime", inst), "step_receiver", None)
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


class HookProbe:
    """Our hooks' own CPU on vLLM's threads, within each measurement: the thread CPU time inside each of the
    vLLM adapter's wrappers (wrappers.VLLMWrappers) less the time inside the vLLM function it wraps.

    Where an agent process does the telemetry's work this is everything our code does in vLLM's frontend
    but what our threads do (the SDK's idle exporters), so it is the steadier, paired figure: our CPU over
    the rest of the frontend's in the same measurement.

    Sampled: one hooked call in ``every``, drawn at random, is timed and counts ``every`` times (``ns`` is
    the estimate; ``timed`` the calls timed). The thread clock is a system call (~0.8 µs on the 2-vCPU VM),
    four a timed call, and timing every call put ~30 µs a request of the probe's own CPU, and its system
    calls' disturbance, into the whole-process figure it sits beside; sampled, an eighth of it. Its own
    clock reads are partly inside what it counts: an upper bound. Installed before ``instrument()``; the
    wrappers an instrumentation builds are then the probed ones. Not counted: the engine's construction
    (once), and the few instructions of the coroutines ``async_add_request`` and the serving handlers
    return."""

    METHODS = ("add_request", "async_add_request", "process_outputs", "finished", "engine_events", "abort_requests")
    DEFAULT_EVERY = 8

    def __init__(self, every: int = DEFAULT_EVERY, seed: int = 0) -> None:
        import random

        self.ns = 0
        self.calls = 0
        self.timed = 0
        self.every = every
        self._draw = random.Random(seed).random

    def _timed(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """``hook(*lead, wrapped, instance, args, kwargs)`` (a wrapper method, ``lead`` its self; or a
        serving closure), counting its CPU less the wrapped call's, for one call in ``every``."""
        clock = time.thread_time_ns
        probe = self
        p = 1.0 / self.every
        draw = self._draw

        def timed(*lead_and_call: Any) -> Any:
            probe.calls += 1
            if draw() >= p:
                return hook(*lead_and_call)
            *lead, wrapped, instance, args, kwargs = lead_and_call
            inner = 0

            def call(*a: Any, **k: Any) -> Any:
                nonlocal inner
                s = clock()
                try:
                    return wrapped(*a, **k)
                finally:
                    inner += clock() - s

            call.__func__ = getattr(wrapped, "__func__", wrapped)  # the wrappers' argument binders key on it
            t0 = clock()
            try:
                return hook(*lead, call, instance, args, kwargs)
            finally:
                probe.ns += (clock() - t0 - inner) * probe.every
                probe.timed += 1
        return timed

    def install(self) -> None:
        from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers

        for name in self.METHODS:
            setattr(VLLMWrappers, name, self._timed(getattr(VLLMWrappers, name)))
        serving, probe = VLLMWrappers.serving, self

        def timed_serving(self_: Any, operation: str) -> Callable[..., Any]:
            return probe._timed(serving(self_, operation))
        VLLMWrappers.serving = timed_serving
