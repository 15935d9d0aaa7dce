"""A recorded trace file with a LoRA adapter and speculative decoding on some of its request spans: the demo
slice (a run without either), its two slowest requests given the attributes the vLLM adapter writes for them
(``spans.feature_attributes``), so the report's handling of them is tested on an otherwise real trace."""

from __future__ import annotations

import json
from pathlib import Path

from otel_llm import semconv as sc

# the slowest request: an adapter and speculation below full acceptance; the second: an adapter only
SLOWEST = {sc.LORA_NAME: "adapter-a", sc.LORA_ID: 1, sc.SPEC_VERIFY_STEPS: 10, sc.SPEC_DRAFT_TOKENS: 30,
           sc.SPEC_ACCEPTED_TOKENS: 21, sc.SPEC_ACCEPTANCE_RATE: 0.7, sc.SPEC_ACCEPTANCE_LENGTH: 3.1}
SECOND = {sc.LORA_NAME: "adapter-b", sc.LORA_ID: 2}


def _value(v: object) -> dict:
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"doubleValue": v}


def write_feature_slice(source: Path, out: Path) -> list[str]:
    """``source`` with ``SLOWEST`` and ``SECOND`` added to its two slowest request spans, written to ``out``;
    returns their span ids (hex), slowest first."""
    docs = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    requests = []
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {kv["key"]: kv["value"] for kv in span.get("attributes", ())}
                    if sc.LATENCY_E2E in attrs:
                        requests.append((float(attrs[sc.LATENCY_E2E]["doubleValue"]), span))
    requests.sort(key=lambda r: -r[0])
    chosen = [span for _, span in requests[:2]]
    for span, extra in zip(chosen, (SLOWEST, SECOND)):
        span["attributes"] += [{"key": k, "value": _value(v)} for k, v in extra.items()]
    out.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return [span["spanId"] for span in chosen]
