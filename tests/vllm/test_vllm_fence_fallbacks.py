"""Acceptance of the vLLM contract on the real engine (EngineCore spawned as usual): vLLM symbols removed
in every process by a test-only sitecustomize, as a release without them would be.

* ``NewRequestData.prompt_len`` (a property only from vLLM 0.29 on) removed: every engine step is still
  recorded, through the contract's fallback ``len(prompt_token_ids)``; prefill chunks add up to each prompt.
* ``LLM.chat`` (a wrapped symbol with no fallback) removed: one warning in the frontend's log names it and the
  feature that is off, and ``otel_llm.stats()`` counts the loss.
* The host's ``generate()`` is untouched in both: every request generates all its tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]  # one engine in a child process, started cold

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOVED = ("vllm.v1.core.sched.output:NewRequestData.prompt_len", "vllm.entrypoints.llm:LLM.chat")


@pytest.fixture(scope="module")
def fenced(tmp_path_factory):
    marks = tmp_path_factory.mktemp("marks")
    result = marks.parent / "result.json"
    env = dict(os.environ, OTEL_LLM_TEST_REMOVE=",".join(REMOVED), OTEL_LLM_TEST_MARKS=str(marks),
               OTEL_LLM_TEST_RESULT=str(result),
               PYTHONPATH=os.pathsep.join([os.path.join(TESTS, "support", "fence_site"), TESTS,
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the EngineCore in its own process, as by default
    proc = subprocess.run([sys.executable, "-m", "support.fenced_run"], cwd=TESTS, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(result.read_text()), sorted(os.listdir(marks))


def test_the_symbols_were_removed_in_the_frontend_and_the_engine_core(fenced):
    _, marks = fenced
    assert any(m.startswith("EngineCore") and m.endswith("NewRequestData.prompt_len") for m in marks), marks
    assert any(m.startswith("MainProcess") and m.endswith("LLM.chat") for m in marks), marks


def test_generate_is_untouched(fenced):
    result, _ = fenced
    assert len(result["requests"]) == 8
    assert all(r["generated"] == 6 for r in result["requests"])


def test_every_step_is_recorded_through_the_prompt_len_fallback(fenced):
    result, _ = fenced
    vllm_stats = result["stats"]["vllm"]
    assert result["steps"] > 0 and vllm_stats["steps_recorded"] >= result["steps"]
    for r in result["requests"]:  # each prefill chunk is a step record that admitted or continued the prompt
        assert r["chunk_tokens"] == r["prompt"] and r["chunk_steps_linked"], r
    assert not [m for level, m in result["log"] if level == "WARNING" and "prompt_len" in m]


def test_a_symbol_without_fallback_warns_once_and_is_counted(fenced):
    result, _ = fenced
    said = [m for level, m in result["log"] if level == "WARNING" and "LLM.chat" in m]
    assert len(said) == 1, result["log"]
    assert "the chat operation of LLM.chat requests off" in said[0] and "vllm.entrypoints.llm" in said[0]
    assert result["stats"]["errors"].get("vllm contract: LLM.chat") == 1
    assert not [k for k in result["stats"]["errors"] if not k.startswith("vllm contract")], result["stats"]["errors"]
