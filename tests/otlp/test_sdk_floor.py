"""Direct export's lower bound of opentelemetry-sdk, tested: the fence and the direct-export tests run
in a fresh venv holding exactly the oldest SDK and OTLP exporters pyproject.toml allows
(``sdk_bridge.MIN_SDK``): the bytes we write equal that release's own encoder's, and spans go out
through its exporters over HTTP and gRPC."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from otel_llm.otlp.sdk_bridge import MIN_SDK

ROOT = Path(__file__).resolve().parents[2]
FLOOR = [f"opentelemetry-sdk=={MIN_SDK}", f"opentelemetry-exporter-otlp-proto-http=={MIN_SDK}",
         f"opentelemetry-exporter-otlp-proto-grpc=={MIN_SDK}",
         # direct export suppresses instrumentation around its sends (opentelemetry.instrumentation.utils):
         # the instrumentation release made beside that SDK (the same semantic-conventions pin)
         "opentelemetry-instrumentation==0.55b0", "pytest>=8"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_fence_and_direct_export_pass_with_the_oldest_supported_sdk(tmp_path: Path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-input", *FLOOR],
                         capture_output=True, text=True, env=env, timeout=600)
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}"
    got = subprocess.run([str(py), "-c", "from importlib.metadata import version as v; print(v('opentelemetry-sdk'))"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert got.stdout.strip() == MIN_SDK
    # the repository's own code, not an installed copy; no conftest (it starts vLLM)
    run = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                          "-o", "addopts=", "tests/otlp/test_sdk_bridge.py", "tests/otlp/test_otlp_wire.py"],
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0, f"with opentelemetry-sdk {MIN_SDK}:\n{run.stdout[-5000:]}\n{run.stderr[-2000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout
