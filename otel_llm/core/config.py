"""Resolved configuration: explicit arguments win over ``OTEL_LLM_*`` variables, which win over defaults.

Every option is one row of ``OPTIONS`` (argument name, variable, parser, default,
description): ``Config``'s field defaults are read from the rows, and the README's table is
generated from them (``python -m otel_llm.core.readme_tables``).
"""

from __future__ import annotations

import difflib
import enum
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from .. import semconv as sc
from .semconv_mode import genai_latest
from .slo import SLOTable
from .tenant import TenantSource

logger = logging.getLogger("otel_llm")


class Detail(enum.IntEnum):
    """How much of a kept request becomes spans."""

    REQUEST = 1  # the request span only
    PHASES = 2  # plus queue / prefill (and chunks) / decode, preemptions
    STEPS = 3  # plus one span per decode step

    @classmethod
    def parse(cls, value: "Detail | str | int") -> "Detail":
        if isinstance(value, Detail):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            raise ValueError(f"detail must be one of request, phases, steps; got {value!r}") from None


def _bool(raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    v = str(raw).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _rate(raw: str | float) -> float:
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a rate within [0, 1], got {raw!r}")
    return value


def _quantile(raw: str | float) -> float:
    value = float(raw)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"expected a quantile within [0, 1) (0 turns the policy off), got {raw!r}")
    return value


def _seconds(raw: str | float) -> float:
    value = float(raw)
    if not value >= 0.0:  # also refuses NaN
        raise ValueError(f"expected a duration in seconds >= 0, got {raw!r}")
    return value


def _positive_int(raw: str | int) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(f"expected a positive integer, got {raw!r}")
    return value


def _service_template(raw: str) -> str:
    value = str(raw).strip()
    if not value:
        raise ValueError("expected a service name, e.g. {service}-engine-steps")
    try:
        value.format(service="x")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"only {{service}} may be substituted in {raw!r}: {exc}") from None
    return value


def _nonnegative_float(raw: str | float) -> float:
    value = float(raw)
    if not value >= 0.0:  # also refuses nan
        raise ValueError(f"expected a number >= 0, got {raw!r}")
    return value


def _peak(raw: str | float) -> float:
    value = float(raw)
    if not value > 0.0 or value == float("inf"):
        raise ValueError(f"expected a positive number (e.g. 9.89e14), got {raw!r}")
    return value


AGENT_MODES = ("auto", "off")


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = str(raw).strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return value
    return parse


_agent = _one_of(AGENT_MODES)


_CAPTURE_MODES = {"SPAN_ONLY": True, "SPAN_AND_EVENT": True, "NO_CONTENT": False, "EVENT_ONLY": False}


def _genai_capture(raw: str, environ: Mapping[str, str]) -> bool:
    """The GenAI instrumentations' shared switch, read as they read it (``OTEL_SEMCONV_STABILITY_OPT_IN``):
    by default ``true``/``false``; under ``gen_ai_latest_experimental`` the content-capturing modes, of which
    only the ones that put content on spans turn our capture on (we emit no content events). A value of the
    other reading captures nothing, as with them; anything else is an error."""
    v = str(raw).strip().upper()
    latest = genai_latest(environ)
    if v in _CAPTURE_MODES:
        if not latest:
            logger.warning("otel-llm: %s=%s is a mode of %s=%s; without it no content is captured",
                           GENAI_CAPTURE_ENV, raw, sc.SEMCONV_OPT_IN_ENV, sc.GENAI_LATEST_EXPERIMENTAL)
        return latest and _CAPTURE_MODES[v]
    value = _bool(raw)
    if latest:
        logger.warning("otel-llm: under %s=%s, %s takes a mode (SPAN_ONLY, SPAN_AND_EVENT, NO_CONTENT, "
                       "EVENT_ONLY), not %r: no content is captured", sc.SEMCONV_OPT_IN_ENV,
                       sc.GENAI_LATEST_EXPERIMENTAL, GENAI_CAPTURE_ENV, raw)
    return value and not latest


GENAI_CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@dataclass(frozen=True)
class Option:
    name: str
    env: str
    parse: Callable[[Any], Any]
    default: Any
    doc: str
    # an ecosystem-wide variable read when ours is unset (ours wins: it is the more specific); its parser
    # also gets the environment (the ecosystem reads some variables by others, e.g. OTEL_SEMCONV_STABILITY_OPT_IN)
    shared_env: tuple[str, Callable[[Any, Mapping[str, str]], Any]] | None = None


OPTIONS: tuple[Option, ...] = (
    Option("slo", "OTEL_LLM_SLO", SLOTable.coerce, SLOTable(),
           'SLOs in seconds and a goodput target: `ttft=0.5,tpot=0.05,e2e=10,goodput=0.99`, per model `model-a: '
           'ttft=1; model-b: ttft=2`, per tenant `@team-a: tpot=0.03` (or `model-a@team-a:`; the most specific '
           'wins: model@tenant, tenant, model, default). `otel-llm alerts` turns it into burn-rate alerts'),
    Option("tenant", "OTEL_LLM_TENANT", TenantSource.parse, TenantSource(),
           "Where a request's tenant (`llm.request.tenant`: span attribute and metric label, cut to 64 characters "
           "of `[A-Za-z0-9._:@/+-]`, 64 tenants then `other`) comes from: `header:<name>` or `user` (the OpenAI "
           "`user` field; both Python `vllm serve` only), `lora` (the adapter's name) or `resource` (the resource "
           "attribute `llm.request.tenant`: single-tenant processes); the Rust frontend allows `lora` and "
           "`resource`"),
    Option("sample_rate", "OTEL_LLM_SAMPLE_RATE", _rate, 0.05,
           "Baseline share of unremarkable requests that get spans (by trace id, consistent across processes)"),
    Option("detail", "OTEL_LLM_DETAIL", Detail.parse, Detail.STEPS,
           "Detail for requests kept for a cause (SLO breach, error, abort, slow): `request`, `phases`, `steps`"),
    Option("baseline_detail", "OTEL_LLM_BASELINE_DETAIL", Detail.parse, Detail.PHASES,
           "Detail for requests kept by the baseline rate"),
    Option("tail_quantile", "OTEL_LLM_TAIL_QUANTILE", _quantile, 0.99,
           "Keep requests slower (end-to-end) than this running quantile of their model; 0 turns it off"),
    Option("capture_content", "OTEL_LLM_CAPTURE_CONTENT", _bool, False,
           "Record prompts and completions on spans (sensitive: off by default); when unset, "
           f"`{GENAI_CAPTURE_ENV}` as the GenAI instrumentations read it: `true`, or with "
           f"`{sc.SEMCONV_OPT_IN_ENV}={sc.GENAI_LATEST_EXPERIMENTAL}` `SPAN_ONLY` or `SPAN_AND_EVENT`",
           shared_env=(GENAI_CAPTURE_ENV, _genai_capture)),
    Option("engine_steps", "OTEL_LLM_ENGINE_STEPS", _bool, True,
           "Record engine steps (batch composition) and emit `llm.engine.step` spans for kept requests"),
    Option("max_steps", "OTEL_LLM_MAX_STEPS", _positive_int, 8192,
           "Engine-step records held while their requests run (oldest are settled early past this); also the "
           "recent steps each engine keeps, compactly, for the slow-cause verdict"),
    Option("agent", "OTEL_LLM_AGENT", _agent, "auto",
           "Where a vLLM frontend's telemetry work runs: `auto` (an agent process it starts, when the engine is "
           "spawned, token times come from steps and the providers are OTLP as `OTEL_*` configures them: the "
           "frontend then only hands over each request's start and finish) or `off` (the frontend's own "
           "background thread). See docs/design/off-process.md"),
    Option("max_spans_per_request", "OTEL_LLM_MAX_SPANS_PER_REQUEST", _positive_int, 1000,
           "Spans one kept request's trace may hold (request, phases, prefill chunks, decode steps and "
           "windows); also bounds the engine-step spans linked from it. See \"Decode detail and the span "
           "budget\""),
    Option("engine_step_service", "OTEL_LLM_ENGINE_STEP_SERVICE", _service_template, "{service}-engine-steps",
           "`service.name` of the engine-step traces' resource (`{service}`: the provider's), so trace lists "
           "and their latency figures hold requests only; `{service}` keeps them together"),
    Option("max_requests", "OTEL_LLM_MAX_REQUESTS", _positive_int, 65536,
           "In-flight request timelines held; past this new requests get metrics only"),
    Option("iteration_wait", "OTEL_LLM_ITERATION_WAIT", _seconds, 15.0,
           "TensorRT-LLM: how long a finished request's spans wait for the iteration stats of the iterations "
           "it ran in (they arrive when `get_stats` or trtllm-serve's `/metrics` pulls them), in seconds"),
    Option("direct_export", "OTEL_LLM_DIRECT_EXPORT", _bool, True,
           "Write our spans as OTLP bytes and send them with the provider's own OTLP exporters (~10x "
           "cheaper a span; only when every span processor is the SDK's batch/simple processor around an "
           "OTLP exporter, else spans go through the processors)"),
    Option("device", "OTEL_LLM_DEVICE", str, None,
           "Accelerator name for the roofline's peak table (`H100`, `A100 40GB`, `MI300X`...); default: "
           "the name NVML reports"),
    Option("peak_flops", "OTEL_LLM_PEAK_FLOPS", _peak, None,
           "Peak dense FLOP/s of one device, overriding the table (needed on CPU, and for FP8/FP32 serving)"),
    Option("peak_memory_bandwidth", "OTEL_LLM_PEAK_MEMORY_BANDWIDTH", _peak, None,
           "Peak memory bandwidth of one device in bytes/s, overriding the table (needed on CPU)"),
    Option("gpu_sample_hz", "OTEL_LLM_GPU_SAMPLE_HZ", _nonnegative_float, 10.0,
           "NVML samples per second for GPU telemetry (needs the `gpu` extra); 0 turns it off"),
)


# Config's field defaults, read from the rows above (one place to change a default)
_DEFAULTS: dict[str, Any] = {o.name: o.default for o in OPTIONS}


@dataclass(frozen=True)
class Config:
    """The resolved options. A field's default is its ``OPTIONS`` row's: declared once, there."""

    slo: SLOTable = _DEFAULTS["slo"]
    tenant: TenantSource = _DEFAULTS["tenant"]
    sample_rate: float = _DEFAULTS["sample_rate"]
    detail: Detail = _DEFAULTS["detail"]
    baseline_detail: Detail = _DEFAULTS["baseline_detail"]
    tail_quantile: float = _DEFAULTS["tail_quantile"]
    capture_content: bool = _DEFAULTS["capture_content"]
    engine_steps: bool = _DEFAULTS["engine_steps"]
    max_steps: int = _DEFAULTS["max_steps"]
    agent: str = _DEFAULTS["agent"]
    max_spans_per_request: int = _DEFAULTS["max_spans_per_request"]
    engine_step_service: str = _DEFAULTS["engine_step_service"]
    max_requests: int = _DEFAULTS["max_requests"]
    iteration_wait: float = _DEFAULTS["iteration_wait"]
    direct_export: bool = _DEFAULTS["direct_export"]
    device: str | None = _DEFAULTS["device"]
    peak_flops: float | None = _DEFAULTS["peak_flops"]
    peak_memory_bandwidth: float | None = _DEFAULTS["peak_memory_bandwidth"]
    gpu_sample_hz: float = _DEFAULTS["gpu_sample_hz"]

    @classmethod
    def resolve(cls, explicit: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> "Config":
        """Build from explicit arguments (``None`` means unset), then the environment, then defaults."""
        explicit = dict(explicit or {})
        env = os.environ if environ is None else environ
        _retire(explicit, env)
        unknown = set(explicit) - {o.name for o in OPTIONS}
        if unknown:
            raise TypeError(unknown_options(unknown))
        values: dict[str, Any] = {}
        for opt in OPTIONS:
            given = explicit.get(opt.name)
            if given is not None:
                values[opt.name] = opt.parse(given)
                continue
            values[opt.name] = opt.default
            shared = ((opt.shared_env[0], lambda raw, p=opt.shared_env[1]: p(raw, env)),) if opt.shared_env else ()
            for name, parse in ((opt.env, opt.parse), *shared):
                if env.get(name, "").strip():  # ours first, then the ecosystem's
                    try:
                        values[opt.name] = parse(env[name])
                    except (TypeError, ValueError) as exc:
                        raise ValueError(f"{name}: {exc}") from None
                    break
        return cls(**values)


@dataclass(frozen=True)
class Retired:
    """An option that no supported configuration needs any more, and what replaced it."""

    name: str
    env: str
    replaced_by: str


# Retired options (docs/changelog.md names each): set, they are ignored with a warning naming what replaced
# them (an old deployment keeps serving: what they asked for is what the one path does, or it is gone)
RETIRED: tuple[Retired, ...] = (
    Retired("step_reading", "OTEL_LLM_STEP_READING",
            "the engine-step records are read where the request telemetry is built (the agent process, or "
            "vLLM's output thread at a request's finish without one); deferred reading on a background thread "
            "is gone"),
    Retired("token_times", "OTEL_LLM_TOKEN_TIMES",
            "token times come from the engine-step records; the stamp per output batch is chosen by itself "
            "where the steps cannot give them (speculative decoding, KV connectors, engines without step records)"),
    Retired("one_path", "OTEL_LLM_ONE_PATH",
            "vLLM's EngineCore says every request's start and finish wherever an agent reads its steps, and the "
            "Python frontend enriches each request once; the frontend stays its requests' source elsewhere "
            "(speculative decoding, KV connectors, custom providers)"),
)


def _retire(explicit: dict[str, Any], env: Mapping[str, str]) -> None:
    """Drop retired options from ``explicit`` (in place), with a warning for each one set there or in ``env``
    (``resolve`` runs once an ``instrument()``)."""
    for r in RETIRED:
        given = explicit.pop(r.name, None)
        where = f"{r.name}={given!r}" if given is not None else (
            f"{r.env}={env[r.env]}" if env.get(r.env, "").strip() else None)
        if where is not None:
            logger.warning("otel-llm: %s is a retired option and is ignored: %s", where, r.replaced_by)


def unknown_options(names: Iterable[str]) -> str:
    """The error for option names that are not in ``OPTIONS``: each with the closest known one."""
    known = [o.name for o in OPTIONS]
    parts = []
    for name in sorted(names):
        close = difflib.get_close_matches(name, known, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown option(s) of otel-llm: {', '.join(parts)}; the options are: {', '.join(known)}"


def options_table() -> str:
    """The README's configuration table, from the same rows the code reads."""
    rows = ["| argument | variable | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        default = o.default.name.lower() if isinstance(o.default, Detail) else o.default
        if isinstance(default, (SLOTable, TenantSource)):
            default = "none"
        rows.append(f"| `{o.name}` | `{o.env}` | `{default}` | {o.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m otel_llm.core.config: the README's options table, regenerated
    print(options_table())
