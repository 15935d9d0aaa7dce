"""Speculative decoding, LoRA adapters and KV-cache facts in the engine-agnostic core, on constructed steps.

No engine: synthetic per-step statistics (acceptance below 100 %, so drafted and accepted differ), the
wire's extras block, the roofline's numbers for an fp8 KV cache written out, the LoRA-slot verdict, and
the adapter label's bounds under bad input (a 100 KB name, 10,000 distinct adapters).
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.diagnosis.anatomy import cost, kv_cache_facts
from otel_llm.core.diagnosis.roofline import ModelShape, step_cost
from otel_llm.core.diagnosis.verdict import StepWindow, decide
from otel_llm.core.lora import AdapterLabels
from otel_llm.core.metrics import ServerMetrics
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.slo import SLOTable
from otel_llm.core.spec_decode import SpecStep, acceptance_length, acceptance_rate
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import BLOCKED_OTHER, QUEUED, SCHEDULED, RequestTimeline, StepRecord
from otel_llm.instrumentation.vllm import step_wire
from support.metrics import points_by_name

ENGINE = 5 << 32


# -- speculative decoding --------------------------------------------------------------------------


def test_spec_step_counts_and_positions():
    spec = SpecStep(at=[0, 2], drafted=[3, 2], accepted=[1, 2])
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (2, 5, 3)
    # position 0: both drafted, both accepted; 1: both drafted, one accepted (the second); 2: one drafted, none
    assert spec.per_position() == ([2, 2, 1], [2, 1, 0])
    assert acceptance_rate(5, 3) == 0.6
    assert acceptance_length(2, 3) == 2.5  # vLLM's mean acceptance length: 1 + accepted / verify steps
    assert acceptance_rate(0, 0) is None and acceptance_length(0, 0) is None
    with pytest.raises(ValueError):
        SpecStep([5], [1], [1]).check(3)


def _pipeline(**options):
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    config = Config.resolve({"sample_rate": 1.0, "baseline_detail": "steps", "tail_quantile": 0,
                             "direct_export": False, **options}, environ={})
    return Pipeline(config, tp.get_tracer("t"), mp.get_meter("t"), "test"), exporter, reader


def test_pipeline_sums_each_requests_drafts_below_full_acceptance():
    """Synthetic per-step statistics with rejections: per request drafted != accepted, the request totals
    are the sums of its steps' counts, the step totals the sums over their requests, and the metrics and
    spans carry them."""
    tel, exporter, reader = _pipeline()
    now = time.monotonic() - 2.0
    timelines = {}
    for rid in ("a", "b"):
        t = RequestTimeline(rid, time.time() - 2.0, model="m", response_id=rid, input_tokens=8)
        t.events += [(QUEUED, now), (SCHEDULED, now)]
        assert tel.start(t)
        timelines[rid] = t
    # step 1: both prefill; steps 2..4 verify drafts: (drafted, accepted) per request
    tel.add_step(StepRecord(ENGINE | 1, now, now + 0.01, [("a", 8, True), ("b", 8, True)], 2))
    for t in timelines.values():
        t.add_tokens(now + 0.01, 1)
    plan = [((3, 1), (3, 3)), ((3, 0), (2, 1)), ((1, 1), None)]
    for k, shares in enumerate(plan):
        start = now + 0.01 * (k + 1)
        ids, tokens, at, drafted, accepted = [], [], [], [], []
        for i, (rid, s) in enumerate(zip("ab", shares)):
            ids.append(rid)
            tokens.append(1 + (s[0] if s else 0))
            if s:
                at.append(i)
                drafted.append(s[0])
                accepted.append(s[1])
        step = StepRecord(ENGINE | (k + 2), start, start + 0.01, [(r, n, False) for r, n in zip(ids, tokens)], 2)
        step.contexts = [8 + 4 * k, 8 + 4 * k]
        step.spec = SpecStep(at, drafted, accepted)
        tel.add_step(step)
        for i, rid in enumerate(ids):
            n = 1 + (shares[i][1] if shares[i] else 0)
            timelines[rid].add_tokens(start + 0.01, n)
    assert timelines["a"].spec == [3, 7, 2]
    assert timelines["b"].spec == [2, 5, 4]
    for rid, t in timelines.items():
        out = sum(t.tokens_at(i) for i in range(len(t.token_ts)))
        s = RequestSummary(model="m", ttft=0.01, e2e=0.05, decode=0.03, input_tokens=8, output_tokens=out)
        tel.finish(rid, s)
    assert tel.flush(10)
    spans = {s.attributes.get(sc.RESPONSE_ID): s for s in exporter.get_finished_spans() if s.parent is None
             and s.name != sc.SPAN_ENGINE_STEP}
    a = spans["a"].attributes
    assert (a[sc.SPEC_VERIFY_STEPS], a[sc.SPEC_DRAFT_TOKENS], a[sc.SPEC_ACCEPTED_TOKENS]) == (3, 7, 2)
    assert a[sc.SPEC_ACCEPTANCE_RATE] == pytest.approx(2 / 7)
    assert a[sc.SPEC_ACCEPTANCE_LENGTH] == pytest.approx(1 + 2 / 3)
    steps = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_ENGINE_STEP]
    verify = [s for s in steps if sc.STEP_SPEC_DRAFTS in s.attributes]
    assert sum(s.attributes[sc.STEP_SPEC_DRAFT_TOKENS] for s in verify) == 7 + 5
    assert sum(s.attributes[sc.STEP_SPEC_ACCEPTED_TOKENS] for s in verify) == 2 + 4
    drafted_rows = [s.attributes[sc.STEP_DRAFTED] for s in exporter.get_finished_spans()
                    if s.name == sc.SPAN_DECODE_STEP and sc.STEP_DRAFTED in s.attributes]
    assert drafted_rows, "decode-step spans state the drafts they verified"
    tel.close()
    points = points_by_name(reader.get_metrics_data())
    tokens = {p.attributes[sc.SPEC_TOKEN_KIND]: p.value for p in points["llm.server.spec_decode.tokens"]}
    assert tokens == {"drafted": 12, "accepted": 6}
    rates = points["llm.server.spec_decode.acceptance_rate"]
    assert sum(p.count for p in rates) == 2 and sum(p.sum for p in rates) == pytest.approx(2 / 7 + 4 / 5)
    by_pos = {(p.attributes[sc.SPEC_POSITION], p.attributes[sc.SPEC_TOKEN_KIND]): p.value
              for p in points["llm.server.spec_decode.position.tokens"]}
    # the five drafts: (3,1) (3,3) (3,0) (2,1) (1,1)
    assert by_pos[(0, "drafted")] == 5 and by_pos[(0, "accepted")] == 4
    assert by_pos[(1, "drafted")] == 4 and by_pos[(1, "accepted")] == 1
    assert by_pos[(2, "drafted")] == 3 and by_pos[(2, "accepted")] == 1


def test_wire_carries_extras_and_plain_records_are_unchanged():
    shares = (["r1", "r2", "r3"], [4, 1, 3], [10, 11, 12], (), (), (), ())
    base = (ENGINE | 9, 1.0, 2.0, 3, 0, 0, 0.5, shares, 0, 0.1, 0.2, 0.3, None, None)
    plain = step_wire.encode(base)
    assert plain == step_wire.encode_py(base)
    extras = step_wire.Extras([0, 2], [3, 2], [1, 2], (7,))
    data = step_wire.encode(base + (extras,))
    assert data == step_wire.encode_py(base + (extras,))
    for decode in (step_wire.decode, step_wire.decode_py):  # the C decoder hands the record to Python
        step = decode(data, [None, None, None])
        assert step.ids == ["r1", "r2", "r3"] and step.tokens == [4, 1, 3]
        assert (step.spec.at, step.spec.drafted, step.spec.accepted) == ([0, 2], [3, 2], [1, 2])
        assert step.loras == (7,)
        assert decode(plain).spec is None and decode(plain).loras is None
    with pytest.raises(step_wire.WireError):
        step_wire.encode_py(base + (step_wire.Extras([5], [1], [1], ()),))
    with pytest.raises(step_wire.WireError):
        step_wire.decode_py(data[:-len(b"r1\0r2\0r3") - 4])


def test_wire_carries_the_worker_facts():
    """LoRA cache events and the drafter's time ride in the extras block, alone or with drafts; in-process
    (step_hooks.decode) and across processes (step_wire) they arrive the same."""
    from otel_llm.core.lora import LORA_EVICTED, LORA_LOADED, LoRAEvent
    from otel_llm.instrumentation.vllm import step_hooks

    shares = (["r1", "r2"], None, [10, 11], (), (), (), ())
    base = (ENGINE | 10, 1.0, 2.0, 2, 0, 0, 0.5, shares, 0, 0.1, 0.2, 0.3, None, None)
    events = ((LORA_EVICTED, 1, 1.25, 0.0), (LORA_LOADED, 2, 1.25, 0.0625))
    for extras in (step_wire.Extras((), (), (), (2,), events, None),
                   step_wire.Extras([1], [3], [2], (), (), 0.004),
                   step_wire.Extras([0], [3], [3], (2,), events[1:], 0.5)):
        data = step_wire.encode(base + (extras,))
        for step in (step_wire.decode(data), step_wire.decode_py(data), step_hooks.decode(base + (extras,))):
            assert step.worker.lora_events == tuple(LoRAEvent(*e) for e in extras.lora_events)
            assert step.worker.draft_s == extras.draft_s
            assert step.loras == (tuple(extras.loras) or None)
        with pytest.raises(step_wire.WireError):  # cut inside the events
            step_wire.decode_py(data[:-len(b"r1\0r2") - 8])
    plain = step_wire.decode(step_wire.encode(base))
    assert plain.worker is None and step_hooks.decode(base).worker is None


def test_worker_facts_hooks_count_loads_and_evictions():
    """The worker hooks on a stand-in adapter manager with vLLM's LRU behaviour: a load is an add_adapter in
    which _load_adapter ran, its evictions what the cache lost meanwhile; a cached adapter is no event."""
    from otel_llm.core.lora import LORA_EVICTED, LORA_LOADED
    from otel_llm.instrumentation.vllm.worker_facts import WorkerFacts, read_plain

    facts = WorkerFacts()
    ticks = iter(range(100))
    facts.clock = lambda: float(next(ticks))

    class Manager:  # one cache slot, as max_cpu_loras=1
        def __init__(self):
            self.cached = []

        def list_adapters(self):
            return set(self.cached)

        def add_adapter(self, lora_request):
            if lora_request.lora_int_id in self.cached:
                return False
            facts.load_adapter(lambda r: r, self, (lora_request,), {})
            self.cached = [lora_request.lora_int_id]
            return True

    m = Manager()
    a, b = (type("R", (), {"lora_int_id": i})() for i in (1, 2))
    for r in (a, a, b):
        facts.add_adapter(m.add_adapter, m, (r,), {})
    taken = facts.take()
    assert [(e.kind, e.lora_id, e.seconds) for e in taken.lora_events] == [
        (LORA_LOADED, 1, 1.0), (LORA_EVICTED, 1, 0.0), (LORA_LOADED, 2, 1.0)]
    assert taken.draft_s is None and facts.take() is None
    facts.remove_adapter(lambda i: True, m, (2,), {})
    assert [(e.kind, e.lora_id) for e in facts.take().lora_events] == [(LORA_EVICTED, 2)]
    facts.propose(lambda: None, type("Runner", (), {"device": None})(), (), {})
    plain = facts.take_plain()
    assert plain == {"version": 1, "lora_events": [], "draft_s": 1.0} and read_plain(plain) == ((), 1.0)


@pytest.mark.parametrize("value, says", [
    (((), 0.01), "of type tuple"),  # an earlier release's positional pair
    ({"lora_events": [], "draft_s": 0.01}, "version None"),
    ({"version": 2, "draft_s": 0.01}, "version 2"),
    ({"version": 1, "draft_s": "0.01"}, "draft_s: str"),
    ({"version": 1, "lora_events": [(1, 2, 1.0, 0.5)]}, "event of type tuple"),
    ({"version": 1, "lora_events": [{"kind": 1, "lora_id": 2, "at": 1.0}]}, "seconds: NoneType"),
    ({"version": 1, "lora_events": [{"kind": True, "lora_id": 2, "at": 1.0, "seconds": 0.5}]}, "kind: bool"),
    ({"version": 1, "lora_events": [{}] * 300}, "at most"),
])
def test_worker_facts_from_another_process_are_read_by_name_and_bad_ones_refused(value, says):
    """The facts a worker hangs on its output travel inside vLLM's output to the EngineCore: read back by
    name, with a version; another form is refused with a clear error (the step hooks count it and keep the
    step's record), and a field this reader does not know is ignored."""
    from otel_llm.core.lora import LORA_LOADED, LoRAEvent
    from otel_llm.core.timeline import StepWorkerFacts
    from otel_llm.instrumentation.vllm.worker_facts import plain, read_plain

    facts = StepWorkerFacts((LoRAEvent(LORA_LOADED, 3, 1.5, 0.25),), 0.004)
    sent = {**plain(facts), "later_field": 1}
    assert read_plain(sent) == (((LORA_LOADED, 3, 1.5, 0.25),), 0.004)
    with pytest.raises(ValueError, match=says):
        read_plain(value)


def test_worker_facts_of_another_form_cost_their_facts_not_the_step():
    import types

    from otel_llm.instrumentation.vllm.step_extras import worker_facts
    from otel_llm.instrumentation.vllm.worker_facts import WORKER_FACTS_ATTR, WorkerFacts

    local = WorkerFacts()
    assert worker_facts(types.SimpleNamespace(**{WORKER_FACTS_ATTR: ((), 0.01)}), local) is None
    assert dict(local.guard.errors) == {"worker facts": 1}


# -- the roofline: verification tokens and an fp8 KV cache --------------------------------------


SHAPE = dict(layers=2, hidden=128, heads=2, kv_heads=1, head_dim=64, intermediate=256, vocab=512)


def test_roofline_counts_verified_drafts_logits():
    s = ModelShape(**SHAPE, weight_bytes=2, kv_bytes=2, act_bytes=2)
    plain = step_cost(s, [(1, 100)])
    verify = step_cost(s, [(4, 100)], draft_tokens=3)
    no_logits = step_cost(s, [(4, 100)])
    # the three drafts: logits at three more positions, 2*h*V FLOPs and (h + V) activations each
    assert verify.flops - no_logits.flops == 3 * 2 * 128 * 512
    assert verify.bytes - no_logits.bytes == 3 * 2 * (128 + 512)
    step = StepRecord(1, 0.0, 1.0, [("a", 4, False)])
    step.contexts = [100]
    step.spec = SpecStep([0], [3], [1])
    assert cost(s, step) == verify and plain.tokens == 1 and verify.tokens == 4


def test_roofline_fp8_kv_cache_numbers_written_out():
    """One decode token after 1,000 cached, the tiny model's shape: the KV bytes are 2*L*K*d*b_kv*(c+n+n),
    i.e. 2*2*1*64*b*(1000+1+1) = 256,512*b: 513,024 B at 16 bits, 256,512 B at fp8 (half), 1,026,048 B at
    float32 (fp8: a quarter of it). Everything else in the step's bytes is the same."""
    bf16 = ModelShape.from_hf_config(_config(), "bfloat16", "auto")
    fp8 = ModelShape.from_hf_config(_config(), "bfloat16", "fp8")
    f32 = ModelShape.from_hf_config(_config(), "float32", "auto")
    f32_fp8 = ModelShape.from_hf_config(_config(), "float32", "fp8")
    assert (bf16.kv_bytes, fp8.kv_bytes, f32.kv_bytes, f32_fp8.kv_bytes) == (2, 1, 4, 1)
    c16, c8 = step_cost(bf16, [(1, 1000)]), step_cost(fp8, [(1, 1000)])
    kv16 = 2 * 2 * 1 * 64 * 2 * (1000 + 1 + 1)
    assert kv16 == 513_024
    assert c16.bytes - c8.bytes == kv16 / 2 == 256_512  # fp8 halves the KV bytes of a 16-bit model
    c32, c32_8 = step_cost(f32, [(1, 1000)]), step_cost(f32_fp8, [(1, 1000)])
    assert c32.bytes - c32_8.bytes == 2 * 2 * 1 * 64 * (4 - 1) * 1002  # fp8 is a quarter of float32's KV
    assert c16.flops == c8.flops  # the KV dtype moves bytes, not FLOPs (dequantised in the kernel)
    assert kv_cache_facts("fp8", 32, "torch.float32") == {sc.STEP_KV_CACHE_DTYPE: "fp8",
                                                          sc.STEP_KV_CACHE_BLOCK_SIZE: 32}
    assert kv_cache_facts("auto", 128, "torch.float32")[sc.STEP_KV_CACHE_DTYPE] == "float32"


def _config() -> dict:
    return {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2,
            "intermediate_size": 256, "vocab_size": 512}


# -- LoRA --------------------------------------------------------------------------------------------


def _waiting_history(window: StepWindow, lora_of_step: tuple[int, ...] | None, n: int = 6) -> list[int]:
    ids = []
    for k in range(n):
        step = StepRecord(ENGINE | (k + 1), 10.0 + 0.011 * k, 10.0 + 0.011 * k + 0.01, [("x", 1, False)], 1, 1,
                          queue_blocked=BLOCKED_OTHER)
        step.loras = lora_of_step
        window.add(step, 0, 1)
        ids.append(step.step_id)
    return ids


@pytest.mark.parametrize("own, running, max_loras, expect", [
    (2, (1,), 1, sc.SLOW_QUEUE_LORA_SLOT),  # its adapter not loaded, the one slot taken: the LoRA slot
    (1, (1,), 1, sc.SLOW_UNKNOWN),  # its own adapter was running: something else kept it
    (None, (1,), 1, sc.SLOW_UNKNOWN),  # the base model needs no slot
    (2, (1,), 2, sc.SLOW_UNKNOWN),  # a slot was free
    (3, (1, 2), 2, sc.SLOW_QUEUE_LORA_SLOT),
])
def test_lora_slot_verdict_is_decided_per_request(own, running, max_loras, expect):
    window = StepWindow()
    window.max_loras = max_loras
    ids = _waiting_history(window, running)
    admit = StepRecord(ENGINE | 7, 10.1, 10.11, [("r", 8, True)], 1)
    window.add(admit, 8, 0)
    t = RequestTimeline("r", time.time(), lora_id=own)
    t.events += [(QUEUED, 9.999), (SCHEDULED, 10.1)]
    t.steps = ids[:0] + [admit.step_id]
    t.token_ts = [10.11]
    v = decide(t, window, ("ttft",))
    assert v.cause == expect, v.seconds


def test_adapter_labels_stay_bounded_under_bad_input():
    """A 100 KB adapter name and 10,000 distinct adapters through the SDK metrics: at most cap + 1 adapter
    label values per metric, each at most MAX_LABEL_LENGTH characters, the rest counted as collapsed, and
    the memory held stays small."""
    reader = InMemoryMetricReader()
    metrics = ServerMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), SLOTable())
    cap = metrics.adapters.cap
    huge = "x" * 100_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(10_000):
        name = huge if i == 0 else f"adapter-{i}"
        metrics.record(RequestSummary(model="m", e2e=0.1, input_tokens=1, output_tokens=2, lora=name))
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    values = {p.attributes.get(sc.LORA_NAME) for p in points_by_name(reader.get_metrics_data())["llm.server.requests"]}
    assert len(values) == cap + 1 and sc.LORA_OTHER in values
    assert max(len(v) for v in values) <= metrics.adapters.max_length
    assert metrics.adapters.collapsed == 10_000 - cap
    assert held < 8 * 1024 * 1024, held  # the series of cap + 1 label sets, not of 10,000 (nor 100 KB names)


def test_adapter_labels_refuse_a_bad_cap():
    with pytest.raises(ValueError):
        AdapterLabels(cap=-1)
    labels = AdapterLabels(cap=1)
    assert labels.label(None) is None
    assert labels.label("a") == "a" and labels.label("b") == sc.LORA_OTHER and labels.label("a") == "a"
    assert labels.label(sc.LORA_OTHER) == sc.LORA_OTHER and labels.collapsed == 2


def _adapter_run():
    """Two adapters and the base model through the pipeline on constructed steps: a's adapter loads in its
    prefill step, b's in the step that prefills b while a decodes (two adapters: ``multiple``), then steps
    of both, of the base model only and of b only."""
    from otel_llm.core.lora import LORA_EVICTED, LORA_LOADED, LoRAEvent
    from otel_llm.core.timeline import StepWorkerFacts

    tel, exporter, reader = _pipeline()
    now = time.monotonic() - 2.0
    timelines = {}
    for rid, lora in (("a", 1), ("b", 2), ("c", None)):
        t = RequestTimeline(rid, time.time() - 2.0, model="m", response_id=rid, input_tokens=8,
                            lora_id=lora, lora_name={1: "adapter-a", 2: "adapter-b"}.get(lora))
        t.events += [(QUEUED, now), (SCHEDULED, now)]
        assert tel.start(t)
        timelines[rid] = t
    plan = [  # (shares, adapters, the model runner's cache events: (kind, adapter, offset into the step, seconds))
        ([("a", 8, True)], (1,), [(LORA_LOADED, 1, 0.002, 0.003)]),
        ([("a", 1, False), ("b", 8, True)], (1, 2), [(LORA_EVICTED, 7, 0.001, 0.0), (LORA_LOADED, 2, 0.002, 0.004)]),
        ([("a", 1, False), ("b", 1, False), ("c", 8, True)], (1, 2), []),
        ([("c", 1, False)], None, []),
        ([("b", 1, False)], (2,), []),
    ]
    for k, (shares, loras, events) in enumerate(plan):
        start = now + 0.01 * k
        step = StepRecord(ENGINE | (k + 1), start, start + 0.01, shares, len(shares))
        step.loras = loras
        if events:
            step.worker = StepWorkerFacts(tuple(LoRAEvent(kind, i, start + at, sec) for kind, i, at, sec in events))
        tel.add_step(step)
        for rid, _, _ in shares:
            timelines[rid].add_tokens(start + 0.01, 1)
    for rid, t in timelines.items():
        n = len(t.token_ts)
        tel.finish(rid, RequestSummary(model="m", ttft=0.01, e2e=0.06, decode=0.04, input_tokens=8, output_tokens=n))
    assert tel.flush(10)
    tel.close()
    return tel, exporter.get_finished_spans(), points_by_name(reader.get_metrics_data())


def test_step_metrics_carry_one_bounded_adapter_label_per_step():
    """Each step counted once in the step-scoped metrics (its adapter, ``multiple``, or no label), and once per
    adapter it ran in ``llm.server.lora.steps``."""
    _, _, points = _adapter_run()
    steps = {}
    for p in points["llm.server.engine.steps"]:
        key = p.attributes.get(sc.LORA_NAME)
        steps[key] = steps.get(key, 0) + p.value
    assert steps == {"adapter-a": 1, sc.LORA_MULTIPLE: 2, None: 1, "adapter-b": 1}
    totals = {p.attributes.get(sc.LORA_NAME): p.count for p in points["llm.server.engine.step.duration"]
              if p.attributes[sc.STEP_PART] == "total"}
    assert totals == steps  # the durations are the same steps, by the same label
    assert {p.attributes[sc.LORA_NAME]: p.value for p in points["llm.server.lora.steps"]} == {
        "adapter-a": 3, "adapter-b": 3}  # a in steps 1-3, b in steps 2, 3 and 5


def test_step_adapter_label_shares_the_request_labels_cap():
    """One ``AdapterLabels`` for requests and steps: beyond the cap a step's adapter is ``other`` (counted), an
    adapter named like one of our label values is ``other`` too, several adapters are ``multiple``."""
    from otel_llm.core.lora import AdapterNames, AdapterStepMetrics

    reader = InMemoryMetricReader()
    names, labels = AdapterNames(), AdapterLabels(cap=1)
    metrics = AdapterStepMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), names, labels)
    for i, name in ((1, "first"), (2, "second"), (3, sc.LORA_MULTIPLE)):
        names.note(i, name)
    steps = []
    for loras in ((1,), (2,), (3,), (1, 2), None):
        step = StepRecord(ENGINE | len(steps), 1.0, 1.01, [("x", 1, False)])
        step.loras = loras
        steps.append(step)
    assert [metrics.step_label(s) for s in steps] == ["first", sc.LORA_OTHER, sc.LORA_OTHER, sc.LORA_MULTIPLE, None]
    assert labels.collapsed == 2
    metrics.record(steps)
    got = {p.attributes[sc.LORA_NAME]: p.value for p in points_by_name(reader.get_metrics_data())["llm.server.lora.steps"]}
    assert got == {"first": 2, sc.LORA_OTHER: 3}


def test_request_span_carries_its_adapters_load_event():
    """The step span's ``llm.lora.loaded`` of a request's own adapter, in a step that served it, is on the
    request span too: same name, attributes and time; not the other adapter's, nor the eviction."""
    _, spans, _ = _adapter_run()
    requests = {s.attributes.get(sc.RESPONSE_ID): s for s in spans if s.parent is None
                and s.name != sc.SPAN_ENGINE_STEP}
    step_loads = {e.attributes[sc.LORA_ID]: e for s in spans if s.name == sc.SPAN_ENGINE_STEP
                  for e in s.events if e.name == sc.LORA_EVENT_LOADED}
    assert set(step_loads) == {1, 2}
    for rid, lora in (("a", 1), ("b", 2)):
        (event,) = requests[rid].events
        assert event.name == sc.LORA_EVENT_LOADED
        assert dict(event.attributes) == dict(step_loads[lora].attributes)
        # the same engine stamp; each span's materialization reads wall - monotonic itself (core/clock.py: the
        # reads differ by ~100 ns, by a time slice when descheduled), so the two agree within that, not exactly
        assert abs(event.timestamp - step_loads[lora].timestamp) < 50_000_000
    assert dict(requests["b"].events[0].attributes) == {sc.LORA_ID: 2, sc.LORA_NAME: "adapter-b",
                                                        sc.LORA_LOAD_TIME: 0.004}
    assert not requests["c"].events  # the base model's request needed no adapter
    from otel_llm.core.trace_contract import REQUEST_SPAN  # and the contract declares what they carry
    for span in requests.values():
        assert set(span.attributes) <= set(REQUEST_SPAN.attribute_names())
        assert {e.name for e in span.events} <= set(REQUEST_SPAN.event_names())


def test_spec_counts_fast_path_equals_the_loop():
    """spec_counts' C-level path and its loop give the same counts, and every step the fast path does not
    take (a draft invalidated, a request unscheduled or unknown, nothing sampled) still counts as the loop."""
    import random
    import types

    from otel_llm.instrumentation.vllm import step_hooks
    from otel_llm.instrumentation.vllm.step_extras import _PRESENT, _spec_counts_loop, share_positions, spec_counts

    fast = step_hooks.fast_methods()
    readers = [_PRESENT] + ([_PRESENT._replace(counts=fast.spec_counts)] if fast is not None else [])
    taken_in_c = 0
    rng = random.Random(5)
    for case in range(300):
        n = rng.randint(1, 12)
        ids = [f"r{i}" for i in range(n)]
        drafts = {r: [9] * rng.choice((0, 1, 3) if case % 5 == 0 else (1, 3)) for r in ids if rng.random() < 0.9}
        index = {r: i for i, r in enumerate(ids) if case % 7 or rng.random() < 0.8}
        sampled = [[7] * rng.choice((0, 1, 2, 4) if case % 3 == 0 else (1, 2, 4)) for _ in ids]
        invalid = {ids[0]: 1} if case % 11 == 0 else None
        scheduled = {r: 1 for r in ids if case % 13 or rng.random() < 0.7}
        out = types.SimpleNamespace(scheduled_spec_decode_tokens=drafts, num_invalid_spec_tokens=invalid)
        model = types.SimpleNamespace(sampled_token_ids=sampled, req_id_to_index=index)
        scheduler = types.SimpleNamespace(num_sampled_tokens_per_step=1)
        loop = _spec_counts_loop(drafts, sampled, index, invalid or {}, 1, scheduled) if drafts else None
        for r in readers:  # the Python lines, and the C count of the same common step (_hooks_fast.c)
            got = spec_counts(scheduler, out, model, scheduled, r)
            assert got == loop, case
        if fast is not None and not invalid and drafts and fast.spec_counts(drafts, sampled, index, scheduled):
            taken_in_c += 1
        if got is not None:
            rev = ids[::-1]
            for order in (ids, rev):  # the fast share lookup (same order) and the dict's
                at, d, a = share_positions(got, order)
                assert [order[i] for i in at] == got[0] and (d, a) == (got[1], got[2])
    assert fast is None or taken_in_c > 50
    if fast is not None:  # an index past the sampled rows: the IndexError Python's lines raise
        with pytest.raises(IndexError):
            fast.spec_counts({"a": [9]}, [[7, 7]], {"a": 3}, {"a": 1})
