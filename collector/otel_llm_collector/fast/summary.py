"""``RequestSummary.from_attributes`` over a span's still-encoded attribute map: what the collector runs per request span.

Built from the core's public tables: ``ATTRIBUTE_SLOTS`` (our attribute -> field position and converter
kind), ``CONVERTERS`` and ``RequestSummary.from_slots``; tested equal to ``from_attributes`` over the
decoded values. For our spans only the attributes the derivation uses are decoded, in the same pass
that fills the summary; native (vLLM / TensorRT-LLM) spans are decoded whole and handed to the core.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from otel_llm import semconv as sc
from otel_llm.core.summary import ATTRIBUTE_SLOTS, CONVERTERS, RequestSummary

Decode = Callable[[Any], Any]
Reader = Callable[[Mapping[str, Any]], "RequestSummary | None"]
_N = len(RequestSummary.__slots__)
MAX_PLANS = 256  # attribute-key sets remembered (they come from clients: bounded, then read key by key)


def summary_reader(decode: Decode, typed: Mapping[str, Decode] | None = None) -> Reader:
    """A function of a span's encoded attribute map -> its ``RequestSummary`` (``None``: not a request span).

    ``decode`` turns one encoded value into what ``from_attributes`` would read; ``typed``: optional cheaper
    decoders by converter kind, each returning exactly ``CONVERTERS[kind](decode(value))`` (kinds it lacks
    are composed from ``decode``)."""
    typed = typed or {}
    by_kind = {kind: typed.get(kind) or (lambda conv: lambda raw: conv(decode(raw)))(conv)
               for kind, conv in CONVERTERS.items()}
    index = {key: i for key, (i, _) in ATTRIBUTE_SLOTS.items()}  # key -> field position
    decoders: list[Decode | None] = [None] * _N  # field position -> its decoder
    for i, kind in ATTRIBUTE_SLOTS.values():
        decoders[i] = by_kind[kind]
    from_slots, from_attributes = RequestSummary.from_slots, RequestSummary.from_attributes
    e2e, ttft, vllm_ttft, vllm_e2e = sc.LATENCY_E2E, sc.LATENCY_TTFT, sc.VLLM_TTFT, sc.VLLM_E2E
    nones = [None] * _N
    # a span's attribute keys (in the map's order) -> (key, field position, decoder) of the ones read: a
    # sender's request spans carry the same keys again and again, so the lookups are made once per key set
    plans: dict[tuple[str, ...], tuple[tuple[str, int, Decode], ...]] = {}

    def read(encoded: Mapping[str, Any]) -> RequestSummary | None:
        if e2e in encoded or ttft in encoded:
            values = nones[:]
            keys = tuple(encoded)  # keys, then one lookup each: a upb map's items() is a slow Python-level view
            plan = plans.get(keys)
            if plan is None:
                plan = tuple((key, index[key], decoders[index[key]]) for key in keys if key in index)  # type: ignore[misc]
                if len(plans) < MAX_PLANS:
                    plans[keys] = plan
            for key, i, decode_one in plan:
                values[i] = decode_one(encoded[key])
            return from_slots(values)
        if vllm_ttft in encoded or vllm_e2e in encoded:
            return from_attributes({key: decode(encoded[key]) for key in encoded})
        return None
    return read
