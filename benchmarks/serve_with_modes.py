"""``vllm serve``'s API server with a control socket that switches the telemetry mode between measurements.

Started by ``benchmarks/frontend_cpu.py``; not a user tool. The server is instrumented before its
engine is built (so vLLM's statistics are on and the EngineCore's step hooks are armed, as under
``opentelemetry-instrument``), then each measurement asks for one mode over a Unix socket named in
``FRONTEND_CPU_CONTROL``:

    {"mode": "none" | "default" | "full" | "native" | <any name in MODES>}  -> {"ok": true, "pid": ...}
    {"stats": true}   -> our telemetry's stats() (steps received, spans sent) or {}
    {"flush": true}   -> spans of the measurement sent (the export is part of its CPU)

Modes change only while no request is in flight (the benchmark waits for its clients first).

Run: python benchmarks/serve_with_modes.py --sink URL -- <api_server arguments>
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# the telemetry options of each mode (None: not instrumented; "native": vLLM's own tracing)
MODES: dict[str, Any] = {
    "none": None,
    "default": {},
    "full": {"sample_rate": 1.0, "baseline_detail": "steps"},
    "native": "native",
    "deferred": {"step_reading": "deferred"},
    "full_deferred": {"sample_rate": 1.0, "baseline_detail": "steps", "step_reading": "deferred"},
}


class ModeSwitch:
    def __init__(self, sink: str) -> None:
        sys.path.insert(0, str(HERE))
        from vllm_overhead import providers

        self.sink = sink
        self.tp, self.mp = providers(sink)
        self.engines: list[Any] = []
        self.mode = "none"
        self.native_tp: Any = None

    def capture_engines(self) -> None:
        import wrapt

        def init(wrapped, instance, args, kwargs):
            result = wrapped(*args, **kwargs)
            self.engines.append(instance)
            return result

        wrapt.register_post_import_hook(
            lambda module: wrapt.wrap_function_wrapper(module, "AsyncLLM.__init__", init), "vllm.v1.engine.async_llm")

    def instrument_for_build(self) -> None:
        import otel_llm

        otel_llm.instrument(tracer_provider=self.tp, meter_provider=self.mp)
        self.mode = "build"

    def set(self, mode: str) -> dict:
        import otel_llm
        from otel_llm.instrumentation.vllm import VLLMInstrumentor

        options = MODES[mode]
        if self.mode not in ("none", "native"):
            otel_llm.uninstrument()
        for engine in self.engines:
            engine.output_processor.tracing_enabled = False
        if options == "native":
            if self.native_tp is None:
                from opentelemetry import trace
                from vllm.tracing import init_tracer

                os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
                init_tracer("vllm.llm_engine", f"{self.sink}/v1/traces")
                self.native_tp = trace.get_tracer_provider()
            for engine in self.engines:
                engine.output_processor.tracing_enabled = True
        elif options is not None:
            otel_llm.instrument(tracer_provider=self.tp, meter_provider=self.mp, **options)
            receiver = VLLMInstrumentor().step_receiver
            if receiver is not None:  # the steps of measurements nothing read: not this one's cost
                receiver.drain(lambda step: None)
        self.mode = mode
        return {"ok": True, "pid": os.getpid(), "mode": mode}

    def stats(self) -> dict:
        from otel_llm.instrumentation.vllm import VLLMInstrumentor

        telemetry = VLLMInstrumentor().telemetry
        return dict(telemetry.stats()) if telemetry is not None and self.mode not in ("none", "native") else {}

    def flush(self) -> dict:
        import otel_llm

        if MODES.get(self.mode) == "native" and self.native_tp is not None:
            self.native_tp.force_flush()
        elif self.mode not in ("none", "native"):
            otel_llm.flush()
            self.tp.force_flush()
        return {"ok": True}

    def serve(self, path: str) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)

        def loop() -> None:
            while True:
                conn, _ = server.accept()
                with conn, conn.makefile("rw") as f:
                    for line in f:
                        try:
                            cmd = json.loads(line)
                            if "mode" in cmd:
                                reply = self.set(cmd["mode"])
                            elif "stats" in cmd:
                                reply = self.stats()
                            elif "flush" in cmd:
                                reply = self.flush()
                            else:
                                reply = {"error": f"unknown command {cmd!r}"}
                        except Exception as exc:  # the benchmark shows it; the server keeps serving
                            reply = {"error": repr(exc)}
                        f.write(json.dumps(reply) + "\n")
                        f.flush()

        threading.Thread(target=loop, name="mode-switch", daemon=True).start()


def main() -> None:
    args = sys.argv[1:]
    sink = args[args.index("--sink") + 1]
    server_args = args[args.index("--") + 1:]
    switch = ModeSwitch(sink)
    switch.capture_engines()
    switch.instrument_for_build()
    switch.serve(os.environ["FRONTEND_CPU_CONTROL"])
    sys.argv = ["vllm.entrypoints.openai.api_server", *server_args]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
