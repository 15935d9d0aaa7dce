"""The demo's LoRA phase on its own real engine (``scenario.LORA_ENGINE_ARGS``: one LoRA slot), shortened:
of the second adapter's requests that breached, at least 90 % waited for the slot (``queue_lora_slot``),
and at least five breached.

Construction, not speed: each wave's first-adapter requests hold the slot for 128 decode steps
(``scenario.LORA_HOLD_TOKENS``); the second adapter's arrive two steps later and are skipped by the
scheduler until the slot is free (126 decode steps, the batch half empty) against a TTFT SLO of 16 quiet
decode steps (or twice a quiet TTFT, with the adapter already in the slot), from the fastest of three
quiet measurements taken after a warm-up of every batch shape (``scenario.warm_up``). The engine is
built under the quiet measurement's instrumentation and judged under another: the verdict still knows
the engine's ``max_loras`` (the instrumentor keeps it with the last engine's shape).
"""

from __future__ import annotations

import pytest

from demo_run import assert_breached_for_the_phase, run_on_engine
from otel_llm import semconv as sc
from otel_llm.demo import scenario

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tallies(otel, tmp_path_factory):
    these = [p for p in scenario.phases(1) if p.lora]
    adapters = scenario.adapter_requests(tmp_path_factory.mktemp("adapters"))
    return run_on_engine(otel, these, scenario.LORA_ENGINE_ARGS, adapters)


def test_the_second_adapter_breaches_waiting_for_the_slot(tallies) -> None:
    out, _, runs, _ = tallies
    assert [t.phase.name for t in out] == [scenario.LORA]
    assert_breached_for_the_phase(out, runs)


def test_steps_ran_one_adapter_of_one_slot(tallies) -> None:
    _, steps, _, _ = tallies
    attrs = [s.attributes for s in steps if sc.STEP_LORA_ADAPTERS in s.attributes]
    assert {tuple(a[sc.STEP_LORA_ADAPTERS]) for a in attrs} == {(scenario.LORA_HELD,), (scenario.LORA_WAITING,)}
    assert all(a[sc.STEP_LORA_MAX] == 1 for a in attrs)
