"""instrument() after the engine was built: what can still be traced, and nothing breaks."""

from __future__ import annotations

import pytest

import otel_llm
from otel_llm import semconv as sc
from support.traces import request_trees, row_tokens

pytestmark = pytest.mark.engine


def test_engine_built_before_instrument_still_gets_request_spans(otel):
    from vllm import SamplingParams

    from support.engine import in_process, make_llm

    otel_llm.uninstrument()
    with in_process():
        llm = make_llm(disable_log_stats=True)  # vLLM's default for LLM(): no per-request statistics
        with otel.instrumented(sample_rate=1.0, baseline_detail="steps") as inst:
            prompts = [{"prompt_token_ids": list(range(10, 10 + 20 * (i + 1)))} for i in range(3)]
            outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
            trees = request_trees(otel.finished())
            held = len(inst.telemetry.requests)
        del llm
    assert all(o.metrics is None for o in outs)  # the engine keeps no statistics of its own
    for o in outs:
        a = trees[o.request_id].attributes
        assert a[sc.USAGE_OUTPUT_TOKENS] == 8
        assert 0 < a[sc.LATENCY_TTFT] <= a[sc.LATENCY_E2E]
        assert sc.LATENCY_PREFILL in a and sc.LATENCY_QUEUE not in a  # prefill from the first engine step
        assert sum(row_tokens(r) for r in trees[o.request_id].decode_rows()) == 7
    assert held == 0
