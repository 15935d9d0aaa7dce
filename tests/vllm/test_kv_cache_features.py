"""An fp8 KV cache with prefix caching (32-token blocks) on the real CPU engine, one engine for both.

* ``kv_cache_dtype="fp8"``: the engine runs instrumented; every engine-step span states the fp8 dtype and
  the block size, and the roofline's bytes are the ones our cost model gives for a one-byte KV cache (the
  step records are kept, so the figure is recomputed from the same shares, not from timings).
* Prefix caching with ``block_size=32`` (the CPU build's default 128-token block would hide these short
  shared prefixes): the request span's cache-read input tokens, and their split into the local prefix
  cache and a KV connector's, equal vLLM's own ``RequestOutput.num_cached_tokens`` for every request.

vLLM's CPU attention takes an fp8 KV cache only on x86-64 with AVX-512 or AMX (``cpu_attn._get_attn_isa``):
the machine decides that, so elsewhere the engine runs the model's own KV dtype, the fp8 tests are skipped
(saying why) and the prefix-caching test runs all the same.
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc
from support.traces import request_trees

pytestmark = pytest.mark.engine


def _fp8_kv_cache_runs_here() -> bool:
    """vLLM's own test (``cpu_attn._get_attn_isa``): AVX-512 or AMX."""
    import torch

    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


FP8 = _fp8_kv_cache_runs_here()
needs_fp8 = pytest.mark.skipif(not FP8, reason="vLLM's CPU attention takes an fp8 KV cache only with AVX-512 or AMX")

BLOCK = 32
SHARED = [11 + (j * 13) % 400 for j in range(3 * BLOCK + 5)]  # 101 tokens: three full blocks to share
N_SHARED, MAX_TOKENS = 6, 8


@pytest.fixture(scope="module")
def run(otel):
    from vllm import SamplingParams

    from support.engine import keep_step_records, make_llm

    with otel.instrumented(sample_rate=1.0, baseline_detail="steps", tail_quantile=0) as inst:
        telemetry = inst.telemetry
        records = keep_step_records(telemetry)
        llm = make_llm(kv_cache_dtype="fp8" if FP8 else "auto", enable_prefix_caching=True, block_size=BLOCK)
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
        # the first request fills the cache; the next ones share its first blocks, then differ
        first = llm.generate([{"prompt_token_ids": SHARED + [1]}], params, use_tqdm=False)
        prompts = [{"prompt_token_ids": SHARED + [2 + i] * (1 + i)} for i in range(N_SHARED)]
        prompts.append({"prompt_token_ids": [450 - j for j in range(40)]})  # nothing shared
        rest = llm.generate(prompts, params, use_tqdm=False)
        spans = otel.finished()
        shape = telemetry.diagnosis.shape
        del telemetry.add_step
        del llm
    return first + rest, spans, records, shape


@needs_fp8
def test_fp8_engine_step_spans_state_dtype_and_block_size(run):
    outputs, spans, _, _ = run
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outputs), "the fp8 engine ran every request"
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    assert steps
    for s in steps:
        assert s.attributes[sc.STEP_KV_CACHE_DTYPE] == "fp8"
        assert s.attributes[sc.STEP_KV_CACHE_BLOCK_SIZE] == BLOCK


@needs_fp8
def test_roofline_bytes_use_the_fp8_kv_cache(run):
    """The span's bytes are our cost model's for a one-byte KV cache (the float32 test model's would be four
    bytes an element): recomputed from the step records the spans were built from."""
    from dataclasses import replace

    from otel_llm.core.diagnosis.anatomy import cost

    _, spans, records, shape = run
    assert shape is not None and shape.kv_bytes == 1 and shape.act_bytes == 4
    by_id = {r.step_id: r for r in records}
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP]
    checked = 0
    for s in steps:
        record = by_id.get(s.attributes[sc.ENGINE_STEP_ID])
        if record is None:
            continue
        c = cost(shape, record)
        assert s.attributes[sc.STEP_BYTES] == c.bytes
        # the KV part alone: three bytes an element less than a float32 cache
        full = cost(replace(shape, kv_bytes=4), record)
        kv_elements = 2 * shape.layers * shape.kv_heads * shape.head_dim * (
            sum(record.contexts) + sum(record.tokens if record.tokens is not None else [1] * len(record.ids))
            + sum(record.tokens if record.tokens is not None else [1] * len(record.ids)))
        assert full.bytes - c.bytes == 3 * kv_elements
        checked += 1
    assert checked == len(steps)


def test_cache_read_tokens_equal_vllms_num_cached_tokens(run):
    outputs, spans, _, _ = run
    trees = request_trees(spans)
    assert len(trees) == len(outputs)
    assert outputs[0].num_cached_tokens == 0
    hits = [o for o in outputs if o.num_cached_tokens]
    assert len(hits) >= N_SHARED, "the requests sharing the first one's blocks hit the prefix cache"
    assert all(o.num_cached_tokens % BLOCK == 0 for o in hits)
    for o in outputs:
        a = trees[o.request_id].attributes
        assert a.get(sc.USAGE_CACHE_READ_INPUT_TOKENS, 0) == o.num_cached_tokens
        # the split: everything from the engine's own prefix cache here (no KV connector)
        assert a.get(sc.CACHE_READ_LOCAL, 0) == o.num_cached_tokens
        assert a.get(sc.CACHE_READ_EXTERNAL, 0) == 0
