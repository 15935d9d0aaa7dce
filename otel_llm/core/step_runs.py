"""The pipeline's held engine steps grouped in runs: consecutive steps of one unchanged batch.

A request's own steps are looked up once, when it finishes (core/pipeline.py, ``_own_steps``): the steps held
since it started that name it. Step by step that is a set lookup per held step and per request, and a batch
that does not change runs for many steps: the step records of an unchanged batch share one id list (the
step wire sends a batch's ids once: instrumentation/vllm/step_wire.py), so they are kept here as one run, with
one id set, and a request's lookup reads one set per run and takes the run's steps as a slice.

A run's steps are held steps of consecutive ``seq`` (the pipeline numbers the steps it holds), so the steps
of a run from a given ``seq`` on are found by their offset. The pipeline releases its oldest steps first
(settled, or pushed out by ``max_steps``): ``drop_oldest`` follows it; a step taken out of the middle (an
engine step id seen again) makes the pipeline ``rebuild`` the runs from what it holds.
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from typing import Iterable

from .timeline import StepRecord

_COMPACT = 64  # released steps a run keeps before it drops them from its list (amortized: never one by one)


class _Run:
    __slots__ = ("ids", "members", "steps", "start")

    def __init__(self, step: StepRecord) -> None:
        self.ids = step.ids
        self.members: set[str] | None = None  # set(ids), once a lookup needs it
        self.steps = [step]
        self.start = 0  # steps[:start] were released


class StepRuns:
    """The held steps, in the order (and with the ``seq``) the pipeline holds them, as runs of one batch.
    Not locked: the pipeline calls it under its steps' lock."""

    def __init__(self) -> None:
        self._runs: deque[_Run] = deque()

    def add(self, step: StepRecord) -> None:
        """``step`` is held, after every step held so far (its ``seq`` set)."""
        runs = self._runs
        if runs:
            last = runs[-1]
            steps = last.steps
            if last.ids is step.ids and steps[-1].seq == step.seq - 1:
                steps.append(step)
                return
        runs.append(_Run(step))

    def drop_oldest(self) -> None:
        """The oldest held step was released."""
        runs = self._runs
        if not runs:
            return
        run = runs[0]
        run.start += 1
        if run.start >= len(run.steps):
            runs.popleft()
        elif run.start >= _COMPACT and run.start * 2 >= len(run.steps):  # a long steady batch: forget the released
            del run.steps[:run.start]
            run.start = 0

    def rebuild(self, held: Iterable[StepRecord]) -> None:
        """The runs of ``held`` (the pipeline's steps, in order), after a step left from the middle."""
        self._runs.clear()
        for step in held:
            self.add(step)

    def clear(self) -> None:
        self._runs.clear()

    def served(self, request_id: str, since: int) -> list[StepRecord]:
        """The held steps of ``seq >= since`` whose batch has ``request_id``, in order."""
        parts = []
        for run in reversed(self._runs):
            steps = run.steps
            if steps[-1].seq < since:
                break
            members = run.members
            if members is None:
                members = run.members = set(run.ids)
            if request_id in members:
                start = run.start
                first = steps[start].seq
                parts.append(steps[start if first >= since else start + since - first:])
        if len(parts) == 1:
            return parts[0]
        parts.reverse()
        return list(chain.from_iterable(parts))
