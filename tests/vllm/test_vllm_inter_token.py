"""Inter-token latency for every request, on the real vLLM engine: the histogram holds one value per
output token after the first, in the buckets of the gaps between the engine stamps of the request's
own tokens (read independently, by a probe on vLLM's ``OutputProcessor.process_outputs``)."""

from __future__ import annotations

import inspect
from bisect import bisect_left
from collections import defaultdict

import pytest

from otel_llm.core.inter_token import ITL_BUCKETS
from otel_llm.core.metrics import INTER_TOKEN_LATENCY

pytestmark = pytest.mark.engine

PROMPTS = [{"prompt_token_ids": [3 + (j * 11) % 400 for j in range(4 + 9 * i)]} for i in range(12)]


@pytest.fixture(scope="module")
def run(llm, otel):
    """Default options (most requests keep no spans: the metrics still cover all of them)."""
    from vllm import SamplingParams
    from vllm.v1.engine.output_processor import OutputProcessor

    stamps: dict[str, list[float]] = defaultdict(list)
    with otel.instrumented():
        instrumented = OutputProcessor.__dict__["process_outputs"]  # ours: the probe goes around it
        signature = inspect.signature(OutputProcessor.process_outputs)

        def probe(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs).arguments
            ts = bound.get("engine_core_timestamp")
            for o in bound["engine_core_outputs"]:
                if o.new_token_ids:
                    assert len(o.new_token_ids) == 1  # no speculative decoding here
                    stamps[o.request_id].append(ts)
            return instrumented.__get__(self, OutputProcessor)(*args, **kwargs)

        OutputProcessor.process_outputs = probe
        try:
            # different lengths: requests finish at different steps, so their gaps differ
            params = [SamplingParams(max_tokens=5 + 3 * i, ignore_eos=True, temperature=0.0) for i in range(len(PROMPTS))]
            outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        finally:
            OutputProcessor.process_outputs = instrumented
        (itl,) = otel.histogram(INTER_TOKEN_LATENCY.name)
        (max_gap,) = otel.histogram("llm.server.inter_token.max_gap")
    return outputs, dict(stamps), itl, max_gap


def test_one_value_per_output_token_after_the_first(run) -> None:
    outputs, stamps, itl, _ = run
    assert len(outputs) == len(PROMPTS)
    assert itl.count == sum(len(o.outputs[0].token_ids) - 1 for o in outputs)
    # (the engine's request ids carry a suffix the outputs' do not: compare the multisets)
    assert sorted(map(len, stamps.values())) == sorted(len(o.outputs[0].token_ids) for o in outputs)


def test_buckets_hold_the_gaps_between_the_requests_own_token_stamps(run) -> None:
    _, stamps, itl, max_gap = run
    expected = [0] * (len(ITL_BUCKETS) + 1)
    gaps = {rid: [b - a for a, b in zip(ts, ts[1:])] for rid, ts in stamps.items()}
    for g in gaps.values():
        for gap in g:
            expected[bisect_left(ITL_BUCKETS, gap)] += 1
    assert list(itl.bucket_counts) == expected
    assert itl.sum == pytest.approx(sum(ts[-1] - ts[0] for ts in stamps.values()), rel=1e-9)
    assert itl.max == max(map(max, gaps.values())) and itl.min == min(map(min, gaps.values()))
    # the stall detector: one value per request, its longest gap
    assert max_gap.count == len(stamps)
    assert max_gap.max == max(map(max, gaps.values()))
    assert max_gap.min == min(map(max, gaps.values()))
