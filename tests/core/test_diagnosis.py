"""Step anatomy, the roofline and GPU telemetry on constructed records: fast, no engine, no GPU."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from test_core import Harness  # the pipeline on constructed timelines
from support.traces import engine_steps

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.diagnosis import devices
from otel_llm.core.diagnosis.anatomy import StepDiagnosis, cost as anatomy_cost
from otel_llm.core.diagnosis.gpu import GpuSampler, throttle_names, visible_devices
from otel_llm.core.diagnosis.roofline import ModelShape, decode_step_cost, roofline, step_cost
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import RequestShare, RequestTimeline, StepRecord
from otel_llm.instrumentation.vllm import model_timing, step_hooks, step_wire
from support.fake_nvml import FakeNVML
from support.metrics import points_by_name

# The tiny test model (tests/support/tiny_model.py), float32.
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 512, "tie_word_embeddings": False,
        "torch_dtype": "float32"}
# Llama-2-7B's config.json (meta-llama/Llama-2-7b-hf), bf16.
LLAMA_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def close(got: float, want: float, rel: float = 0.05) -> bool:
    return abs(got - want) <= rel * abs(want)


# -- roofline: hand counts ---------------------------------------------------------------------------


def test_tiny_model_counts_by_hand():
    shape = ModelShape.from_hf_config(TINY)
    # per layer: q 128*128 + k 128*64 + v 128*64 + o 128*128 = 49,152; MLP 3*128*256 = 98,304
    assert shape.active_params == 2 * (49_152 + 98_304) == 294_912
    # + 2 norms a layer, embedding and LM head (untied) 2*512*128, final norm 128
    assert shape.params == 2 * (147_456 + 256) + 131_072 + 128 == 426_624
    # one prefill chunk of 16 tokens from position 0, decodes at contexts 20 and 40: 18 tokens, 3 requests
    cost = step_cost(shape, [(16, 0), (1, 20), (1, 40)])
    # linear 2*294,912*18 = 10,616,832; attention 4*2 layers*2 heads*64*(16*17/2 + 21 + 41) = 202,752;
    # LM head 2*128*512*3 = 393,216
    flops = 10_616_832 + 202_752 + 393_216
    # weights 4 B*(294,912 + 512*128 + 18*128) = 1,451,008; KV 1,024 B a token (2*2 layers*1 head*64*4 B)
    # read (16 + 21 + 41) + written 18 = 98,304; activations 4 B*(18*2*(4*128 + 2*3*64 + 3*256) + 3*(128+512))
    nbytes = 1_451_008 + 98_304 + 4 * (18 * 3_328 + 3 * 640)
    assert close(cost.flops, flops) and close(cost.bytes, nbytes)
    assert cost.flops == flops and cost.bytes == nbytes  # the formula, pinned
    assert (cost.tokens, cost.requests) == (18, 3)


def test_llama_7b_decode_batch_against_textbook_counts():
    shape = ModelShape.from_hf_config(LLAMA_7B)
    assert shape.params == 6_738_415_616  # Llama-2-7B's published parameter count
    assert shape.kv_heads == 32 and shape.head_dim == 128 and shape.weight_bytes == 2
    # 32 sequences decoding one token each after 1,024 tokens of context
    cost = step_cost(shape, [(1, 1024)] * 32)
    # textbook: 2 FLOPs per parameter per token (all 6.74e9, embedding included) + attention
    # 4 * layers * d_model * keys seen = 4*32*4096*1025 per token
    flops = 2 * 6.738e9 * 32 + 4 * 32 * 4096 * 1025 * 32
    # textbook: every weight once in bf16, plus each sequence's KV cache: 2 (K,V) * 32 layers * 4096 * 2 B
    # = 0.5 MiB a token, 1,025 tokens, 32 sequences
    nbytes = 2 * 6.738e9 + 32 * 1025 * 2 * 32 * 4096 * 2
    assert close(cost.flops, flops) and close(cost.bytes, nbytes)
    h100 = devices.lookup("NVIDIA H100 80GB HBM3")
    r = roofline(cost, h100, measured_s=0.012)
    assert r.bound == "memory" and r.intensity < 20  # far below H100's ridge (~295 FLOP/B)
    # 30.6 GB in 12 ms on 3.35 TB/s: MBU ~0.76; 440 GFLOP in 12 ms on 989 TFLOP/s: MFU ~0.037
    assert close(r.mbu, 30.56e9 / 0.012 / 3.35e12) and close(r.mfu, 4.4e11 / 0.012 / 989e12)
    assert close(r.predicted_s, 30.56e9 / 3.35e12)


def test_llama_7b_prefill_is_compute_bound():
    shape = ModelShape.from_hf_config(LLAMA_7B)
    cost = step_cost(shape, [(2048, 0)])
    # textbook: 2 * 6.476e9 non-embedding weights * 2048 tokens + causal attention 4*32*4096*(2048*2049/2)
    # + LM head on the last token 2*4096*32000
    flops = 2 * 6.476e9 * 2048 + 4 * 32 * 4096 * 2048 * 2049 / 2 + 2 * 4096 * 32000
    assert close(cost.flops, flops)
    r = roofline(cost, devices.lookup("NVIDIA H100 80GB HBM3"), None)
    assert r.bound == "compute" and r.mfu is None and r.mbu is None
    assert close(r.predicted_s, flops / 989e12)


def test_moe_counts_active_experts():
    mixtral = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
               "torch_dtype": "bfloat16"}
    shape = ModelShape.from_hf_config(mixtral)
    assert close(shape.params, 46.7e9, 0.01)  # Mixtral-8x7B: 46.7B total
    assert close(shape.active_params + 2 * 32000 * 4096, 12.9e9, 0.02)  # ~12.9B active a token
    one = step_cost(shape, [(1, 100)])
    many = step_cost(shape, [(1, 100)] * 64)
    # one token reads 2 experts' weights a layer; 64 tokens can reach all 8
    assert many.bytes - one.bytes > 2 * 32 * 3 * 4096 * 14336 * 5


def test_a_plain_decode_batch_costs_what_its_shares_cost():
    """decode_step_cost (sums in C, from the contexts) equals step_cost over (1, context) per request, and
    the step-level cost of a record picks it only for a one-token-each batch."""
    shape = ModelShape.from_hf_config(LLAMA_7B)
    contexts = [17 + 31 * i for i in range(64)]
    assert decode_step_cost(shape, contexts) == step_cost(shape, [(1, c) for c in contexts])
    ids = [f"r{i}" for i in range(64)]
    plain = StepRecord.of_lists(1, 0.0, 0.01, ids, None, [])
    plain.contexts = contexts
    assert anatomy_cost(shape, plain) == step_cost(shape, [(1, c) for c in contexts])
    mixed = StepRecord(2, 0.0, 0.01, [(r, 16 if i == 3 else 1, i == 3) for i, r in enumerate(ids)], contexts=contexts)
    assert mixed.tokens is not None
    assert anatomy_cost(shape, mixed) == step_cost(shape, [(16 if i == 3 else 1, c) for i, c in enumerate(contexts)])
    mixed.contexts = contexts[:-1]  # not one context a share: no cost
    assert anatomy_cost(shape, mixed) is None


def test_dtype_and_kv_dtype():
    shape = ModelShape.from_hf_config(LLAMA_7B, dtype="torch.float16", kv_cache_dtype="fp8")
    assert shape.weight_bytes == 2 and shape.kv_bytes == 1
    assert ModelShape.from_hf_config(TINY, kv_cache_dtype="auto").kv_bytes == 4


# -- device peaks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,row", [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10"), ("AMD Instinct MI300X", "MI300X"), ("Tesla T4", "T4"),
])
def test_device_table_matches_names_as_drivers_report_them(name, row):
    assert devices.lookup(name).name == row


def test_options_override_the_table_and_cpu_needs_them():
    assert devices.lookup("Intel Xeon") is None and devices.resolve(None, None, None) is None
    assert devices.resolve("NVIDIA H100 80GB HBM3", None, 4e12).bandwidth == 4e12  # one figure overridden
    cpu = devices.resolve(None, 2e12, 1e11)
    assert cpu.ridge == 20.0
    assert devices.resolve("NVIDIA H100", None, None).times(2).flops == 2 * 989e12


def test_peak_options_parse_from_the_environment():
    c = Config.resolve({}, environ={"OTEL_LLM_PEAK_FLOPS": "1e12", "OTEL_LLM_PEAK_MEMORY_BANDWIDTH": "5e10",
                                    "OTEL_LLM_DEVICE": "H100", "OTEL_LLM_GPU_SAMPLE_HZ": "0"})
    assert (c.peak_flops, c.peak_memory_bandwidth, c.device, c.gpu_sample_hz) == (1e12, 5e10, "H100", 0.0)
    with pytest.raises(ValueError, match="OTEL_LLM_PEAK_FLOPS"):
        Config.resolve({}, environ={"OTEL_LLM_PEAK_FLOPS": "-1"})
    with pytest.raises(ValueError, match="OTEL_LLM_GPU_SAMPLE_HZ"):
        Config.resolve({}, environ={"OTEL_LLM_GPU_SAMPLE_HZ": "nan"})


# -- anatomy on the wire and on the span -----------------------------------------------------------


def test_the_hooks_payload_carries_anatomy_by_name():
    shares = step_wire.Shares(["a", "b"], [16, 1], [0, 30], [0], [0], [16], [0])  # a new prompt, a decode
    payload = step_wire.StepPayload(7, 10.0, 10.010, 2, 3, 0, 0.5, shares, 2, 0.001, 0.008, 0.001, 0.25, 0.006)
    new = step_hooks.decode(payload)
    assert (new.schedule_s, new.execute_s, new.output_s, new.idle_s, new.model_s) == (0.001, 0.008, 0.001, 0.25,
                                                                                      0.006)
    assert new.contexts == [0, 30] and new.requests == [("a", 16, True), ("b", 1, False)]
    assert new.queue_blocked == 2 and new.kv_cache_usage == 0.5 and new.waiting == 3
    # the same record as the wire gives for it
    wired = step_wire.decode(step_wire.encode(payload))
    assert (wired.requests, wired.contexts, wired.queue_blocked, wired.model_s) == (new.requests, new.contexts, 2,
                                                                                    0.006)


class FakeScheduler:
    """What the hooks read of vLLM's Scheduler: requests, running/waiting, the KV manager."""

    def __init__(self, reqs: dict) -> None:
        self.requests = reqs
        self.running, self.waiting = list(reqs), []
        self.kv_cache_manager = SimpleNamespace(usage=0.25)
        self.lora_config = None  # no LoRA adapters served


def scheduler_output(scheduled: dict, cached: list = (), new: list = ()) -> SimpleNamespace:
    """vLLM's SchedulerOutput as the hooks read it: ``cached`` = (id, computed before the step, outputs),
    ``new`` = (id, computed, prompt length); the real classes are fenced in test_vllm_fences.py."""
    from vllm.v1.core.sched.output import CachedRequestData

    c = CachedRequestData.make_empty()
    c.req_ids, c.num_computed_tokens, c.num_output_tokens = ([x[i] for x in cached] for i in range(3))
    return SimpleNamespace(
        num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()), preempted_req_ids=set(),
        finished_req_ids=set(), scheduled_cached_reqs=c, scheduled_spec_decode_tokens={},
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=b, prompt_len=p, prefill_token_ids=None)
                            for r, b, p in new])


def test_hooks_stamp_an_anatomy_that_sums_to_the_step():
    got = []
    hooks = step_hooks.StepHooks()
    hooks.sink = got.append  # armed, without wrapping vLLM's scheduler: the test calls the wrappers
    clock = iter([100.0, 100.002, 100.010, 100.011, 100.5, 100.501, 100.509, 100.510])
    hooks.clock = lambda: next(clock)
    sched = FakeScheduler({"p": None, "d": None})
    out = scheduler_output({"d": 1, "p": 16}, cached=[("d", 30, 5)], new=[("p", 0, 16)])
    outputs = {0: SimpleNamespace(timestamp=100.0105)}  # vLLM stamps its outputs inside update_from_output
    for _ in range(2):  # two steps; the second after a 0.488 s pause
        hooks.schedule(lambda: out, sched, (), {})
        hooks.update_from_output(lambda *a: outputs, sched, (out, None), {})
        outputs = {0: SimpleNamespace(timestamp=100.5095)}
    first, second = (step_hooks.decode(p) for p in got)
    assert first.requests == [("d", 1, False), ("p", 16, True)] and first.contexts == [30, 0]
    assert first.idle_s is None  # nothing came before it
    assert first.schedule_s == pytest.approx(0.002) and first.execute_s == pytest.approx(0.008)
    assert first.output_s == pytest.approx(0.0005) and first.end == 100.0105
    for s in (first, second):
        assert s.schedule_s + s.execute_s + s.output_s == pytest.approx(s.end - s.start, abs=1e-9)
    assert second.idle_s == pytest.approx(100.5 - 100.011)  # from the first's return to the second's start


def test_a_request_recomputing_after_a_preemption_is_prefill_until_its_last_token():
    """The hook ships vLLM's lists with no per-request loop; a resumed request's prompt length rides
    along (from the scheduler's Request) until its recompute is done, so the frontend still tells its
    chunks from decodes; then nothing is kept for it."""
    got = []
    hooks = step_hooks.StepHooks()
    hooks.sink = got.append
    sched = FakeScheduler({"r": SimpleNamespace(num_prompt_tokens=100), "d": None, "gone": None})
    sched.requests["gone"] = SimpleNamespace(num_prompt_tokens=7)
    resumed = scheduler_output({"r": 64, "gone": 7}, cached=[("r", 0, 5), ("gone", 0, 1)])
    resumed.scheduled_cached_reqs.resumed_req_ids = {"r", "gone"}
    last_chunk = scheduler_output({"d": 1, "r": 41}, cached=[("d", 50, 3), ("r", 64, 5)])
    last_chunk.finished_req_ids = {"gone"}  # aborted while still recomputing: forgotten
    decode = scheduler_output({"d": 1, "r": 1}, cached=[("d", 51, 4), ("r", 105, 6)])
    for out in (resumed, last_chunk, decode):
        hooks.schedule(lambda: out, sched, (), {})
        hooks.update_from_output(lambda *a: {}, sched, (out, None), {})
    first, second, third = (step_hooks.decode(p) for p in got)
    assert first.requests == [("r", 64, True), ("gone", 7, True)]
    assert second.requests == [("d", 1, False), ("r", 41, True)] and second.contexts == [50, 64]
    assert third.requests == [("d", 1, False), ("r", 1, False)] and third.contexts == [51, 105]
    last = step_wire.Shares(*step_wire.StepPayload(*got[2]).shares)
    assert hooks.recompute == {} and list(last.prompt_at) == []  # no prompt entry once it decodes (an empty tuple)


def test_step_hooks_wrap_while_armed_and_keep_state_of_their_own():
    """The owner (instrumentor or plugin) arms its StepHooks: vLLM's scheduler and model runner are
    wrapped with that object's methods until it disarms; two objects share no state."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    before = Scheduler.__dict__["update_from_output"], GPUModelRunner.__dict__["execute_model"]
    hooks, other = step_hooks.StepHooks(), step_hooks.StepHooks()
    hooks.arm(lambda payload: None)
    try:
        wrapped = Scheduler.__dict__["update_from_output"], GPUModelRunner.__dict__["execute_model"]
        assert [w.__wrapped__ for w in wrapped] == list(before)
        hooks.pending[1] = ()
        assert other.sink is None and not other.pending and other.timer.event_pool is not hooks.timer.event_pool
    finally:
        hooks.disarm()
    assert (Scheduler.__dict__["update_from_output"], GPUModelRunner.__dict__["execute_model"]) == before
    assert hooks.sink is None and not hooks.pending and hooks.timer.timing is False


def test_idle_is_zero_while_another_step_is_in_flight():
    """vLLM's batch queue: step B is scheduled before step A's output is processed."""
    got = []
    hooks = step_hooks.StepHooks()
    hooks.sink, hooks.last_end = got.append, 50.0
    sched = FakeScheduler({"d": None})
    a = scheduler_output({"d": 1}, cached=[("d", 8, 2)])
    b = scheduler_output({"d": 1}, cached=[("d", 9, 2)])
    hooks.schedule(lambda: a, sched, (), {})
    hooks.schedule(lambda: b, sched, (), {})
    hooks.update_from_output(lambda **k: {}, sched, (), {"scheduler_output": a})
    hooks.update_from_output(lambda **k: {}, sched, (), {"scheduler_output": b})
    sa, sb = (step_hooks.decode(p) for p in got)
    assert sa.idle_s > 0 and sb.idle_s == 0.0


def test_model_time_is_measured_around_the_runner_and_kept_with_its_step():
    """A worker process (no sink): execute_model + sample_tokens timed and kept under the step's key
    until the output comes back; a CPU runner in the EngineCore's own thread is not timed."""
    hooks = model_timing.ModelTimer()
    hooks.timing = True  # as enable(), without wrapping vLLM's runner
    clock = iter([0.002, 0.006, 0.007, 0.009])
    hooks.clock = lambda: next(clock)
    out = SimpleNamespace(num_scheduled_tokens={"d": 1})
    runner = SimpleNamespace(device=SimpleNamespace(type="cpu"))
    execute, sample = hooks.execute_model, hooks.sample_tokens
    execute(lambda *a: None, runner, (out,), {})  # forward 0.002 -> 0.006
    sample(lambda *a: "async output", runner, (None,), {})  # sampling 0.007 -> 0.009
    assert hooks.model == {id(out): pytest.approx(0.006)} and hooks.cuda_events is False
    # the EngineCore with a CPU runner in its thread (UniProcExecutor): decided once, not timed
    hooks.in_engine, hooks.cuda_events = True, None
    execute(lambda *a: None, runner, (out,), {})
    assert hooks.timing is False


def test_model_time_rides_on_the_runner_output_across_processes():
    """MultiprocExecutor: the worker times the runner and the time travels on the pickled output."""
    import pickle

    from vllm.v1.outputs import ModelRunnerOutput

    hooks = model_timing.ModelTimer()
    hooks.timing = True
    clock = iter([0.0, 0.004, 0.005, 0.006, 0.007, 0.008])
    hooks.clock = lambda: next(clock)
    runner = SimpleNamespace(device=SimpleNamespace(type="cpu"))
    so = SimpleNamespace(num_scheduled_tokens={"d": 1})
    hooks.execute_model(lambda *a: None, runner, (so,), {})
    made = ModelRunnerOutput(req_ids=["d"], req_id_to_index={"d": 0})
    out = hooks.sample_tokens(lambda *a: made, runner, (None,), {})
    received = pickle.loads(pickle.dumps(out))  # what the EngineCore gets from the worker's queue
    assert getattr(received, model_timing.MODEL_TIME_ATTR) == pytest.approx(0.005) and not hooks.model
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT
    hooks.execute_model(lambda *a: EMPTY_MODEL_RUNNER_OUTPUT, runner, (so,), {})
    assert not hasattr(EMPTY_MODEL_RUNNER_OUTPUT, model_timing.MODEL_TIME_ATTR)  # vLLM's shared empty output


# -- the frontend: span attributes and step metrics ---------------------------------------------------


def test_step_span_and_metrics_carry_anatomy_and_roofline():
    h = Harness(sample_rate=0.0, slo="ttft=0.001", peak_flops=1e12, peak_memory_bandwidth=1e11)
    tele = h.telemetry
    tele.diagnosis.setup(ModelShape.from_hf_config(TINY), tele.config, on_gpu=False)
    base = time.monotonic()
    tele.start(RequestTimeline("r", time.time(), model="m", response_id="r"))
    step = StepRecord(1, base, base + 0.010, [RequestShare("r", 16, True)], running=1)
    step.schedule_s, step.execute_s, step.output_s, step.idle_s, step.model_s = 0.001, 0.008, 0.001, 0.2, 0.007
    step.contexts = [0]
    tele.add_step(step)
    tele.finish("r", RequestSummary(model="m", ttft=0.01, e2e=0.02))
    assert tele.flush(10)
    (span,) = engine_steps(list(h.exporter.get_finished_spans()))
    a = span.attributes
    assert (a[sc.STEP_SCHEDULE_TIME], a[sc.STEP_EXECUTE_TIME], a[sc.STEP_OUTPUT_TIME]) == (0.001, 0.008, 0.001)
    assert a[sc.STEP_IDLE_BEFORE] == 0.2 and a[sc.STEP_MODEL_TIME] == 0.007
    cost = step_cost(ModelShape.from_hf_config(TINY), [(16, 0)])
    assert a[sc.STEP_FLOPS] == cost.flops and a[sc.STEP_BYTES] == cost.bytes
    assert a[sc.STEP_BOUND] == ("compute" if cost.intensity >= 10 else "memory")
    assert a[sc.STEP_MFU] == pytest.approx(cost.flops / 0.007 / 1e12)  # model time is the measured time
    assert a[sc.STEP_MBU] == pytest.approx(cost.bytes / 0.007 / 1e11)
    points = points_by_name(h.reader.get_metrics_data())
    parts = {dict(p.attributes)[sc.STEP_PART]: p for p in points["llm.server.engine.step.duration"]}
    assert set(parts) == {"schedule", "execute", "model", "output", "idle", "total"}
    assert parts["idle"].sum == 0.2 and all(dict(p.attributes)[sc.STEP_PHASE] == "prefill" for p in parts.values())
    (count,) = points["llm.server.engine.steps"]
    assert count.value == 1 and dict(count.attributes)[sc.STEP_BOUND] == a[sc.STEP_BOUND]
    (mfu,) = points["llm.server.engine.step.mfu"]
    assert mfu.sum == pytest.approx(a[sc.STEP_MFU])
    tele.close()


def test_without_peaks_or_composition_the_step_says_only_what_it_knows():
    d = StepDiagnosis()
    step = StepRecord(1, 0.0, 0.01, [("r", 1, False)])
    assert d.attributes(step) == {}  # an old engine-side hook: no anatomy, no composition
    step.contexts = [10]
    d.configure(ModelShape.from_hf_config(TINY), None)
    a = d.attributes(step)
    assert sc.STEP_FLOPS in a and sc.STEP_BOUND not in a and sc.STEP_MFU not in a


def test_steps_are_counted_once_by_the_frontend_owning_their_first_request():
    h = Harness(sample_rate=0.0)
    tele = h.telemetry
    tele.start(RequestTimeline("mine", time.time()))
    tele.add_step(StepRecord(1, 0.0, 0.01, [("theirs", 1, False), ("mine", 1, False)], contexts=[3, 4]))
    tele.add_step(StepRecord(2, 0.01, 0.02, [("mine", 1, False), ("theirs", 1, False)], contexts=[4, 5]))
    assert tele.flush(10)
    (count,) = points_by_name(h.reader.get_metrics_data())["llm.server.engine.steps"]
    assert count.value == 1 and dict(count.attributes)[sc.STEP_BOUND] == "unknown"
    tele.close()


# -- GPU telemetry ---------------------------------------------------------------------------------


def test_sampler_reads_nvml_and_finds_the_nearest_sample():
    nvml = FakeNVML()
    now = [10.0]
    s = GpuSampler(nvml, hz=10, clock=lambda: now[0])
    for util, t in ((10, 10.0), (60, 10.1), (90, 10.2)):
        nvml.util, now[0] = util, t
        s.sample_once()
    assert [x.utilization for x in s.nearest(10.12)] == [0.6, 0.6]
    assert s.nearest(9.0)[0].utilization == 0.1 and s.nearest(99.0)[0].utilization == 0.9
    first = s.latest()[0]
    assert (first.memory_used, first.power_w, first.sm_clock_mhz) == (10 << 30, 300.0, 1980.0)
    assert first.attributes()[sc.STEP_GPU_THROTTLE] == ["sw_power_cap"]
    assert s.device_name == "NVIDIA H100 80GB HBM3" and devices.lookup(s.device_name).name == "H100 SXM"
    assert throttle_names(0x1) == ()  # idle is not a slowdown


def test_sampler_metrics_follow_the_hardware_conventions():
    nvml = FakeNVML(count=1)
    s = GpuSampler(nvml, hz=10)
    s.sample_once()
    reader = InMemoryMetricReader()
    s.register_metrics(MeterProvider(metric_readers=[reader]).get_meter("t"))
    points = points_by_name(reader.get_metrics_data())
    (util,) = points["hw.gpu.utilization"]
    assert util.value == 0.5 and dict(util.attributes) == {sc.HW_ID: "GPU-0", sc.HW_NAME: "NVIDIA H100 80GB HBM3",
                                                           sc.HW_TYPE: "gpu", sc.HW_VENDOR: "NVIDIA"}
    assert points["hw.gpu.memory.usage"][0].value == 10 << 30 and points["hw.power"][0].value == 300.0
    (throttled,) = points["llm.gpu.throttled"]
    assert dict(throttled.attributes)[sc.GPU_THROTTLE_REASON] == "sw_power_cap"


def test_sampler_thread_samples_then_stops():
    nvml = FakeNVML(count=1)
    s = GpuSampler.start(50.0, nvml=nvml, devices=None)
    assert s is not None and nvml.inits == 1
    deadline = time.monotonic() + 30
    while len(s._ts) < 3 and time.monotonic() < deadline:  # the thread's own samples (not a timing claim)
        time.sleep(0.02)
    assert len(s._ts) >= 3
    s.close()
    assert nvml.shutdowns == 1 and not any(t.name == "otel-llm-gpu" and t.is_alive() for t in threading.enumerate())


class NoDriver:
    def nvmlInit(self):
        raise OSError("NVML Shared Library Not Found")


def test_without_nvml_nothing_no_thread_no_error():
    before = {t.ident for t in threading.enumerate()}
    assert GpuSampler.start(10.0, nvml=NoDriver()) is None
    assert GpuSampler.start(0.0, nvml=FakeNVML()) is None  # turned off
    assert GpuSampler.start(10.0, nvml=FakeNVML(count=0)) is None  # no device
    try:
        import pynvml  # the gpu extra (in the test extra too): a machine without a driver fails its init
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except ImportError:
        assert GpuSampler.start(10.0) is None  # no package: the same quiet None
    except pynvml.NVMLError:
        assert GpuSampler.start(10.0) is None  # the real package, no driver: None
    assert {t.ident for t in threading.enumerate()} == before
    h = Harness(sample_rate=0.0)
    h.telemetry.diagnosis.setup(ModelShape.from_hf_config(TINY), h.telemetry.config, on_gpu=True)
    assert h.telemetry.diagnosis.sampler is None and h.telemetry.diagnosis.peaks is None
    h.telemetry.close()


def test_visible_devices():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert visible_devices({}) is None and visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-abc"}) is None


def test_step_span_gets_the_gpu_sample_nearest_its_middle():
    nvml = FakeNVML(count=1)
    now = [0.0]
    sampler = GpuSampler(nvml, hz=10, clock=lambda: now[0])
    for util, t in ((10, 5.0), (70, 5.1), (20, 5.2)):
        nvml.util, now[0] = util, t
        sampler.sample_once()
    d = StepDiagnosis()
    d.sampler = sampler
    a = d.attributes(StepRecord(1, 5.08, 5.12, [("r", 1, False)]))
    assert a[sc.STEP_GPU_UTILIZATION] == 0.7 and a[sc.STEP_GPU_POWER] == 300.0
    assert a[sc.STEP_GPU_THROTTLE] == ["sw_power_cap"]


class FakeCudaEvent:
    """torch.cuda.Event's timing surface: record() stamps a fake device clock."""

    device_clock = [0.0]

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None
        self.done = True

    def record(self) -> None:
        self.at = self.device_clock[0]

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "FakeCudaEvent") -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as torch reports


def test_cuda_events_time_the_runner_and_are_read_only_when_done():
    hooks = model_timing.ModelTimer()
    hooks.timing, hooks.cuda_events = True, FakeCudaEvent
    clock = FakeCudaEvent.device_clock
    so = SimpleNamespace(num_scheduled_tokens={"d": 1})

    def forward(*a):
        clock[0] += 0.004  # the device works 4 ms on the forward
        return None

    def sample(*a):
        clock[0] += 0.001
        return SimpleNamespace(req_ids=["d"])
    hooks.execute_model(forward, None, (so,), {})
    out = hooks.sample_tokens(sample, None, (None,), {})
    assert getattr(out, model_timing.MODEL_TIME_ATTR) == pytest.approx(0.005) and not hooks.model
    assert len(hooks.event_pool) == 4  # read events are reused by the next steps
    hooks.execute_model(forward, None, (so,), {})
    assert len(hooks.event_pool) == 2
    begin, end = FakeCudaEvent(True), FakeCudaEvent(True)
    end.done = False
    assert hooks.cuda_seconds([(begin, end)]) is None  # never waits on the device


def test_step_metrics_per_phase_and_part_are_the_anatomy_of_each_step():
    """Step metrics go through per-phase bound recorders: each (phase, part) series holds exactly the
    anatomy of the steps of that phase, and a part the engine did not report has no series at all."""
    from otel_llm.core.diagnosis.anatomy import anatomy

    reader = InMemoryMetricReader()
    diagnosis = StepDiagnosis(MeterProvider(metric_readers=[reader]).get_meter("t"))
    shares = {"decode": [("a", 1, False), ("b", 1, False)], "prefill": [("c", 16, True)],
              "mixed": [("a", 1, False), ("c", 8, True)]}
    recorded = []
    for i, phase in enumerate(["decode", "prefill", "decode", "mixed", "decode"]):
        step = StepRecord(i, 10.0 + i, 10.5 + i * 1.25, list(shares[phase]))
        step.schedule_s, step.execute_s, step.output_s = 0.001 * (i + 1), 0.01 * (i + 1), 0.002
        step.idle_s = 0.1 if i % 2 else None  # reported for some steps only; model time never
        assert step.phase == phase
        recorded.append(step)
    diagnosis.record(recorded[:3])
    diagnosis.record(recorded[3:])
    expected: dict[tuple[str, str], list[float]] = {}
    for step in recorded:
        for part, value in anatomy(step).items():
            expected.setdefault((step.phase, part), []).append(value)
    points = points_by_name(reader.get_metrics_data())
    got = {(dict(p.attributes)[sc.STEP_PHASE], dict(p.attributes)[sc.STEP_PART]): p
           for p in points["llm.server.engine.step.duration"]}
    assert set(got) == set(expected) and not any(part == "model" for _, part in got)
    for key, values in expected.items():
        assert got[key].count == len(values) and got[key].sum == pytest.approx(sum(values))
    counts = {dict(p.attributes)[sc.STEP_PHASE]: p.value for p in points["llm.server.engine.steps"]}
    assert counts == {"decode": 3, "prefill": 1, "mixed": 1}
    # a batch's values are added as bucket counts at once: the same points as one record per value
    from otel_llm.core.metrics import STEP_DURATION, create
    one_by_one = InMemoryMetricReader()
    hist = create(MeterProvider(metric_readers=[one_by_one]).get_meter("t"), STEP_DURATION)
    for (phase, part), values in expected.items():
        for value in values:
            hist.record(value, {sc.STEP_PHASE: phase, sc.STEP_PART: part})
    for p in points_by_name(one_by_one.get_metrics_data())["llm.server.engine.step.duration"]:
        mine = got[dict(p.attributes)[sc.STEP_PHASE], dict(p.attributes)[sc.STEP_PART]]
        assert (list(mine.bucket_counts), mine.min, mine.max, mine.count) == (list(p.bucket_counts), p.min, p.max,
                                                                              p.count)
        assert list(mine.explicit_bounds) == list(p.explicit_bounds) and mine.sum == pytest.approx(p.sum)
        assert sum(mine.bucket_counts) == mine.count
