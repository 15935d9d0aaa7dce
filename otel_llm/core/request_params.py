"""The GenAI request attributes of an engine's sampling parameters (vLLM's and TensorRT-LLM's
``SamplingParams`` share the field names read here; an engine's own, such as vLLM's structured-output
backend, are its adapter's: instrumentation/vllm/grammar.py)."""

from __future__ import annotations

from typing import Any

from .. import semconv as sc


def sampling_attributes(params: Any) -> dict[str, Any]:
    """Parameters the engine will use. Engines fill defaults, so a parameter that is unset (``None``)
    or off (top_k 0, a penalty of 0, no stop sequence, one choice) is left out rather than recorded."""
    attrs: dict[str, Any] = {}
    for key, name in ((sc.REQUEST_MAX_TOKENS, "max_tokens"), (sc.REQUEST_TEMPERATURE, "temperature"),
                      (sc.REQUEST_TOP_P, "top_p"), (sc.REQUEST_SEED, "seed")):
        value = getattr(params, name, None)
        if value is not None:
            attrs[key] = value
    top_k = getattr(params, "top_k", None)
    if isinstance(top_k, int) and top_k > 0:
        attrs[sc.REQUEST_TOP_K] = top_k
    for key, name in ((sc.REQUEST_FREQUENCY_PENALTY, "frequency_penalty"),
                      (sc.REQUEST_PRESENCE_PENALTY, "presence_penalty")):
        value = getattr(params, name, None)
        if value:
            attrs[key] = float(value)
    stop = getattr(params, "stop", None)
    if isinstance(stop, str):
        stop = [stop]
    if stop:
        attrs[sc.REQUEST_STOP_SEQUENCES] = tuple(str(x) for x in stop)
    n = getattr(params, "n", 1)
    if isinstance(n, int) and n > 1:
        attrs[sc.REQUEST_CHOICE_COUNT] = n
    return attrs
