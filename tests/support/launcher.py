"""A script under ``opentelemetry-instrument`` in a clean venv with openai and without vLLM or TensorRT-LLM:
what it built and how long its exit took after its last line (tests/core/test_launcher.py, and the ``exit``
section of benchmarks/core_costs.py).

The venv holds the wheel built from this checkout, openai and what both require (offline, from a wheelhouse
repacked from the running environment: distributions.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

from packaging.requirements import Requirement

from .distributions import SDK, build_wheel, clean_env, closure, make_venv, repack

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



def nothing_listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def launcher_venv(root: Path) -> Path:
    """The clean venv's python, built under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(SDK, root / "wheels", root / "src")
    house = root / "house"
    house.mkdir()
    for dist in closure(SDK.requirements() + [Requirement("openai")]).values():
        repack(dist, house)
    return make_venv(root / "venv", [wheel, house / next(p.name for p in house.glob("openai-*.whl"))], house)


def run(python: Path, how: str, tmp_path: Path, **otel: str) -> tuple[dict, float, str]:
    """Run the script in ``tmp_path`` (``how``: "launcher" under ``opentelemetry-instrument``, "initialize"
    calling its ``initialize()`` itself) with no ``OTEL_*`` but ``otel``: what it printed, the seconds from
    its last line to its exit, its stderr."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
    env.update(otel)
    cmd = ([str(python.parent / "opentelemetry-instrument"), str(python), str(script), "plain"]
           if how == "launcher" else [str(python), str(script), "initialize"])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"the script failed ({proc.returncode}): {proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    last = float(next(line for line in lines if line.startswith("last line")).split()[-1])
    return json.loads(lines[0]), ended - last, proc.stderr
