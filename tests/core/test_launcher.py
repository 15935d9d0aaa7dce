"""Under ``opentelemetry-instrument`` in a clean venv with openai and without vLLM or TensorRT-LLM: the
instrumentors of the absent engines build nothing, and with nothing listening the script exits promptly.

The venv holds the wheel built from this checkout, openai and what both require (offline, from a wheelhouse
repacked from the running environment: tests/support/distributions.py); no ``OTEL_*`` endpoint is set, so our
providers export to the default ``localhost:4318``, where nothing may listen for this test to mean anything.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from otel_llm.core.providers import SHUTDOWN_S
from support.distributions import SDK, build_wheel, clean_env, closure, make_venv, repack

# what the launcher's sitecustomize does, with logging configured first so that our lines are seen
SCRIPT = """
import json, logging, sys, threading, time
records = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.name.startswith("otel_llm"):
            records.append((record.levelname, record.getMessage()))
logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.DEBUG)
if sys.argv[1] == "initialize":
    from opentelemetry.instrumentation.auto_instrumentation import initialize
    initialize()
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from otel_llm.instrumentation.openai import OpenAIInstrumentor
from otel_llm.instrumentation.tensorrt_llm import TensorRTLLMInstrumentor
from otel_llm.instrumentation.vllm import VLLMInstrumentor
import openai
try:  # one call, refused: an error span and its metrics wait for the exit's export
    openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0).embeddings.create(
        model="m", input="x")
except openai.APIConnectionError:
    pass
state = {c.__name__: {"instrumented": c().is_instrumented_by_opentelemetry,
                      "lifecycle": c().lifecycle is not None, "telemetry": c().telemetry is not None}
         for c in (OpenAIInstrumentor, TensorRTLLMInstrumentor, VLLMInstrumentor)}
print(json.dumps({"threads": sorted(t.name for t in threading.enumerate()), "state": state,
                  "records": records}), flush=True)
print("last line", time.time(), flush=True)
"""


def nothing_listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("launcher")
    wheel = build_wheel(SDK, root / "wheels", root / "src")
    house = root / "house"
    house.mkdir()
    for dist in closure(SDK.requirements() + [Requirement("openai")]).values():
        repack(dist, house)
    return make_venv(root / "venv", [wheel, house / next(p.name for p in house.glob("openai-*.whl"))], house)


def run(python: Path, how: str, tmp_path: Path, **otel: str) -> tuple[dict, float, str]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
    env.update(otel)
    cmd = ([str(python.parent / "opentelemetry-instrument"), str(python), str(script), "plain"]
           if how == "launcher" else [str(python), str(script), "initialize"])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    ended = time.time()
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    last = float(next(line for line in lines if line.startswith("last line")).split()[-1])
    return json.loads(lines[0]), ended - last, proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_absent_engines_build_nothing_and_the_script_exits_promptly(venv_python: Path, tmp_path: Path):
    if not nothing_listens(4318):
        pytest.skip("something listens on localhost:4318 (the OTLP/HTTP default this test must find closed)")
    out, after_last_line, stderr = run(venv_python, "launcher", tmp_path)
    state = out["state"]
    for absent in ("TensorRTLLMInstrumentor", "VLLMInstrumentor"):
        assert state[absent] == {"instrumented": False, "lifecycle": False, "telemetry": False}, absent
    assert state["OpenAIInstrumentor"]["instrumented"] is True  # openai is here: ours runs
    # one provider pair (openai's): one batch span processor and one metric reader, nothing else of ours
    workers = [t for t in out["threads"] if t != "MainThread"]
    assert sorted(workers) == ["OtelBatchSpanRecordProcessor", "OtelPeriodicExportingMetricReader"], workers
    # The bounded shutdown (providers.SHUTDOWN_S for both signals) with the exports refused: what exiting
    # costs beyond the same script exporting nothing (interpreter teardown, which the machine's load decides).
    # Unbounded, the SDK's retry back-off held the exit for its 10 s export timeout per signal.
    _, baseline, _ = run(venv_python, "launcher", tmp_path, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    assert after_last_line - baseline < SHUTDOWN_S + 0.5, (after_last_line, baseline, stderr[-3000:])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_launcher_logs_one_debug_line_per_absent_engine_and_one_info_line(venv_python: Path, tmp_path: Path):
    out, _, _ = run(venv_python, "initialize", tmp_path)
    ours = out["records"]
    debug = [m for level, m in ours if level == "DEBUG"]
    assert len([m for m in debug if "VLLMInstrumentor" in m]) == 1, ours
    assert len([m for m in debug if "TensorRTLLMInstrumentor" in m]) == 1, ours
    info = [m for level, m in ours if level == "INFO"]
    assert len(info) == 1, ours
    assert "http://localhost:4318/v1/traces" in info[0] and "http://localhost:4318/v1/metrics" in info[0], info
    assert not [m for level, m in ours if level in ("WARNING", "ERROR")], ours
