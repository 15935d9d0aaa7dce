"""Pooling (embedding) requests on the real engine: named as the GenAI conventions name them."""

from __future__ import annotations

import pytest

import otel_llm
from otel_llm import semconv as sc
from support.traces import MS, request_trees

pytestmark = pytest.mark.engine


def test_embedding_requests_are_embeddings_spans_with_their_phases(otel):
    from support.engine import in_process, make_llm

    otel_llm.uninstrument()
    with otel.instrumented(sample_rate=1.0, baseline_detail="steps") as inst:
        with in_process():
            llm = make_llm(runner="pooling")
        prompts = ["hello world", "a longer prompt that still fits in one step", "x"]
        outs = llm.embed(prompts, use_tqdm=False)
        trees = request_trees(otel.finished())
        held = len(inst.telemetry.requests)
        del llm
    assert len(outs) == len(trees) == 3 and held == 0
    for o in outs:
        t = trees[o.request_id]
        assert t.attributes[sc.OPERATION_NAME] == "embeddings"
        assert t.span.name == f"embeddings {t.attributes[sc.REQUEST_MODEL]}"
        assert t.attributes[sc.USAGE_INPUT_TOKENS] == len(o.prompt_token_ids)
        q, p = t.one(sc.SPAN_QUEUE), t.one(sc.SPAN_PREFILL)
        assert abs(q.end_time - p.start_time) <= MS and not t.children[sc.SPAN_DECODE]
