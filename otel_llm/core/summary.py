"""The engine-agnostic outcome of one request: what metrics, SLO checks and sampling read.

Adapters build it from an engine's native numbers (``RequestSummary(...)``); the
collector rebuilds it from span attributes (``from_attributes``), for our spans and
for the single native ``llm_request`` spans that vLLM and TensorRT-LLM emit. One
derivation, used by both.
"""

from __future__ import annotations

import json
import math
from types import MappingProxyType
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from .. import semconv as sc
from .inter_token import GapSummary, from_counts
from .spec_decode import acceptance_length, acceptance_rate
from .tenant import clean as _tenant


@dataclass(slots=True)
class RequestSummary:
    model: str | None = None
    operation: str = "text_completion"
    provider: str | None = None
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    queue: float | None = None
    prefill: float | None = None
    decode: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    output_characters: int | None = None
    num_preemptions: int = 0
    prefix_cache_hit_tokens: int | None = None
    finish_reason: str | None = None
    error_type: str | None = None
    slow_cause: str | None = None  # the slow-cause verdict (llm.slow.cause), where one was made
    max_gap: float | None = None  # the longest gap between two steps that produced tokens (seconds)
    gaps: GapSummary | None = None  # the bucketed inter-token latencies (core/inter_token.py)
    # speculative decoding as the scheduler counted it (core/spec_decode.py); None: no drafts verified
    spec_verify_steps: int | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    lora: str | None = None  # the LoRA adapter's name (a metric label, bounded by the metrics layer)
    # cache-read input tokens by source, where the engine tells them apart (their sum: prefix_cache_hit_tokens)
    cache_read_local: int | None = None
    cache_read_external: int | None = None
    # disaggregated serving: which half of a user request this is (llm.disagg.role: prefill, decode, both), or
    # ``user`` for the user's request the collector joined from its two halves (core/disagg.py)
    disagg_role: str | None = None
    # SLO operations: the request's tenant (core/tenant.py, cleaned), its engine-step seconds and the prefill
    # interference seconds its work cost other requests (core/diagnosis/engine_time.py)
    tenant: str | None = None
    engine_time: float | None = None
    interference_caused: float | None = None

    @property
    def failed(self) -> bool:
        return self.error_type is not None

    @property
    def output_tokens_per_second(self) -> float | None:
        if self.output_tokens and self.e2e:
            return self.output_tokens / self.e2e
        return None

    @property
    def output_characters_per_second(self) -> float | None:
        if self.output_characters is not None and self.e2e:
            return self.output_characters / self.e2e
        return None

    @property
    def spec_acceptance_rate(self) -> float | None:
        return acceptance_rate(self.spec_draft_tokens, self.spec_accepted_tokens)

    @property
    def spec_acceptance_length(self) -> float | None:
        return acceptance_length(self.spec_verify_steps, self.spec_accepted_tokens)

    @staticmethod
    def mean_tpot(decode: float | None, output_tokens: int | None) -> float | None:
        """Mean time per output token after the first, as vLLM and the GenAI conventions define it."""
        if decode is None or not output_tokens or output_tokens < 2:
            return None
        return decode / (output_tokens - 1)

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any]) -> "RequestSummary | None":
        """Rebuild from a request span's attributes; ``None`` if it is not a request span we know."""
        if sc.LATENCY_E2E in attrs or sc.LATENCY_TTFT in attrs:
            return cls._from_ours(attrs)
        if sc.VLLM_TTFT in attrs or sc.VLLM_E2E in attrs:
            return cls._from_native(attrs)
        return None

    @classmethod
    def _from_ours(cls, a: Mapping[str, Any]) -> "RequestSummary":
        # One pass over the span's attributes through a key -> (field, converter) table, then a positional
        # construction: the collector runs this for every request span, and sixteen lookups plus a
        # keyword call cost twice as much. Same result as reading each key with ``a.get``.
        values: list[Any] = [None] * _N_FIELDS
        table = _OURS
        for key, raw in a.items():
            slot = table.get(key)
            if slot is not None:
                values[slot[0]] = slot[1](raw)
        return cls.from_slots(values)

    @classmethod
    def from_slots(cls, values: list[Any]) -> "RequestSummary":
        """A summary from its fields' values in declaration order (``ATTRIBUTE_SLOTS`` gives each attribute's
        position), absent ones ``None``: the defaults filled in as ``from_attributes`` fills them."""
        if values[_OPERATION] is None:
            values[_OPERATION] = "text_completion"
        if not values[_PREEMPTIONS]:
            values[_PREEMPTIONS] = 0
        counts = values[_GAPS]
        if counts is not None:  # the span's bucket counts -> the summary the histogram adds (or None: unusable)
            values[_GAPS] = from_counts(counts, values[_DECODE], values[_MAX_GAP])
        return cls(*values)

    @classmethod
    def _from_native(cls, a: Mapping[str, Any]) -> "RequestSummary":
        """vLLM's and TensorRT-LLM's ``llm_request`` span (deprecated usage names, no model name)."""
        output_tokens = _int(a.get(sc.VLLM_COMPLETION_TOKENS, a.get(sc.USAGE_OUTPUT_TOKENS)))
        decode = _latency(a.get(sc.VLLM_DECODE))
        ttft = _latency(a.get(sc.VLLM_TTFT))
        e2e = _latency(a.get(sc.VLLM_E2E))
        if decode is None and e2e is not None and ttft is not None:
            decode = max(0.0, e2e - ttft)  # TRT-LLM reports no decode time; this is the conventions' formula
        reasons = a.get(sc.RESPONSE_FINISH_REASONS)
        if isinstance(reasons, str) and reasons.startswith("["):
            reasons = _json_list(reasons)  # TRT-LLM writes json.dumps([reason]) (result.py do_tracing)
        return cls(
            model=_str(a.get(sc.VLLM_RESPONSE_MODEL, a.get(sc.REQUEST_MODEL))),
            provider=_str(a.get(sc.PROVIDER_NAME)),
            ttft=ttft,
            tpot=cls.mean_tpot(decode, output_tokens),
            e2e=e2e,
            queue=_latency(a.get(sc.VLLM_QUEUE)),
            prefill=_latency(a.get(sc.VLLM_PREFILL)),
            decode=decode,
            input_tokens=_int(a.get(sc.VLLM_PROMPT_TOKENS, a.get(sc.USAGE_INPUT_TOKENS))),
            output_tokens=output_tokens,
            finish_reason=_first(reasons),
        )


def native_provider_of(scope: str) -> str | None:
    """``gen_ai.provider.name`` of an engine's own ``llm_request`` span (which names none), by its
    tracer's instrumentation scope (a prefix; see ``semconv.NATIVE_SCOPE_PROVIDERS``)."""
    return next((provider for prefix, provider in sc.NATIVE_SCOPE_PROVIDERS if scope.startswith(prefix)), None)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _float(v: Any) -> float | None:
    t = type(v)
    if t is float:  # the common cases first: a type check is cheaper than two isinstance calls
        return v
    if t is int:
        return float(v)
    if t is bool or not isinstance(v, (int, float)):
        return None
    return float(v)


def _latency(v: Any) -> float | None:
    """A native span's latency: TRT-LLM writes -1 for one it could not compute (result.py do_tracing's
    ``metrics_dict.get(..., -1)``); a negative latency is "not reported", never a value."""
    f = _float(v)
    return f if f is not None and f >= 0 else None


def _json_list(v: str) -> Any:
    try:
        return json.loads(v)
    except ValueError:
        return v


def _int(v: Any) -> int | None:
    t = type(v)
    if t is int:
        return v
    if t is bool or not isinstance(v, (int, float)) or not math.isfinite(v):  # int() raises on NaN and inf
        return None
    return int(v)


_INT_ONLY = {int}  # (bool is not int here: type(True) is bool)
_MAX_COUNT = 2**32  # per bucket: more tokens than any request has; a client's huge number is refused


def _counts(v: Any) -> tuple[int, ...] | None:
    """``llm.latency.inter_token.bucket_counts``: non-negative integer counts (checked against the
    histogram's width by ``inter_token.from_counts``)."""
    if not isinstance(v, (list, tuple)) or not v or set(map(type, v)) != _INT_ONLY:  # checks in C, not per count
        return None
    return tuple(v) if min(v) >= 0 and max(v) < _MAX_COUNT else None


def _first(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], str):
        return v[0]
    return None


# How ``_from_ours`` converts a value read for a field, by kind (the kinds of ``ATTRIBUTE_SLOTS``).
CONVERTERS: dict[str, Callable[[Any], Any]] = {"str": _str, "float": _float, "int": _int, "first": _first,
                                               "counts": _counts, "tenant": _tenant}

# Our attribute names -> (position in RequestSummary's fields, converter kind), for ``_from_ours``.
_FIELDS = tuple(f.name for f in fields(RequestSummary))
_N_FIELDS = len(_FIELDS)
_OPERATION = _FIELDS.index("operation")
_PREEMPTIONS = _FIELDS.index("num_preemptions")
_GAPS = _FIELDS.index("gaps")
_DECODE = _FIELDS.index("decode")
_MAX_GAP = _FIELDS.index("max_gap")
_KINDS: dict[str, tuple[int, str]] = {
    key: (_FIELDS.index(name), kind) for key, name, kind in (
        (sc.REQUEST_MODEL, "model", "str"),
        (sc.OPERATION_NAME, "operation", "str"),
        (sc.PROVIDER_NAME, "provider", "str"),
        (sc.LATENCY_TTFT, "ttft", "float"),
        (sc.LATENCY_TPOT, "tpot", "float"),
        (sc.LATENCY_E2E, "e2e", "float"),
        (sc.LATENCY_QUEUE, "queue", "float"),
        (sc.LATENCY_PREFILL, "prefill", "float"),
        (sc.LATENCY_DECODE, "decode", "float"),
        (sc.USAGE_INPUT_TOKENS, "input_tokens", "int"),
        (sc.USAGE_OUTPUT_TOKENS, "output_tokens", "int"),
        (sc.OUTPUT_CHARACTERS, "output_characters", "int"),
        (sc.NUM_PREEMPTIONS, "num_preemptions", "int"),
        (sc.USAGE_CACHE_READ_INPUT_TOKENS, "prefix_cache_hit_tokens", "int"),
        (sc.RESPONSE_FINISH_REASONS, "finish_reason", "first"),
        (sc.ERROR_TYPE, "error_type", "str"),
        (sc.SLOW_CAUSE, "slow_cause", "str"),
        (sc.LATENCY_MAX_GAP, "max_gap", "float"),
        (sc.LATENCY_ITL_COUNTS, "gaps", "counts"),
        (sc.SPEC_VERIFY_STEPS, "spec_verify_steps", "int"),
        (sc.SPEC_DRAFT_TOKENS, "spec_draft_tokens", "int"),
        (sc.SPEC_ACCEPTED_TOKENS, "spec_accepted_tokens", "int"),
        (sc.LORA_NAME, "lora", "str"),
        (sc.CACHE_READ_LOCAL, "cache_read_local", "int"),
        (sc.CACHE_READ_EXTERNAL, "cache_read_external", "int"),
        (sc.DISAGG_ROLE, "disagg_role", "str"),
        (sc.REQUEST_TENANT, "tenant", "tenant"),
        (sc.REQUEST_ENGINE_TIME, "engine_time", "float"),
        (sc.REQUEST_INTERFERENCE_CAUSED, "interference_caused", "float"),
    )
}
# RequestSummary field -> our span attribute that carries it (the metric tables' ``HistogramSpec.attribute``)
ATTRIBUTE_OF_FIELD: dict[str, str] = {_FIELDS[i]: key for key, (i, _) in _KINDS.items()}
_OURS: dict[str, tuple[int, Callable[[Any], Any]]] = {key: (i, CONVERTERS[k]) for key, (i, k) in _KINDS.items()}
# Public: our attribute name -> (position in RequestSummary's fields, CONVERTERS kind). With ``CONVERTERS``
# and ``RequestSummary.from_slots`` it is the derivation ``from_attributes`` makes for our spans, for a
# reader that gets values another way (the collector reads them from still-encoded span attributes).
ATTRIBUTE_SLOTS: Mapping[str, tuple[int, str]] = MappingProxyType(_KINDS)
