"""otel-llm: OpenTelemetry tracing for LLM inference engines.

    import otel_llm
    otel_llm.instrument(slo="ttft=0.5,tpot=0.05")

``instrument`` detects the installed engines and clients and instruments each; every
option also reads from an ``OTEL_LLM_*`` variable (see ``otel_llm.core.config``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

from .core.config import Config, Detail
from .core.slo import SLO, SLOTable
from .version import __version__

__all__ = ["instrument", "uninstrument", "instrumented", "flush", "stats", "SLO", "SLOTable", "Detail", "Config", "__version__"]

# import package -> "module:Instrumentor"; checked in this order
_INSTRUMENTORS: dict[str, str] = {
    "vllm": "otel_llm.instrumentation.vllm:VLLMInstrumentor",
    "tensorrt_llm": "otel_llm.instrumentation.tensorrt_llm:TensorRTLLMInstrumentor",
    "openai": "otel_llm.instrumentation.openai:OpenAIInstrumentor",
}


def _available(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _instrumentor(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)()


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None, **options: Any) -> list[str]:
    """Instrument every supported engine and client that is installed; returns their names.

    ``options`` are the rows of ``otel_llm.core.config.OPTIONS`` (the README's options table is generated
    from them): ``slo``, ``sample_rate``, ``detail``, ``max_spans_per_request``, ``engine_step_service``...
    ``None`` means unset. An unknown name is a ``TypeError`` naming it and the closest option.

    Idempotent: a second call changes nothing (call ``uninstrument`` first to change options).
    Explicit arguments win over ``OTEL_LLM_*`` variables; with no providers given, the
    global ones are used, or providers built from the standard ``OTEL_*`` variables.
    """
    config = Config.resolve(options)
    done = []
    for package, path in _INSTRUMENTORS.items():
        if not _available(package):
            continue
        inst = _instrumentor(path)
        if not inst.is_instrumented_by_opentelemetry:
            inst.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider, config=config)
        if inst.is_instrumented_by_opentelemetry:
            done.append(package)
    return done


def uninstrument() -> None:
    """Remove every patch ``instrument`` made; safe to call when nothing is instrumented."""
    for package, path in _INSTRUMENTORS.items():
        if not _available(package):
            continue
        inst = _instrumentor(path)
        if inst.is_instrumented_by_opentelemetry:
            inst.uninstrument()


def instrumented() -> list[str]:
    return [p for p, path in _INSTRUMENTORS.items() if _available(p) and _instrumentor(path).is_instrumented_by_opentelemetry]


def flush(timeout: float = 10.0) -> bool:
    """Wait until the spans of every request finished so far were handed to the span processors.

    Spans are built on a background thread; call this before reading an in-memory exporter or
    before the process exits (uninstrument() and interpreter exit do it too). Spans we export
    directly (see docs/export.md, "Direct export") are sent by the time it returns; call your tracer
    provider's ``force_flush`` to push the others out of its processors.
    """
    done = True
    for package, path in _INSTRUMENTORS.items():
        if not _available(package):
            continue
        telemetry = getattr(_instrumentor(path), "telemetry", None)
        if telemetry is not None and hasattr(telemetry, "flush"):
            done = telemetry.flush(timeout) and done
    return done


class _Errors:
    """Errors counted elsewhere (an agent process), by site, summed with the guards' as a guard's are."""

    def __init__(self, errors: dict[str, int]) -> None:
        self.errors = errors


def stats() -> dict[str, Any]:
    """What happened to the telemetry so far, per instrumented engine, plus the errors we caught (every
    instrumentor's guard, summed by site).

    ``{"vllm": {"requests_finished": 120, "requests_kept": 9, "direct_spans_sent": 1032, ...},
    "errors": {"site": count}}``. The same numbers are observable counters named ``otel_llm.*``
    on the meter provider (see docs/export.md and docs/troubleshooting.md).
    """
    from .guard import total

    out: dict[str, Any] = {}
    guards = []  # each owner's: the instrumentors', and the vLLM plugin's in a process vLLM spawned
    for package, path in _INSTRUMENTORS.items():
        if not _available(package):
            continue
        inst = _instrumentor(path)
        guards.append(inst.guard)
        agent = getattr(inst, "agent", None)  # the vLLM instrumentor's agent process: the errors it caught
        if agent is not None:
            guards.append(_Errors(agent.agent_errors()))
        telemetry = getattr(inst, "telemetry", None)
        if telemetry is not None and hasattr(telemetry, "stats"):
            out[package] = telemetry.stats()
    plugin = sys.modules.get("otel_llm.instrumentation.vllm.plugin")  # imported only where vLLM loaded it
    side = plugin.engine_side() if plugin is not None else None
    if side is not None:
        guards.append(side.guard)
    out["errors"] = total(guards)
    return out
