"""The agent process's collector (agent/process.tune_gc), set before the agent runs (its main's first step:
the real agent process's ``agent_gc_frozen`` in tests/agent/test_agent_link.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from otel_llm.agent.process import GC_THRESHOLD


def test_the_agent_process_freezes_what_start_up_made_and_widens_the_young_generation() -> None:
    probe = ("import gc, json; from otel_llm.agent import process as a; "
             "before = gc.get_threshold(); a.tune_gc(); "
             "print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout
    before, after, frozen = json.loads(out)
    assert tuple(after) == GC_THRESHOLD and after[0] > before[0]
    assert frozen > 0  # the modules and what they built: never scanned
