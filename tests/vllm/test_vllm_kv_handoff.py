"""The KV hand-off on the real engine: one engine with vLLM's ExampleConnector as ``kv_both``.

The first run of a prompt computes its prefill and saves the KV to disk (a save hand-off); after
``reset_prefix_cache()`` the second run of the same prompt loads it back through the connector (a
load hand-off: the decode side of disaggregated serving, on one engine)."""

from __future__ import annotations

import pytest

import otel_llm
from otel_llm import semconv as sc
from otel_llm.instrumentation.vllm import VLLMInstrumentor
from support.traces import request_trees

pytestmark = pytest.mark.engine

BLOCK = 32
PROMPT = {"prompt_token_ids": [5 + (j * 11) % 400 for j in range(2 * BLOCK + 9)]}  # two whole blocks and a tail
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def runs(otel, tmp_path_factory):
    from vllm import SamplingParams

    from support.engine import make_llm

    storage = tmp_path_factory.mktemp("kv-storage")
    # the instrumentor's guard is kept for the process: tests run before this one feed the channel bad records
    # on purpose
    guard = VLLMInstrumentor().guard
    before = dict(guard.errors)
    otel_llm.uninstrument()
    with otel.instrumented(sample_rate=1.0, tail_quantile=0) as inst:
        llm = make_llm(block_size=BLOCK, enable_prefix_caching=True, kv_transfer_config={
            "kv_connector": "ExampleConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(storage)}})
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
        first = llm.generate([PROMPT], params, use_tqdm=False)[0]
        assert llm.reset_prefix_cache()
        second = llm.generate([PROMPT], params, use_tqdm=False)[0]
        spans = otel.finished()
        errors = {k: v - before.get(k, 0) for k, v in guard.errors.items() if v != before.get(k, 0)}
        held = len(inst.telemetry.requests)
        del llm
    return first, second, spans, errors, held


def test_the_load_counts_vllms_external_tokens(runs):
    first, second, spans, _, _ = runs
    trees = request_trees(spans)
    a = trees[second.request_id].attributes
    # vLLM's own count: the second run's cached prompt tokens all came through the connector (the
    # local prefix cache was reset), whole blocks only
    assert second.num_cached_tokens == 2 * BLOCK
    assert a[sc.KV_TRANSFER_EXTERNAL_TOKENS] == second.num_cached_tokens
    assert a[sc.KV_TRANSFER_CONNECTOR] == "ExampleConnector"
    assert a[sc.KV_TRANSFER_FAILED] is False
    assert a[sc.KV_TRANSFER_ASYNC] is False
    assert a[sc.LATENCY_KV_LOAD] > 0
    # and the same tokens are the request's prompt-cache reads
    assert a[sc.USAGE_CACHE_READ_INPUT_TOKENS] == second.num_cached_tokens
    # the first run loaded nothing (nothing was stored yet) but saved its prompt's KV
    b = trees[first.request_id].attributes
    assert sc.KV_TRANSFER_EXTERNAL_TOKENS not in b
    assert b[sc.LATENCY_KV_SAVE] > 0 and first.num_cached_tokens == 0


def test_the_load_is_a_phase_inside_the_prefill(runs):
    _, second, spans, _, _ = runs
    t = request_trees(spans)[second.request_id]
    (load,) = [s for s in t.children[sc.SPAN_KV_TRANSFER] if s.attributes[sc.KV_TRANSFER_DIRECTION] == sc.KV_LOAD]
    prefill = t.one(sc.SPAN_PREFILL)
    assert load.attributes[sc.KV_TRANSFER_EXTERNAL_TOKENS] == 2 * BLOCK
    assert load.status.is_ok
    # the load runs in the step that computes the rest of the prompt: within the prefill phase
    assert prefill.start_time <= load.start_time <= load.end_time <= prefill.end_time
    assert (load.end_time - load.start_time) / 1e9 >= load.attributes[sc.LATENCY_KV_LOAD] - 1e-6


def test_the_save_is_a_phase_of_the_first_run(runs):
    first, _, spans, _, _ = runs
    t = request_trees(spans)[first.request_id]
    (save,) = t.children[sc.SPAN_KV_TRANSFER]
    assert save.attributes[sc.KV_TRANSFER_DIRECTION] == sc.KV_SAVE
    assert t.span.start_time <= save.start_time <= save.end_time <= t.span.end_time


def test_nothing_held_and_no_instrumentation_error(runs):
    *_, errors, held = runs
    assert held == 0
    assert not {k: v for k, v in errors.items() if "kv" in k}
