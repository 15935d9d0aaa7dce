"""``vllm serve``'s API server with a control socket that switches the telemetry mode between measurements.

Started by ``benchmarks/frontend_cpu.py``; not a user tool. The server is instrumented before its
engine is built (so vLLM's statistics are on and the EngineCore's step hooks are armed, as under
``opentelemetry-instrument``), then each measurement asks for one mode (``telemetry_modes.MODES``) over a
Unix socket named in ``FRONTEND_CPU_CONTROL``, one JSON object a line:

    {"mode": NAME}    -> {"ok": true, "pid": ..., "mode": NAME}
    {"stats": true}   -> our telemetry's stats() (steps received, spans sent), or {} when not instrumented
    {"flush": true}   -> the measurement's spans sent (their export is part of its CPU)
    {"threads": true} -> {"ours": native ids of the telemetry threads (ours, the SDK's exporters')}
    {"hooks": true}   -> {"ns": our hooks' CPU on vLLM's threads so far, "calls": ...} (telemetry_modes.HookProbe)

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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from telemetry_modes import MODES, HookProbe, ModeSwitch  # noqa: E402
from vllm_overhead import providers  # noqa: E402


def capture_processors(switch: ModeSwitch) -> None:
    """Each AsyncLLM's output processor, once built (vLLM's tracing switch lives there)."""
    import wrapt

    def init(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        switch.processors.append(instance.output_processor)
        return result

    wrapt.register_post_import_hook(
        lambda module: wrapt.wrap_function_wrapper(module, "AsyncLLM.__init__", init), "vllm.v1.engine.async_llm")


def stats(switch: ModeSwitch) -> dict:
    from otel_llm.instrumentation.vllm import VLLMInstrumentor

    telemetry = VLLMInstrumentor().telemetry
    return dict(telemetry.stats()) if telemetry is not None and isinstance(MODES.get(switch.mode), dict) else {}


def serve_control(switch: ModeSwitch, path: str, hooks: HookProbe) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer(cmd: dict) -> dict:
        if "mode" in cmd:
            switch.enter(cmd["mode"])
            return {"ok": True, "pid": os.getpid(), "mode": cmd["mode"]}
        if "stats" in cmd:
            return stats(switch)
        if "threads" in cmd:  # our telemetry threads (and the SDK's exporters'), by native id
            return {"ours": [t.native_id for t in threading.enumerate() if t.native_id is not None
                             and (t.name.startswith("otel-llm") or t.name.startswith("Otel"))]}
        if "hooks" in cmd:  # our hooks' CPU on vLLM's threads so far (telemetry_modes.HookProbe)
            return {"ns": hooks.ns, "calls": hooks.calls}
        if "flush" in cmd:
            switch.flush()
            return {"ok": True}
        return {"error": f"unknown command {cmd!r}"}

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn, conn.makefile("rw") as f:
                for line in f:
                    try:
                        reply = answer(json.loads(line))
                    except Exception as exc:  # the benchmark shows it; the server keeps serving
                        reply = {"error": repr(exc)}
                    f.write(json.dumps(reply) + "\n")
                    f.flush()

    threading.Thread(target=loop, name="mode-switch", daemon=True).start()


def main() -> None:
    args = sys.argv[1:]
    sink = args[args.index("--sink") + 1]
    hooks = HookProbe()
    hooks.install()  # before the instrumentation: its wrappers are the probed ones
    switch = ModeSwitch(*providers(sink), sink)
    capture_processors(switch)
    switch.start_build()
    serve_control(switch, os.environ["FRONTEND_CPU_CONTROL"], hooks)
    sys.argv = ["vllm.entrypoints.openai.api_server", *args[args.index("--") + 1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
