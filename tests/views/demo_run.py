"""The demo's phases on one real engine, as the demo runs them, for the phase tests (one engine a module)."""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any

from otel_llm import semconv as sc
from otel_llm.demo import console, scenario
from otel_llm.demo.tiny_model import ensure_tiny_model


def run_on_engine(otel, these: list[scenario.Phase], engine_args: dict[str, Any], adapters=None):
    """Build the engine instrumented, warm it up, run ``these`` phases (each after its quiet measurement);
    returns (tally of ``these``, the engine-step spans, the phase runs)."""
    from support.engine import in_process, prepare_env

    prepare_env()
    os.environ.setdefault("OMP_NUM_THREADS", scenario.ENGINE_ENV["OMP_NUM_THREADS"])  # torch reads it at import
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

            llm = LLM(model=ensure_tiny_model(), **engine_args)
            engine = llm.llm_engine
            scenario.warm_up(engine, these, adapters)
        runs = scenario.run_phases(engine, these, measure, judge, adapters=adapters)
    steps = [s for s in judged if s.name == sc.SPAN_ENGINE_STEP]
    out = scenario.tally(these, console.request_attributes(judged))
    del llm, engine
    gc.collect()
    return out, steps, runs, judged


def assert_breached_for_the_phase(out, runs) -> None:
    """Each cause phase: at least five victims breached, at least 90 % of them with the phase's cause."""
    table = "\n".join([*(f"{r.phase.name}: {r.baseline.describe()}" for r in runs), *console.verdict_table(out)])
    for t in out:
        if t.phase.causes:
            assert t.breached >= 5, table
            assert t.right >= 0.9 * t.breached, table
