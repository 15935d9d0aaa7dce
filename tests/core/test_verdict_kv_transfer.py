"""The ``kv_transfer`` cause: a decode instance's KV load, against comparable loads on that instance."""

from __future__ import annotations

import time

import pytest

from otel_llm import semconv as sc
from otel_llm.core.diagnosis.verdict import StepWindow, decide
from otel_llm.core.handoff import HandoffHistory, KVHandoff
from otel_llm.core.timeline import QUEUED, SCHEDULED, PrefillChunk, RequestTimeline, StepRecord

ENGINE = 9 << 32
STEP = 0.010


def _decode_request(window: StepWindow, rid: str, load_s: float, tokens: int, start: float) -> RequestTimeline:
    """One request on a decode instance: its first step loads ``tokens`` external tokens (``load_s`` of it)
    and computes the rest of the prompt; then four decode steps, nothing else in the engine."""
    t = RequestTimeline(rid, time.time(), model="m", response_id=rid)
    t.events += [(QUEUED, start), (SCHEDULED, start)]
    now = start
    for i in range(5):
        step_id = ENGINE | int(start * 1000) + i
        dur = STEP + (load_s if i == 0 else 0.0)
        rec = StepRecord(step_id, now, now + dur, [(rid, 8 if i == 0 else 1, i == 0)], 1, 0, 0, None)
        window.add(rec, 8 if i == 0 else 0, 0 if i == 0 else 1)
        t.steps.append(step_id)
        if i == 0:
            t.chunks.append(PrefillChunk(step_id, now, now + dur, 8))
        t.token_ts.append(now + dur)
        now += dur
    t.handoff = KVHandoff(rid, external_tokens=tokens, load_start=start, load_end=start + load_s, load_s=load_s)
    return t


def test_a_load_slower_than_comparable_ones_is_charged_to_kv_transfer():
    window = StepWindow()
    for i in range(5):  # the usual: 64-token loads of 20 ms
        window.handoffs.add(_decode_request(window, f"u{i}", 0.020, 64, 10.0 + i).handoff)
    slow = _decode_request(window, "slow", 0.500, 100, 20.0)  # 64..127: comparable
    v = decide(slow, window, ("ttft",))
    assert v.cause == sc.SLOW_KV_TRANSFER
    assert v.seconds[sc.SLOW_KV_TRANSFER] == pytest.approx(0.480)
    assert v.attributes()[sc.SLOW_SECONDS[sc.SLOW_KV_TRANSFER]] == pytest.approx(0.48)


def test_no_charge_without_comparable_loads_or_for_a_usual_one():
    window = StepWindow()
    for i in range(5):
        window.handoffs.add(_decode_request(window, f"u{i}", 0.020, 64, 10.0 + i).handoff)
    # a 500-token load has no comparable history (64-token loads are another size): nothing charged
    big = _decode_request(window, "big", 0.500, 500, 20.0)
    assert decide(big, window, ("ttft",)).seconds[sc.SLOW_KV_TRANSFER] == 0.0
    usual = _decode_request(window, "usual", 0.020, 64, 30.0)
    assert decide(usual, window, ("ttft",)).seconds[sc.SLOW_KV_TRANSFER] == 0.0


def test_the_history_compares_by_size_and_needs_samples():
    h = HandoffHistory(per_size=4, min_samples=3)
    for s in (0.1, 0.2):
        h.add(KVHandoff("a", external_tokens=40, load_start=0.0, load_end=s, load_s=s))
    assert h.median(40) is None
    h.add(KVHandoff("a", external_tokens=63, load_start=0.0, load_end=0.3, load_s=0.3))
    assert h.median(32) == pytest.approx(0.2) and h.median(64) is None
    h.add(KVHandoff("save-only", save_start=0.0, save_end=1.0, save_s=1.0))  # not a load: not counted
    assert h.median(40) == pytest.approx(0.2)
