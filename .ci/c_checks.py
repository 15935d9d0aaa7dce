"""CI: the C extensions built strictly, and their differential and random-bytes tests run on a sanitized build.

1. ``-Wall -Wextra -Werror``: each extension compiled and linked on its own (users' builds, setup.py and
   collector/setup.py, stay ``optional=True`` without ``-Werror``: a new compiler's new warning must not
   break an install).
2. AddressSanitizer and UndefinedBehaviorSanitizer (``-fno-sanitize-recover=all``: the first report ends the
   run): the packages copied into a temporary folder, the extensions built into the copy, and the tests that
   compare each C path with its pure-Python twin run against it, in the stock python with ``libasan``
   preloaded, Python's allocator switched to ``malloc`` (so a heap object's every byte has ASan's red zones
   around it) and leak detection off (the interpreter keeps memory until exit by design).

The tests import the copy (it comes first on the path, and the working directory is the copy); this file is
also a pytest plugin (``-p c_checks``) that fails the run unless every extension was loaded from the copy and
ASan's runtime is in the process.

Usage: ``python .ci/c_checks.py [pytest args]`` from anywhere (exit status 0: clean). ``CC`` picks the
compiler (gcc by default: the preloaded runtime must be its libasan).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (module, source): each extension of setup.py and collector/setup.py, and where its package lives in the copy
EXTENSIONS = [
    ("otel_llm.instrumentation.vllm._step_fast", ROOT / "otel_llm/instrumentation/vllm/_step_fast.c"),
    ("otel_llm.instrumentation.vllm._hooks_fast", ROOT / "otel_llm/instrumentation/vllm/_hooks_fast.c"),
    ("otel_llm_collector.fast._wire", ROOT / "collector/otel_llm_collector/fast/_wire.c"),
    ("otel_llm.agent._bounded_fast", ROOT / "otel_llm/agent/_bounded_fast.c"),
]
PACKAGES = [ROOT / "otel_llm", ROOT / "collector/otel_llm_collector"]
# the differential suites (each C path against its Python twin) and the random-bytes ones
TESTS = [
    "tests/vllm/test_step_fast.py", "tests/vllm/test_step_ring.py", "tests/vllm/test_step_random_bytes.py",
    "tests/vllm/test_hooks_fast.py", "tests/vllm/test_step_sockets.py", "tests/vllm/test_c_layout.py",
    "tests/collector/test_wire_onepass.py", "tests/collector/test_wire_random_bytes.py",
    "tests/collector/test_fast_paths.py", "tests/agent/test_bounded_marshal.py",
]
BUILD_ENV = "OTEL_LLM_C_CHECKS_BUILD"  # tells the plugin where the extensions must come from
STRICT = ["-O2", "-std=c99", "-Wall", "-Wextra", "-Werror"]
SANITIZE = ["-O1", "-g", "-std=c99", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]


def _compile(cc: str, flags: list[str], source: Path, out: Path) -> None:
    include = sysconfig.get_paths()["include"]
    cmd = [cc, *flags, "-fPIC", "-shared", f"-I{include}", str(source), "-o", str(out)]
    print("c-checks:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n == "__pycache__" or n.endswith((".so", ".pyc"))}


def main(pytest_args: list[str]) -> int:
    cc = os.environ.get("CC", "gcc")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="otel-llm-c-checks-") as tmp:
        strict, copy = Path(tmp, "strict"), Path(tmp, "sanitized")
        strict.mkdir()
        for package in PACKAGES:
            shutil.copytree(package, copy / package.name, ignore=_ignore)
        builds = [(STRICT, source, strict / f"{module.rpartition('.')[2]}{suffix}") for module, source in EXTENSIONS]
        builds += [(SANITIZE, source, copy / (module.replace(".", "/") + suffix)) for module, source in EXTENSIONS]
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:  # the compilers side by side
            failed = [exc for exc in (f.exception() for f in [pool.submit(_compile, cc, *b) for b in builds]) if exc]
        if failed:  # a warning (-Werror) or an error: the compiler printed it
            print(f"c-checks: FAILED: {len(failed)} of {len(builds)} builds ({failed[0]})", file=sys.stderr)
            return 1
        asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                              check=True).stdout.strip()
        if not os.path.isabs(asan) or not os.path.exists(asan):
            print(f"c-checks: {cc} has no libasan.so ({asan!r})", file=sys.stderr)
            return 1
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": os.pathsep.join([str(copy), str(ROOT / "tests"), str(Path(__file__).parent)]),
            "LD_PRELOAD": asan,
            "PYTHONMALLOC": "malloc",
            "ASAN_OPTIONS": "detect_leaks=0",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
            BUILD_ENV: str(copy),
        })
        tests = [str(ROOT / t) for t in TESTS]
        # run from the copy: `python -m` puts the working directory first on the path. --capture=sys: a
        # sanitizer's report goes to file descriptor 2 and the process exits; pytest's default capture of the
        # descriptors would swallow it
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys", "-p", "c_checks",
               *pytest_args, *tests]
        rc = subprocess.run(cmd, cwd=copy, env=env).returncode
    print(f"c-checks: {'clean' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - started:.0f} s")
    return rc


# -- the pytest plugin (-p c_checks): the run tested what it says ---------------------------------------------

def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001 - pytest's hook
    import importlib

    build = os.environ.get(BUILD_ENV)
    if not build:
        return
    wrong = []
    for module, _ in EXTENSIONS:
        path = importlib.import_module(module).__file__ or ""
        if not os.path.realpath(path).startswith(os.path.realpath(build) + os.sep):
            wrong.append(f"{module} from {path}")
    with open("/proc/self/maps") as maps:
        if "libasan" not in maps.read():
            wrong.append("no AddressSanitizer runtime in the process")
    if wrong:
        print("\nc-checks: the tests did not run the sanitized build: " + "; ".join(wrong), file=sys.stderr)
        session.exitstatus = 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
