"""Engine time and interference caused, worked out once a step and kept for every request the step served
(core/diagnosis/engine_time.py ``StepTime``): the same seconds as working each request out on its own."""

from __future__ import annotations

import random

import pytest

from otel_llm.core.diagnosis.engine_time import StepTime, engine_time, interference_caused, work_shares
from otel_llm.core.diagnosis.roofline import DevicePeaks, ModelShape, step_cost
from otel_llm.core.diagnosis.verdict import StepWindow
from otel_llm.core.timeline import PrefillChunk, StepRecord

SHAPE = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)
MOE = ModelShape(layers=4, hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=256, vocab=1000,
                 experts=8, experts_per_token=2, shared_intermediate=128)
PEAKS = DevicePeaks("H100", 9.89e14, 3.35e12)


def reference_shares(tokens, n, contexts, shape, peaks) -> list[float]:
    """The roofline split as the formula reads, one ``step_cost`` a share."""
    counts = list(tokens) if tokens is not None else [1] * n
    weights = step_cost(shape, ()).bytes
    times = []
    for k, c in zip(counts, contexts):
        cost = step_cost(shape, ((k, c),))
        own = max(0.0, cost.bytes - weights) + weights / n
        times.append(max(cost.flops / peaks.flops, own / peaks.bandwidth))
    return [t / sum(times) for t in times]


@pytest.mark.parametrize("shape", [SHAPE, MOE])
def test_the_roofline_split_equals_one_step_cost_a_share(shape: ModelShape) -> None:
    rng = random.Random(3)
    for _ in range(50):
        n = rng.randint(1, 40)
        tokens = [rng.choice((1, 1, 1, rng.randint(1, 4096))) for _ in range(n)]
        contexts = [rng.randint(0, 100_000) for _ in range(n)]
        assert work_shares(tokens, n, contexts, shape, PEAKS) == pytest.approx(
            reference_shares(tokens, n, contexts, shape, PEAKS), rel=1e-9)
        assert work_shares(None, n, contexts, shape, PEAKS) == pytest.approx(
            reference_shares(None, n, contexts, shape, PEAKS), rel=1e-9)


def batch(seed: int, steps: int = 60) -> tuple[list[StepRecord], list[float]]:
    """A continuous batch: requests join with prompt chunks beside decodes, others leave; consecutive steps of
    an unchanged batch share their id list, as the step decoder hands them over."""
    rng = random.Random(seed)
    running: dict[str, int] = {}  # request -> context
    out, busy, t, next_id = [], [], 0.0, 0
    ids: list[str] = []
    for k in range(steps):
        changed = False
        for rid in [r for r in running if rng.random() < 0.05]:
            del running[rid]
            changed = True
        new = []
        while len(running) + len(new) < 8 and rng.random() < 0.5:
            new.append(f"r{next_id}")
            next_id += 1
        if new or changed or not ids:
            ids = [*running, *new]
        tokens = [1] * len(running) + [rng.randint(16, 300) for _ in new]
        contexts = [*running.values(), *([0] * len(new))]
        step = StepRecord.of_lists(k + 1, t, t + 0.01 + 0.0001 * sum(tokens), ids,
                                   None if not new else tokens, tuple(range(len(running), len(ids))))
        step.contexts = contexts
        t = step.end
        out.append(step)
        busy.append(step.end - step.start)
        for rid, n in zip(ids, tokens):
            running[rid] = running.get(rid, 0) + n
    return out, busy


@pytest.mark.parametrize("shape", [SHAPE, MOE])
def test_a_batch_of_equal_shares_splits_as_the_formula_reads(shape: ModelShape) -> None:
    # a decode batch (and any step of equal shares) bytes-bound at both ends of its contexts takes each share's
    # time in one expression; one near the crossover, or compute-bound, takes the loop: the same split either way
    rng = random.Random(5)
    for k in (None, 1, 4, 64, 512, 4096):
        for _ in range(20):
            n = rng.randint(1, 48)
            top = rng.choice((10, 2_000, 100_000))
            contexts = [rng.randint(0, top) for _ in range(n)]
            tokens = None if k is None else [k] * n
            assert work_shares(tokens, n, contexts, shape, PEAKS) == pytest.approx(
                reference_shares(tokens, n, contexts, shape, PEAKS), rel=1e-12)


@pytest.mark.parametrize("shape, peaks", [(None, None), (SHAPE, PEAKS)])
def test_a_steps_split_kept_for_its_requests_gives_each_what_it_gets_alone(shape, peaks) -> None:
    steps, busy = batch(1)
    held = {s.step_id: StepTime(b) for s, b in zip(steps, busy)}
    requests = sorted({rid for s in steps for rid in s.ids})
    shared, alone = {}, {}
    for rid in requests:
        own = [s for s in steps if rid in s.ids]
        shared[rid] = engine_time(rid, own, held, shape, peaks)
        alone[rid] = engine_time(rid, own, [b for s, b in zip(steps, busy) if rid in s.ids], shape, peaks)
    assert shared == pytest.approx(alone, rel=1e-12)
    assert sum(shared.values()) == pytest.approx(sum(busy))  # every step charged once, whole
    assert any(h.parts is not None for h in held.values())  # the steps with prompt chunks kept their split
    assert engine_time("nobody", steps, held, shape, peaks) == 0.0


@pytest.mark.parametrize("shape, peaks", [(None, None), (SHAPE, PEAKS)])
def test_a_requests_own_steps_read_without_membership_give_what_the_membership_test_gives(shape, peaks) -> None:
    # the pipeline's StepTimes keep a plain decode batch's even part (its shares given: one token each)
    steps, busy = batch(1)
    held = {s.step_id: StepTime(b, len(s.ids) if s.tokens is None else None) for s, b in zip(steps, busy)}
    assert any(h.even is not None for h in held.values()) and any(h.even is None for h in held.values())
    for rid in sorted({rid for s in steps for rid in s.ids}):
        own = [s for s in steps if rid in s.ids]
        reference = engine_time(rid, own, [b for s, b in zip(steps, busy) if rid in s.ids], shape, peaks)
        assert engine_time(rid, own, held, shape, peaks, served=True) == pytest.approx(reference, rel=1e-12)
    # a step held without its StepTime counts its duration, as without ``served``
    rid = steps[0].ids[0]
    own = [s for s in steps if rid in s.ids]
    partial = {k: v for k, v in held.items() if k != own[-1].step_id}
    assert engine_time(rid, own, partial, shape, peaks, served=True) == pytest.approx(
        engine_time(rid, own, partial, shape, peaks), rel=1e-12)


def test_a_steps_prefill_loss_kept_for_its_prompts_gives_each_what_it_gets_alone() -> None:
    window = StepWindow(256)
    engine = 3 << 32
    steps, busy = batch(2, steps=120)
    for s in steps:
        s.step_id |= engine
        window.add(s, s.prefill_tokens, s.decode_requests)
    held = {s.step_id: StepTime(b) for s, b in zip(steps, busy)}
    charged = 0
    for s in steps:
        for i in s.prefill_at:
            chunk = [PrefillChunk(s.step_id, s.start, s.end, s.tokens[i])]
            alone = interference_caused(chunk, window)
            assert interference_caused(chunk, window, held) == alone
            charged += alone > 0
    assert charged  # the workload has prompts that cost their neighbours something
    # a prompt in two chunks (two steps) reads its own range: not what one step keeps
    two = [s for s in steps if s.prefill_at][:2]
    chunks = [PrefillChunk(s.step_id, s.start, s.end, s.tokens[s.prefill_at[0]]) for s in two]
    assert interference_caused(chunks, window, held) == interference_caused(chunks, window)
