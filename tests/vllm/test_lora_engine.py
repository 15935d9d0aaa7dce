"""Two hand-made LoRA adapters on the real CPU engine with one LoRA slot (``max_loras=1``).

The second adapter's requests cannot be admitted while the first adapter's run: vLLM's scheduler skips
them (its ``other`` reason for the queue). The request spans and metrics name the adapter, the step spans
the adapters they ran, and the verdict charges the second adapter's wait to the LoRA slot, decided per
request: the first adapter's requests and the base model's never get that cause.
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc
from support.traces import request_trees

pytestmark = pytest.mark.engine

N = 4
TINY_SLO = 1e-6  # every request breaches its TTFT objective: each gets a verdict


@pytest.fixture(scope="module")
def run(otel, tmp_path_factory):
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from support.engine import make_llm
    from support.lora_adapters import write_adapter

    root = tmp_path_factory.mktemp("adapters")
    first = LoRARequest("adapter-a", 1, write_adapter(root / "a", seed=1))
    second = LoRARequest("adapter-b", 2, write_adapter(root / "b", seed=2))
    with otel.instrumented(slo=f"ttft={TINY_SLO}", sample_rate=1.0, baseline_detail="steps", tail_quantile=0):
        llm = make_llm(enable_lora=True, max_loras=1, max_lora_rank=8)
        prompts = [{"prompt_token_ids": [5 + i, 6, 7, 8, 9, 10]} for i in range(2 * N + 2)]
        loras = [first] * N + [second] * N + [None, None]
        outputs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0),
                               lora_request=loras, use_tqdm=False)
        spans = otel.finished()
        requests = otel.histogram("llm.server.requests")
        del llm
    return outputs, loras, spans, requests


def test_request_spans_and_metrics_name_the_adapter(run):
    outputs, loras, spans, requests = run
    trees = request_trees(spans)
    for o, lora in zip(outputs, loras):
        a = trees[o.request_id].attributes
        if lora is None:
            assert sc.LORA_NAME not in a and sc.LORA_ID not in a
        else:
            assert (a[sc.LORA_NAME], a[sc.LORA_ID]) == (lora.lora_name, lora.lora_int_id)
            assert o.lora_request.lora_name == lora.lora_name
    by_adapter = {}
    for p in requests:
        key = p.attributes.get(sc.LORA_NAME)
        by_adapter[key] = by_adapter.get(key, 0) + p.value
    assert by_adapter == {"adapter-a": N, "adapter-b": N, None: 2}


def test_step_spans_state_the_adapters_they_ran(run):
    _, _, spans, _ = run
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP and sc.STEP_LORA_ADAPTERS in s.attributes]
    assert steps
    ran = {tuple(s.attributes[sc.STEP_LORA_ADAPTERS]) for s in steps}
    assert ran <= {("adapter-a",), ("adapter-b",)} and ("adapter-a",) in ran
    assert all(s.attributes[sc.STEP_LORA_COUNT] == 1 and s.attributes[sc.STEP_LORA_MAX] == 1 for s in steps)


def test_lora_slot_cause_goes_to_the_requests_that_waited_for_it(run):
    """The requests that waited for the slot: the second adapter's, admitted only after every request of
    the first adapter finished (vLLM's own timestamps say so). At least 90 % of them get the LoRA cause;
    no other request does."""
    outputs, loras, spans, _ = run
    trees = request_trees(spans)
    first_done = max(o.metrics.last_token_ts for o, lora in zip(outputs, loras)
                     if lora is not None and lora.lora_int_id == 1)
    waited = [o for o, lora in zip(outputs, loras)
              if lora is not None and lora.lora_int_id == 2 and o.metrics.scheduled_ts >= first_done]
    assert len(waited) == N, "the second adapter's requests waited for the first adapter's to finish"
    got = [o for o in outputs if trees[o.request_id].attributes.get(sc.SLOW_CAUSE) == sc.SLOW_QUEUE_LORA_SLOT]
    assert len({o.request_id for o in got} & {o.request_id for o in waited}) >= 0.9 * len(waited)
    assert {o.request_id for o in got} <= {o.request_id for o in waited}
    for o in waited:
        assert trees[o.request_id].attributes[sc.SLOW_SECONDS[sc.SLOW_QUEUE_LORA_SLOT]] > 0
