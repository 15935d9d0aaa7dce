"""The demo's scripted phases on the real engine, shortened: of the victim requests that breached in
each cause phase, at least 90 % carry the cause the phase was built for, and each phase has at least
five. A phase's load requests (documents, the first wave that fills the batch or the KV cache) are slow
by their own work or not at all: the tally counts them apart (``scenario.PhaseTally``).

Each phase's SLOs come from a quiet measurement just before it (``scenario.run_phases``), as in the
demo. What makes this hold on a loaded machine is the scenario's construction, not speed: arrivals are
counted in engine steps (EngineCore in this process); a burst three times ``max_num_seqs`` wide waits
whole waves of 96-token decodes against a TTFT SLO of 16 decode steps (or twice a quiet TTFT); the
squeeze needs more KV blocks than the cache holds; eight of a chat's eleven decode steps each prefill
two whole documents (four quiet decode steps or more) against a TPOT SLO of two quiet decode steps
(``scenario.DOCUMENTS_TPOT_FACTOR``).
"""

from __future__ import annotations

import contextlib
import gc

import pytest

from otel_llm import semconv as sc
from otel_llm.demo import console, scenario
from otel_llm.demo.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tallies(otel):
    import os

    from support.engine import in_process, prepare_env

    prepare_env()
    os.environ.setdefault("OMP_NUM_THREADS", scenario.ENGINE_ENV["OMP_NUM_THREADS"])  # torch reads it at import
    phases = scenario.phases(1)
    judged: list = []

    @contextlib.contextmanager
    def measure():
        with otel.instrumented(sample_rate=1.0, tail_quantile=0):
            yield lambda: console.request_attributes(otel.finished())

    @contextlib.contextmanager
    def judge(slo: str):
        # every request kept, with its engine steps: the breached ones are kept at any rate, so the tally is
        # the demo's; the steps are then all of the engine's (which requests a step served, and whether
        # those breached, is the machine's speed: a preempting step serves only the requests it kept)
        with otel.instrumented(slo=slo, sample_rate=1.0, baseline_detail="steps"):
            yield
            judged.extend(otel.finished())

    with in_process():
        with measure():  # built instrumented, and warmed up
            from vllm import LLM

            llm = LLM(model=ensure_tiny_model(), **scenario.ENGINE_ARGS)
            engine = llm.llm_engine
            scenario.drive(engine, scenario.renamed(scenario.measurement(phases[1]) + list(phases[1].arrivals),
                                                    "warm-"))
        runs = scenario.run_phases(engine, phases, measure, judge)
    steps = [s for s in judged if s.name == sc.SPAN_ENGINE_STEP]
    out = scenario.tally(phases, console.request_attributes(judged))
    del llm, engine
    gc.collect()
    return out, steps, runs


def test_each_phase_breaches_for_the_cause_it_was_built_for(tallies) -> None:
    out, _, runs = tallies
    table = "\n".join([*(f"{r.phase.name}: {r.baseline.describe()}" for r in runs), *console.verdict_table(out)])
    for t in out[1:]:
        assert t.breached >= 5, table
        assert t.right >= 0.9 * t.breached, table


def test_the_phases_ran_as_built(tallies) -> None:
    """What the engine's own steps show happened (not the verdict): a full batch, the KV cache's limit,
    preemptions and steps prefilling a whole document."""
    _, steps, _ = tallies
    attrs = [s.attributes for s in steps]
    assert any(a.get(sc.STEP_QUEUE_BLOCKED) == "max_seqs" for a in attrs)
    assert any(a.get(sc.STEP_QUEUE_BLOCKED) == "kv_cache" for a in attrs)
    assert any(a.get(sc.STEP_NUM_PREEMPTED, 0) > 0 for a in attrs)
    assert any(a.get(sc.STEP_NUM_PREFILL_TOKENS, 0) >= scenario.DOCUMENT_TOKENS for a in attrs)
