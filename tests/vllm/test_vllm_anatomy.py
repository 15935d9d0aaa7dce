"""Step anatomy and roofline on the real vLLM engine (EngineCore in its own process, UniProcExecutor)."""

from __future__ import annotations

import time

import pytest

from otel_llm import semconv as sc
from support.traces import engine_steps

pytestmark = pytest.mark.engine

PROMPTS = [{"prompt_token_ids": [3 + (j * 7) % 500 for j in range(1 + 23 * i)]} for i in range(8)]
PEAK_FLOPS, PEAK_BW = 1e11, 2e10  # CPU peaks given as options (there is no CPU row in the table)


@pytest.fixture(scope="module")
def two_waves(llm, otel):
    """Two waves of requests with the engine left without work in between; everything kept."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    # a TPOT SLO below any gap makes every decode step eventful (its own span, not a decode window), so
    # every engine step is behind some kept request's own span and gets an engine-step span
    with otel.instrumented(sample_rate=1.0, baseline_detail="steps", tail_quantile=0, slo="tpot=0.000000001",
                           peak_flops=PEAK_FLOPS, peak_memory_bandwidth=PEAK_BW):
        llm.generate(PROMPTS, params, use_tqdm=False)
        wave1_done = time.monotonic()  # the engine's last step of wave 1 ended before this
        time.sleep(0.3)  # the pause itself: the assertion uses the measured stamps, not this figure
        wave2_sent = time.monotonic()  # ... and its first of wave 2 starts after this
        llm.generate(PROMPTS, params, use_tqdm=False)
        spans = otel.finished()
        counted = otel.counter("llm.server.engine.steps")
        parts = otel.histogram("llm.server.engine.step.duration")
    steps = sorted(engine_steps(spans), key=lambda s: s.start_time)
    return steps, wave1_done, wave2_sent, counted, parts


def test_anatomy_sums_to_the_step_duration(two_waves):
    steps, *_ = two_waves
    assert len(steps) > 10
    for s in steps:
        a = s.attributes
        duration = (s.end_time - s.start_time) / 1e9
        parts = a[sc.STEP_SCHEDULE_TIME] + a[sc.STEP_EXECUTE_TIME] + a[sc.STEP_OUTPUT_TIME]
        assert parts == pytest.approx(duration, abs=1e-3)
        assert min(a[sc.STEP_SCHEDULE_TIME], a[sc.STEP_EXECUTE_TIME], a[sc.STEP_OUTPUT_TIME]) >= 0
        # the model runner runs inside the executor's call, in the EngineCore process (UniProcExecutor)
        assert 0 < a[sc.STEP_MODEL_TIME] <= a[sc.STEP_EXECUTE_TIME] + 1e-6


def test_idle_gap_appears_when_the_load_stops_and_resumes(two_waves):
    steps, wave1_done, wave2_sent, *_ = two_waves
    offset = time.time() - time.monotonic()  # spans are on the wall clock, our stamps on the monotonic one
    first_of_wave2 = next(s for s in steps if s.start_time / 1e9 - offset > wave2_sent)
    gap = first_of_wave2.attributes[sc.STEP_IDLE_BEFORE]
    assert gap >= wave2_sent - wave1_done  # the engine had nothing to do for at least the pause we made
    # within a wave a step's idle time is at most the time since the step before it ended
    for prev, s in zip(steps, steps[1:]):
        if s is first_of_wave2:
            continue
        idle = s.attributes[sc.STEP_IDLE_BEFORE]
        assert 0 <= idle <= (s.start_time - prev.end_time) / 1e9 + 1e-3


def test_roofline_on_every_step(two_waves):
    steps, *_ = two_waves
    for s in steps:
        a = s.attributes
        assert a[sc.STEP_FLOPS] > 0 and a[sc.STEP_BYTES] > 0
        assert a[sc.STEP_INTENSITY] == pytest.approx(a[sc.STEP_FLOPS] / a[sc.STEP_BYTES])
        assert a[sc.STEP_BOUND] == ("compute" if a[sc.STEP_INTENSITY] >= PEAK_FLOPS / PEAK_BW else "memory")
        assert a[sc.STEP_MFU] == pytest.approx(a[sc.STEP_FLOPS] / a[sc.STEP_MODEL_TIME] / PEAK_FLOPS)
        assert a[sc.STEP_MBU] == pytest.approx(a[sc.STEP_BYTES] / a[sc.STEP_MODEL_TIME] / PEAK_BW)
    # the composition arrived: FLOPs = the matmuls of the step's tokens + the LM head of its requests
    # + attention, and every token attends to at least itself (what the scheduler batched is its choice)
    import json
    from pathlib import Path

    from otel_llm.core.diagnosis.roofline import ModelShape
    from support.tiny_model import ensure_tiny_model

    shape = ModelShape.from_hf_config(json.loads((Path(ensure_tiny_model()) / "config.json").read_text()))
    per_key = 4 * shape.layers * shape.heads * shape.head_dim
    for s in steps:
        a = s.attributes
        tokens = a[sc.STEP_NUM_PREFILL_TOKENS] + a[sc.STEP_NUM_DECODE_TOKENS]
        attention = a[sc.STEP_FLOPS] - 2 * shape.active_params * tokens - 2 * shape.hidden * shape.vocab * a[
            sc.STEP_BATCH_SIZE]
        assert attention >= per_key * tokens - 1e-6
        assert a[sc.STEP_BYTES] >= shape.weight_bytes * shape.active_params


def test_step_metrics_count_each_step_once(two_waves):
    steps, _, _, counted, parts = two_waves
    assert counted == len(steps)  # every request kept: every step has a span, and is counted once
    totals = [p for p in parts if dict(p.attributes)[sc.STEP_PART] == "total"]
    assert sum(p.count for p in totals) == len(steps)
    assert sum(p.sum for p in totals) == pytest.approx(sum((s.end_time - s.start_time) / 1e9 for s in steps),
                                                       abs=1e-3 * len(steps))
