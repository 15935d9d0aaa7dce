"""The collector is its own distribution: it declares what it imports and installs without vLLM."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import venv
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "collector"


def _declared() -> set[str]:
    import tomllib

    deps = tomllib.loads((COLLECTOR / "pyproject.toml").read_text())["project"]["dependencies"]
    names = set()
    for d in deps:
        name = d.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        names.add(name.strip().lower().replace("_", "-"))
    return names


def _imported_top_levels() -> set[str]:
    out = set()
    for path in (COLLECTOR / "otel_llm_collector").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out - set(sys.stdlib_module_names) - {"otel_llm_collector", "__future__"}


def test_every_third_party_import_is_declared():
    # import name -> distributions that provide it, in the environment the tests run in
    provided = packages_distributions()
    declared = _declared()
    missing = {}
    for top in _imported_top_levels():
        if top == "otel_llm":
            dists = {"otel-llm"}
        elif top in ("google", "opentelemetry"):
            continue  # namespace packages: checked by the submodules below
        else:
            dists = {d.lower().replace("_", "-") for d in provided.get(top, [])}
        if not dists & declared:
            missing[top] = dists
    assert not missing, f"imported but not declared in collector/pyproject.toml: {missing}"
    # the namespace packages, by the modules actually used
    for needed in ("protobuf", "googleapis-common-protos", "opentelemetry-proto", "opentelemetry-sdk"):
        assert needed in declared


def test_the_core_distribution_no_longer_ships_the_collector():
    import tomllib

    core = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "otel_llm_collector*" not in core["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "otel-llm-collector" not in core["project"].get("scripts", {})


def _copy_sources(dest: Path) -> tuple[Path, Path]:
    """The two distributions' sources, copied so the build leaves nothing in the checkout."""
    core, coll = dest / "core", dest / "collector"
    core.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, core / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "otel_llm", core / "otel_llm", ignore=ignore)
    coll.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(COLLECTOR / name, coll / name)
    shutil.copytree(COLLECTOR / "otel_llm_collector", coll / "otel_llm_collector", ignore=ignore)
    return core, coll


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_collector_installs_alone_into_a_clean_venv_and_starts(tmp_path: Path):
    """pip install otel-llm + otel-llm-collector (no vLLM) into a fresh venv; --check; start; SIGTERM."""
    core, coll = _copy_sources(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py, exe = env_dir / "bin" / "python", env_dir / "bin" / "otel-llm-collector"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-input", str(core), str(coll)],
                         capture_output=True, text=True, env=env, timeout=840)
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}"
    probe = subprocess.run([str(py), "-c", "import importlib.util as u; print(u.find_spec('vllm') is None)"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert probe.stdout.strip() == "True", "the clean venv must not have vLLM"

    config = tmp_path / "collector.yaml"
    config.write_text("receivers:\n  otlp:\n    protocols:\n      grpc: {endpoint: '127.0.0.1:0'}\n"
                      "      http: {endpoint: '127.0.0.1:0'}\nexporters:\n  prometheus: {endpoint: '127.0.0.1:0'}\n")
    check = subprocess.run([str(exe), "--check", "--config", str(config)], capture_output=True, text=True,
                           env=env, timeout=120, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "config OK"

    proc = subprocess.Popen([str(exe), "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    try:
        line = proc.stdout.readline()  # blocks until the gateway is up (or the process died)
        assert line.startswith("otel-llm-collector listening: OTLP/gRPC 127.0.0.1:"), (line, proc.stderr.read())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
