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

    What keeps it from reading vLLM's time, or chance, as ours:

    * every call is timed (``every`` 1, the default; on the one path a request makes ~3 hooked calls, so the
      probe's own CPU is a few µs a request beside the ~2 ms of vLLM's frontend): a sample of one call in
      eight, drawn at random, counted eight times, moved the figure by a third between measurements with the
      count of the few costly calls it happened to draw. With ``every`` above 1 the sample is systematic per
      method (its every-th call), so each method's count is exact and only its per-call cost is sampled;
    * a garbage collection that starts inside a hook is not counted: the allocation that triggers one is
      anybody's, and its work is every young object's, most of them vLLM's (``gc_ns``: what was left out;
      the benchmarks report the collector's CPU on its own);
    * the probe's own clock reads inside the span it counts (~2 of its 4 reads, ~0.6 µs each on a 2-vCPU
      VM, a thread clock being a system call) are measured at ``install`` on an empty hook (``floor_ns``)
      and taken off each timed call.

    Installed before ``instrument()``; the wrappers an instrumentation builds are then the probed ones.
    Not counted: the engine's construction (once), and the few instructions of the coroutines
    ``async_add_request`` and the serving handlers return. ``by_method``: ns per hooked method."""

    METHODS = ("add_request", "async_add_request", "process_outputs", "finished", "engine_events", "abort_requests")
    DEFAULT_EVERY = 1

    def __init__(self, every: int = DEFAULT_EVERY) -> None:
        import threading

        self.ns = 0
        self.calls = 0
        self.timed = 0
        self.every = max(1, int(every))
        self.by_method: dict[str, int] = {}
        self.gc_ns = 0  # collections that started inside a timed hook, left out of ``ns``
        self.floor_ns = 0  # the probe's own CPU inside a timed call, taken off each (``calibrate``)
        self._gc: dict[int, int] = {}  # thread id -> CPU in collections on it (gc.callbacks)
        self._gc_started: dict[int, int] = {}
        self._ident = threading.get_ident

    def _gc_callback(self, phase: str, info: dict) -> None:
        tid = self._ident()
        if phase == "start":
            self._gc_started[tid] = time.thread_time_ns()
        else:
            started = self._gc_started.pop(tid, None)
            if started is not None:
                self._gc[tid] = self._gc.get(tid, 0) + time.thread_time_ns() - started

    def _timed(self, hook: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``hook(*lead, wrapped, instance, args, kwargs)`` (a wrapper method, ``lead`` its self; or a
        serving closure), counting its CPU less the wrapped call's (and less a collection inside it)."""
        clock = time.thread_time_ns
        probe = self
        every = self.every
        seen = 0
        gc_of = self._gc
        ident = self._ident
        self.by_method.setdefault(name, 0)

        def timed(*lead_and_call: Any) -> Any:
            nonlocal seen
            probe.calls += 1
            seen += 1
            if seen % every:
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
            tid = ident()
            g0 = gc_of.get(tid, 0)
            t0 = clock()
            try:
                return hook(*lead, call, instance, args, kwargs)
            finally:
                spent = clock() - t0 - inner
                collected = gc_of.get(tid, 0) - g0  # (a collection inside the wrapped call is in ``inner``)
                ours = max(0, spent - collected - probe.floor_ns) * every
                probe.ns += ours
                probe.by_method[name] += ours
                probe.gc_ns += collected * every
                probe.timed += 1
        return timed

    def calibrate(self, n: int = 4000) -> int:
        """``floor_ns``: the median CPU the probe counts for an empty hook around an empty call."""
        import gc

        def empty(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            return wrapped(*args, **kwargs)

        def nothing() -> None:
            return None

        every, self.every, self.floor_ns = self.every, 1, 0
        saved = self.ns, self.calls, self.timed, self.gc_ns, dict(self.by_method)
        timed = self._timed(empty, "_calibration")
        samples = []
        gc.disable()
        try:
            for _ in range(n):
                before = self.ns
                timed(nothing, None, (), {})
                samples.append(self.ns - before)
        finally:
            gc.enable()
        self.ns, self.calls, self.timed, self.gc_ns, self.by_method = saved
        self.every = every
        self.floor_ns = int(sorted(samples)[n // 2])
        return self.floor_ns

    def install(self) -> None:
        import gc

        from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers

        gc.callbacks.append(self._gc_callback)
        self.calibrate()
        for name in self.METHODS:
            setattr(VLLMWrappers, name, self._timed(getattr(VLLMWrappers, name), name))
        serving, probe = VLLMWrappers.serving, self

        def timed_serving(self_: Any, operation: str) -> Callable[..., Any]:
            return probe._timed(serving(self_, operation), f"serving.{operation}")
        VLLMWrappers.serving = timed_serving
