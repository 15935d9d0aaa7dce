"""The pipeline's held steps as runs of one batch: a request's own steps as a scan of every held step finds them."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from otel_llm.core.step_runs import StepRuns
from otel_llm.core.timeline import StepRecord


@pytest.mark.parametrize("change", [0.005, 0.3])  # long steady batches (compacted runs), and batches that change
def test_runs_find_what_a_scan_of_the_held_steps_finds(change: float) -> None:
    rng = random.Random(5)
    for _ in range(40):
        runs, held, seq, step_id = StepRuns(), OrderedDict(), 0, 0
        ids = ["a", "b"]
        for _ in range(400):
            if rng.random() < 0.6:  # a step held (now and then an id seen again: taken out of the middle)
                if rng.random() < change:
                    ids = rng.sample("abcdefgh", rng.randint(1, 5))  # a new batch: a new id list
                step_id += 1
                sid = rng.choice(list(held)) if held and rng.random() < 0.02 else step_id
                step = StepRecord.of_lists(sid, 0.0, 1.0, ids, None, ())
                seq += 1
                step.seq = seq
                if sid in held:
                    del held[sid]
                    held[sid] = step
                    runs.rebuild(held.values())
                else:
                    held[sid] = step
                    runs.add(step)
            else:  # the oldest released (settled, or pushed out)
                for _ in range(rng.randint(1, 5)):
                    if held:
                        held.popitem(last=False)
                        runs.drop_oldest()
            for rid in "abcdefghz":
                since = rng.randint(0, seq + 1)
                scan = [s for s in held.values() if s.seq >= since and rid in s.ids]
                assert [id(s) for s in runs.served(rid, since)] == [id(s) for s in scan]
    runs.clear()
    assert runs.served("a", 0) == []


def test_a_steady_batch_releases_its_old_steps() -> None:
    runs, ids = StepRuns(), ["a"]
    for seq in range(1, 1001):
        step = StepRecord.of_lists(seq, 0.0, 1.0, ids, None, ())
        step.seq = seq
        runs.add(step)
        if seq > 10:
            runs.drop_oldest()
    assert [s.seq for s in runs.served("a", 0)] == list(range(991, 1001))
    assert len(runs._runs[0].steps) < 200  # the released ones are not kept alive by the run
