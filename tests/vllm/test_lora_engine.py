"""Two hand-made LoRA adapters on the real CPU engine with one LoRA slot (``max_loras=1``).

The second adapter's requests cannot be admitted while the first adapter's run: vLLM's scheduler skips
them (its ``other`` reason for the queue). The request spans and metrics name the adapter, the step spans
the adapters they ran, and the verdict charges the second adapter's wait to the LoRA slot, decided per
request: the first adapter's requests and the base model's never get that cause. The one-adapter cache
loads and evicts each adapter as its turn comes: the step records, step spans and load metrics hold what
vLLM's own adapter manager did in the worker (watched there through ``collective_rpc``).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from otel_llm import semconv as sc
from support.traces import request_trees

pytestmark = pytest.mark.engine

N = 4
TINY_SLO = 1e-6  # every request breaches its TTFT objective: each gets a verdict


@pytest.fixture(scope="module")
def run(otel, tmp_path_factory):
    import cloudpickle
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    import support.lora_adapters as adapters
    from support.engine import make_llm

    root = tmp_path_factory.mktemp("adapters")
    first = LoRARequest("adapter-a", 1, adapters.write_adapter(root / "a", seed=1))
    second = LoRARequest("adapter-b", 2, adapters.write_adapter(root / "b", seed=2))
    # the worker's adapter cache is watched through vLLM's collective_rpc, whose callables need this
    with pytest.MonkeyPatch.context() as mp, \
            otel.instrumented(slo=f"ttft={TINY_SLO}", sample_rate=1.0, baseline_detail="steps", tail_quantile=0) as inst:
        mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        cloudpickle.register_pickle_by_value(adapters)  # the worker need not import the tests' package
        records = []
        telemetry = inst.telemetry
        add_step = telemetry.add_step

        def keep(step):  # every step record that reaches the frontend (the receiver looks add_step up per drain)
            records.append(step)
            add_step(step)

        telemetry.add_step = keep
        llm = make_llm(enable_lora=True, max_loras=1, max_lora_rank=8)
        assert llm.collective_rpc(adapters.watch_adapter_cache) == [0], "the warm-up's dummy adapters are gone"
        prompts = [{"prompt_token_ids": [5 + i, 6, 7, 8, 9, 10]} for i in range(2 * N + 2)]
        loras = [first] * N + [second] * N + [None, None]
        outputs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0),
                               lora_request=loras, use_tqdm=False)
        # the first adapter again: loaded back into the one-adapter cache, evicting the second
        outputs += llm.generate(prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0),
                                lora_request=[first], use_tqdm=False)
        loras.append(first)
        (cache_log,) = llm.collective_rpc(adapters.read_adapter_cache_log)
        cloudpickle.unregister_pickle_by_value(adapters)
        spans = otel.finished()
        requests = otel.histogram("llm.server.requests")
        loads = otel.histogram("llm.server.lora.load.duration")
        evictions = otel.histogram("llm.server.lora.evictions")
        step_counts = otel.histogram("llm.server.engine.steps")
        adapter_steps = otel.histogram("llm.server.lora.steps")
        del telemetry.add_step
        del llm
    return Run(outputs, loras, spans, requests, records, cache_log, loads, evictions, step_counts, adapter_steps)


class Run(NamedTuple):
    outputs: list
    loras: list
    spans: list
    requests: list
    records: list
    cache_log: list  # vLLM's own adapter cache, watched in the worker: ("loaded" | "evicted", adapter id)
    loads: list
    evictions: list
    step_counts: list  # llm.server.engine.steps' points
    adapter_steps: list  # llm.server.lora.steps' points


def test_request_spans_and_metrics_name_the_adapter(run):
    outputs, loras, spans, requests = run[:4]
    trees = request_trees(spans)
    for o, lora in zip(outputs, loras):
        a = trees[o.request_id].attributes
        if lora is None:
            assert sc.LORA_NAME not in a and sc.LORA_ID not in a
        else:
            assert (a[sc.LORA_NAME], a[sc.LORA_ID]) == (lora.lora_name, lora.lora_int_id)
            assert o.lora_request.lora_name == lora.lora_name
            # the adapter served it (and is what the request named, offline): the span and the metrics say so
            assert a[sc.REQUEST_MODEL] == a[sc.RESPONSE_MODEL] == lora.lora_name
    by_adapter = {}
    for p in requests:
        key = p.attributes.get(sc.LORA_NAME)
        by_adapter[key] = by_adapter.get(key, 0) + p.value
    assert by_adapter == {"adapter-a": N + 1, "adapter-b": N, None: 2}
    assert all(p.attributes[sc.REQUEST_MODEL] == p.attributes.get(sc.LORA_NAME, p.attributes[sc.REQUEST_MODEL])
               for p in requests)


def test_step_spans_state_the_adapters_they_ran(run):
    spans = run.spans
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP and sc.STEP_LORA_ADAPTERS in s.attributes]
    assert steps
    ran = {tuple(s.attributes[sc.STEP_LORA_ADAPTERS]) for s in steps}
    assert ran <= {("adapter-a",), ("adapter-b",)} and ("adapter-a",) in ran
    assert all(s.attributes[sc.STEP_LORA_COUNT] == 1 and s.attributes[sc.STEP_LORA_MAX] == 1 for s in steps)


def test_lora_slot_cause_goes_to_the_requests_that_waited_for_it(run):
    """The requests that waited for the slot: the second adapter's, admitted only after every request of
    the first adapter finished (vLLM's own timestamps say so). At least 90 % of them get the LoRA cause;
    no other request does."""
    outputs, loras, spans = run[:3]
    trees = request_trees(spans)
    first_done = max(o.metrics.last_token_ts for o, lora in zip(outputs[:2 * N + 2], loras)
                     if lora is not None and lora.lora_int_id == 1)
    waited = [o for o, lora in zip(outputs[:2 * N + 2], loras)
              if lora is not None and lora.lora_int_id == 2 and o.metrics.scheduled_ts >= first_done]
    assert len(waited) == N, "the second adapter's requests waited for the first adapter's to finish"
    got = [o for o in outputs if trees[o.request_id].attributes.get(sc.SLOW_CAUSE) == sc.SLOW_QUEUE_LORA_SLOT]
    assert len({o.request_id for o in got} & {o.request_id for o in waited}) >= 0.9 * len(waited)
    assert {o.request_id for o in got} <= {o.request_id for o in waited}
    for o in waited:
        assert trees[o.request_id].attributes[sc.SLOW_SECONDS[sc.SLOW_QUEUE_LORA_SLOT]] > 0


NAMES = {1: "adapter-a", 2: "adapter-b"}


def _events(records):
    return [e for r in records if r.worker is not None for e in r.worker.lora_events]


def test_adapter_loads_and_evictions_are_what_vllms_cache_did(run):
    """The step records' load and evict events, in order, are the changes vLLM's own adapter cache made in the
    worker (watched there, not timed): a, then b evicting a, then a evicting b."""
    from otel_llm.core.lora import LORA_EVICTED, LORA_LOADED

    kinds = {LORA_LOADED: "loaded", LORA_EVICTED: "evicted"}
    assert run.cache_log == [("loaded", 1), ("evicted", 1), ("loaded", 2), ("evicted", 2), ("loaded", 1)]
    got = _events(run.records)
    assert [(kinds[e.kind], e.lora_id) for e in got] == run.cache_log
    assert all(e.seconds > 0 for e in got if e.kind == LORA_LOADED)
    assert all(e.seconds == 0 for e in got if e.kind == LORA_EVICTED)
    for r in run.records:  # each load is in the step that first ran its adapter
        for e in (r.worker.lora_events if r.worker is not None else ()):
            if e.kind == LORA_LOADED:
                assert r.loras == (e.lora_id,) and r.start <= e.at <= r.end


def test_load_metrics_count_the_loads_by_adapter(run):
    loads = {p.attributes[sc.LORA_NAME]: p.count for p in run.loads}
    evictions = {p.attributes[sc.LORA_NAME]: p.value for p in run.evictions}
    expected_loads, expected_evictions = {}, {}
    for kind, lora_id in run.cache_log:
        into = expected_loads if kind == "loaded" else expected_evictions
        into[NAMES[lora_id]] = into.get(NAMES[lora_id], 0) + 1
    assert loads == expected_loads == {"adapter-a": 2, "adapter-b": 1}
    assert evictions == expected_evictions
    total = sum(e.seconds for e in _events(run.records) if e.kind == 1)
    assert sum(p.sum for p in run.loads) == pytest.approx(total)


def test_step_spans_carry_the_load_and_evict_events(run):
    by_id = {r.step_id: r for r in run.records}
    seen = []
    for s in run.spans:
        if s.name != sc.SPAN_ENGINE_STEP:
            continue
        record = by_id[s.attributes[sc.ENGINE_STEP_ID]]
        expected = [(e.kind, e.lora_id) for e in (record.worker.lora_events if record.worker is not None else ())]
        names = {sc.LORA_EVENT_LOADED: 1, sc.LORA_EVENT_EVICTED: 2}
        got = [(names[e.name], e.attributes[sc.LORA_ID]) for e in s.events if e.name in names]
        assert got == expected
        for e in s.events:
            if e.name in names:
                assert e.attributes[sc.LORA_NAME] == NAMES[e.attributes[sc.LORA_ID]]
                assert s.start_time <= e.timestamp <= s.end_time
                assert (sc.LORA_LOAD_TIME in e.attributes) == (e.name == sc.LORA_EVENT_LOADED)
        seen += got
    assert len(seen) == len(run.cache_log), "every step that loaded an adapter served a kept request"


def test_step_metrics_count_each_step_under_its_adapter(run):
    """Every step record that served requests is counted once in the step metrics, under the adapter it ran
    (none for the base model's steps); with one LoRA slot no step ran two adapters, so the adapter-scoped
    counter holds the same counts."""
    expected = {}
    for r in run.records:
        if r.ids:
            assert r.loras is None or len(r.loras) == 1
            key = NAMES[r.loras[0]] if r.loras else None
            expected[key] = expected.get(key, 0) + 1
    got = {}
    for p in run.step_counts:
        key = p.attributes.get(sc.LORA_NAME)
        got[key] = got.get(key, 0) + p.value
    # (the base model's requests share steps with the first adapter's: whether any step ran them alone is the
    # scheduler's choice, so the base model's key may be missing)
    assert got == expected and {"adapter-a", "adapter-b"} <= set(expected)
    assert {p.attributes[sc.LORA_NAME]: p.value for p in run.adapter_steps} == {
        k: v for k, v in expected.items() if k is not None}


def test_request_spans_carry_their_adapters_loads(run):
    """Each load of an adapter is on the request spans of that adapter's requests that its step served (at
    least one: the load was for them), with the step event's attributes; no other request carries it. The
    last request, alone in its call, reloaded the first adapter: that load is on its span."""
    from otel_llm.core.lora import LORA_LOADED

    trees = request_trees(run.spans)
    loads = [e for e in _events(run.records) if e.kind == LORA_LOADED]
    seen = set()
    for o, lora in zip(run.outputs, run.loras):
        events = [e for e in trees[o.request_id].span.events if e.name == sc.LORA_EVENT_LOADED]
        if lora is None:
            assert not events
            continue
        for e in events:
            assert (e.attributes[sc.LORA_ID], e.attributes[sc.LORA_NAME]) == (lora.lora_int_id, lora.lora_name)
            seen.add((e.attributes[sc.LORA_ID], e.attributes[sc.LORA_LOAD_TIME]))
    assert seen == {(e.lora_id, e.seconds) for e in loads}
    (last,) = [e for e in trees[run.outputs[-1].request_id].span.events if e.name == sc.LORA_EVENT_LOADED]
    assert last.attributes[sc.LORA_LOAD_TIME] == loads[-1].seconds and loads[-1].lora_id == 1
