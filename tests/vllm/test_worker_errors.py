"""Errors caught in a vLLM worker process reach the frontend's ``otel_llm.stats()`` (engine_errors.py's
worker channel), on the real engine: the multiprocess executor with one worker (``distributed_executor_backend
="mp"``, which the CPU build runs), the EngineCore spawned as usual, our model-runner timer made to fail in the
worker only by a test-only sitecustomize. The host's ``generate()`` is untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]  # one engine in a child process, started cold

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = "vLLM worker: model runner timer"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    marks = tmp_path_factory.mktemp("marks")
    result = marks.parent / "result.json"
    env = dict(os.environ, OTEL_LLM_TEST_MARKS=str(marks), OTEL_LLM_TEST_RESULT=str(result),
               PYTHONPATH=os.pathsep.join([os.path.join(TESTS, "support", "worker_fault_site"), TESTS,
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    proc = subprocess.run([sys.executable, "-m", "support.worker_fault_run"], cwd=TESTS, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(result.read_text()), sorted(os.listdir(marks))


def test_the_fault_was_in_a_worker_process(run):
    result, marks = run
    assert marks and all(m.startswith("VllmWorker") for m in marks), marks
    assert str(result["pid"]) not in " ".join(marks)


def test_generate_is_untouched(run):
    result, _ = run
    assert result["generated"] == [8, 8, 8, 8, 2]


def test_the_workers_errors_are_counted_and_said_in_the_frontend(run):
    result, _ = run
    errors = result["stats"]["errors"]
    assert errors.get(SITE, 0) >= 1, errors
    assert "model runner timer" not in errors  # the frontend's own hooks did not fail: the worker's did
    said = [m for level, m in result["log"] if level == "WARNING" and "vLLM worker process" in m]
    assert len(said) == 1 and "model runner timer" in said[0], result["log"]
