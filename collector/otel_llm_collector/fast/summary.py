"""``RequestSummary.from_attributes`` over a span's still-encoded attribute map: what the collector runs per request span.

Built from the core's public tables: ``ATTRIBUTE_SLOTS`` (our attribute -> field position and converter
kind), ``CONVERTERS`` and ``RequestSummary.from_slots``; tested equal to ``from_attributes`` over the
decoded values. For our spans only the attributes the derivation uses are decoded, in the same pass
that fills the summary; native (vLLM / TensorRT-LLM) spans are decoded whole and handed to the core.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Mapping

from otel_llm.core import semconv as sc
from otel_llm.core.summary import ATTRIBUTE_SLOTS, CONVERTERS, RequestSummary

Decode = Callable[[Any], Any]
Reader = Callable[[Mapping[str, Any]], "RequestSummary | None"]
_N = len(RequestSummary.__slots__)
NINE = frozenset((9,))
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
    float_kind = by_kind["float"]
    # a span's attribute keys (in the map's order) -> its plan: the float-kind keys read as one batch (their
    # field positions, a struct reading them all, the pattern they make when each is a lone double_value),
    # then (key, field position, decoder) of the other keys read. A sender's request spans carry the same keys
    # again and again, so the lookups are made once per key set.
    plans: dict[tuple[str, ...], tuple] = {}

    def plan_of(keys: tuple[str, ...]) -> tuple:
        read_keys = [key for key in keys if key in index]
        floats = tuple(key for key in read_keys if decoders[index[key]] is float_kind)
        others = tuple((key, index[key], decoders[index[key]]) for key in read_keys if key not in floats)
        return (floats, tuple(index[key] for key in floats), struct.Struct("<" + "xd" * len(floats)).unpack,
                b"\x21" * len(floats), others)

    def read(encoded: Mapping[str, Any]) -> RequestSummary | None:
        if e2e in encoded or ttft in encoded:
            values = nones[:]
            keys = tuple(encoded)  # keys, then one lookup each: a upb map's items() is a slow Python-level view
            plan = plans.get(keys)
            if plan is None:
                plan = plan_of(keys)
                if len(plans) < MAX_PLANS:
                    plans[keys] = plan
            floats, slots, unpack, lone_doubles, others = plan
            if floats:
                raws = list(map(encoded.__getitem__, floats))  # present: the plan comes from this map's keys
                joined = b"".join(raws)
                # each a lone double_value (9 bytes: tag 0x21, 8 bytes), what latencies are: read in one C call
                if NINE.issuperset(map(len, raws)) and joined[::9] == lone_doubles:
                    for i, value in zip(slots, unpack(joined)):
                        values[i] = value
                else:
                    for i, raw in zip(slots, raws):
                        values[i] = float_kind(raw)
            for key, i, decode_one in others:
                values[i] = decode_one(encoded[key])
            return from_slots(values)
        if vllm_ttft in encoded or vllm_e2e in encoded:
            return from_attributes({key: decode(encoded[key]) for key in encoded})
        return None
    return read
