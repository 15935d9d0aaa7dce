"""The engine-agnostic outcome of one request: what metrics, SLO checks and sampling read.

Adapters build it from an engine's native numbers (``RequestSummary(...)``); the
collector rebuilds it from span attributes (``from_attributes``), for our spans and
for the single native ``llm_request`` spans that vLLM and TensorRT-LLM emit. One
derivation, used by both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import semconv as sc


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
        reasons = a.get(sc.RESPONSE_FINISH_REASONS)
        return cls(
            model=_str(a.get(sc.REQUEST_MODEL)),
            operation=_str(a.get(sc.OPERATION_NAME)) or "text_completion",
            provider=_str(a.get(sc.PROVIDER_NAME)),
            ttft=_float(a.get(sc.LATENCY_TTFT)),
            tpot=_float(a.get(sc.LATENCY_TPOT)),
            e2e=_float(a.get(sc.LATENCY_E2E)),
            queue=_float(a.get(sc.LATENCY_QUEUE)),
            prefill=_float(a.get(sc.LATENCY_PREFILL)),
            decode=_float(a.get(sc.LATENCY_DECODE)),
            input_tokens=_int(a.get(sc.USAGE_INPUT_TOKENS)),
            output_tokens=_int(a.get(sc.USAGE_OUTPUT_TOKENS)),
            output_characters=_int(a.get(sc.OUTPUT_CHARACTERS)),
            num_preemptions=_int(a.get(sc.NUM_PREEMPTIONS)) or 0,
            prefix_cache_hit_tokens=_int(a.get(sc.PREFIX_CACHE_HIT_TOKENS)),
            finish_reason=_first(reasons),
            error_type=_str(a.get(sc.ERROR_TYPE)),
        )

    @classmethod
    def _from_native(cls, a: Mapping[str, Any]) -> "RequestSummary":
        """vLLM's and TensorRT-LLM's ``llm_request`` span (deprecated usage names, no model name)."""
        output_tokens = _int(a.get(sc.VLLM_COMPLETION_TOKENS, a.get(sc.USAGE_OUTPUT_TOKENS)))
        decode = _float(a.get(sc.VLLM_DECODE))
        ttft = _float(a.get(sc.VLLM_TTFT))
        e2e = _float(a.get(sc.VLLM_E2E))
        if decode is None and e2e is not None and ttft is not None:
            decode = max(0.0, e2e - ttft)  # TRT-LLM reports no decode time; this is the conventions' formula
        reasons = a.get(sc.RESPONSE_FINISH_REASONS)
        return cls(
            model=_str(a.get(sc.VLLM_RESPONSE_MODEL, a.get(sc.REQUEST_MODEL))),
            provider=_str(a.get(sc.PROVIDER_NAME)),
            ttft=ttft,
            tpot=cls.mean_tpot(decode, output_tokens),
            e2e=e2e,
            queue=_float(a.get(sc.VLLM_QUEUE)),
            prefill=_float(a.get(sc.VLLM_PREFILL)),
            decode=decode,
            input_tokens=_int(a.get(sc.VLLM_PROMPT_TOKENS, a.get(sc.USAGE_INPUT_TOKENS))),
            output_tokens=output_tokens,
            finish_reason=_first(reasons),
        )


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return int(v)


def _first(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], str):
        return v[0]
    return None
