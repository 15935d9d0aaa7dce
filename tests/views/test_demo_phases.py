"""The demo's scripted phases on the real engine, shortened: of the victim requests that breached in each
cause phase, at least 90 % carry the cause the phase was built for, and each phase has at least five. A
phase's load requests (documents, the first wave that fills the batch or the KV cache) are slow by their
own work or not at all: the tally counts them apart (``scenario.PhaseTally``).

Each phase's SLOs come from the fastest of three quiet measurements just before it, after a warm-up of
every batch shape (``scenario.run_phases``, ``scenario.warm_up``), as in the demo. What makes this hold
on a loaded machine is the scenario's construction, not speed: arrivals are counted in engine steps
(EngineCore in this process); a burst three times ``max_num_seqs`` wide waits whole waves of 96-token
decodes against a TTFT SLO of 16 decode steps (or twice a quiet TTFT); the squeeze needs more KV blocks
than the cache holds, and its seven victims wait for another's whole life; eight of a chat's eleven
decode steps each prefill two whole documents (four quiet decode steps or more) against a TPOT SLO of
one and a half quiet decode steps (``scenario.DOCUMENTS_TPOT_FACTOR``). The engine is ``scenario.ENGINE_ARGS``,
LoRA off: the LoRA phase runs on an engine of its own (test_demo_lora_phase.py; why:
``scenario.LORA_ENGINE_ARGS``).
"""

from __future__ import annotations

import pytest

from demo_run import assert_breached_for_the_phase, run_on_engine
from otel_llm import semconv as sc
from otel_llm.demo import scenario

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tallies(otel):
    these = [p for p in scenario.phases(1) if not p.lora]
    return run_on_engine(otel, these, scenario.ENGINE_ARGS)


def test_each_phase_breaches_for_the_cause_it_was_built_for(tallies) -> None:
    out, _, runs, _ = tallies
    assert [t.phase.name for t in out] == [scenario.QUIET, scenario.DOCUMENTS, scenario.BURST, scenario.SQUEEZE]
    assert_breached_for_the_phase(out, runs)


def test_the_phases_ran_as_built(tallies) -> None:
    """What the engine's own steps show happened (not the verdict): a full batch, the KV cache's limit,
    preemptions and steps prefilling a whole document."""
    _, steps, _, _ = tallies
    attrs = [s.attributes for s in steps]
    assert any(a.get(sc.STEP_QUEUE_BLOCKED) == "max_seqs" for a in attrs)
    assert any(a.get(sc.STEP_QUEUE_BLOCKED) == "kv_cache" for a in attrs)
    assert any(a.get(sc.STEP_NUM_PREEMPTED, 0) > 0 for a in attrs)
    assert any(a.get(sc.STEP_NUM_PREFILL_TOKENS, 0) >= scenario.DOCUMENT_TOKENS for a in attrs)


def test_each_request_span_holds_the_slos_of_its_phase(tallies) -> None:
    """The SLOs a request was judged against are on its span (``llm.slo.<objective>``): its phase's."""
    _, _, runs, judged = tallies
    from otel_llm.core.slo import SLO

    by_phase = {r.phase.name: SLO.parse(r.slo) for r in runs}
    owner = {a.request_id: p.name for r in runs for p in [r.phase] for a in p.arrivals}
    checked = 0
    for span in judged:
        a = span.attributes
        phase = owner.get(str(a.get(sc.RESPONSE_ID, "")))
        if phase is None or span.parent is not None:
            continue
        slo = by_phase[phase]
        assert (a[sc.SLO_TTFT], a[sc.SLO_TPOT]) == (slo.ttft, slo.tpot) and sc.SLO_E2E not in a
        checked += 1
    assert checked >= sum(len(r.phase.arrivals) for r in runs) // 2
