"""vLLM's own unit tests as a guard: a subset of the release's scheduler tests (from its sdist, which ships
``tests/``), run twice, plain and with ``otel_llm.instrument()`` active (the step hooks wrap the scheduler
those tests drive in-process). Fails on any outcome that differs between the two runs, or on any error
our instrumentation caught (``otel_llm.stats()["errors"]``). A test failing the same way in both runs is
not ours to judge: vLLM's tests assume models we replace by a local config-only HF cache.

    python .ci/vllm_own_tests.py SDIST_TESTS_ROOT [pytest paths...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ["tests/v1/core/test_scheduler.py", "tests/v1/core/test_output.py"]
# vLLM's tests build ModelConfig for this model id: a config-only local HF cache answers offline
FAKE_MODELS = {"facebook/opt-125m": "OPTConfig"}


def fake_hf_cache(root: str) -> None:
    from transformers import AutoConfig  # noqa: F401  (the test environment has transformers: vLLM needs it)
    import transformers
    rev = "0" * 40
    for repo, config in FAKE_MODELS.items():
        base = os.path.join(root, "hub", "models--" + repo.replace("/", "--"))
        snap = os.path.join(base, "snapshots", rev)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(base, "refs"), exist_ok=True)
        with open(os.path.join(base, "refs", "main"), "w") as f:
            f.write(rev)
        c = getattr(transformers, config)()
        c.architectures = [config.replace("Config", "ForCausalLM")]
        c.save_pretrained(snap)


class Run:
    """One pytest run of the subset, plain or instrumented, started in the background."""

    def __init__(self, root: str, files: list[str], instrumented: bool, out: str, env: dict) -> None:
        self.label = "instrumented" if instrumented else "plain"
        self.xml = os.path.join(out, f"{self.label}.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--confcutdir=tests/v1",
               f"--junitxml={self.xml}", "-o", "junit_family=xunit1", *files]
        run_env = dict(env)
        if instrumented:
            cmd[3:3] = ["-p", "otel_llm_own_tests_plugin"]
            run_env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
            run_env["OTEL_LLM_OWN_TESTS_ERRORS"] = os.path.join(out, "errors.json")
        self.log = open(os.path.join(out, f"{self.label}.log"), "w+")
        self.proc = subprocess.Popen(cmd, cwd=root, env=run_env, stdout=self.log, stderr=subprocess.STDOUT,
                                     text=True)

    def outcomes(self) -> dict[str, str]:
        self.proc.wait()
        self.log.seek(0)
        stdout = self.log.read()
        self.log.close()
        lines = [ln for ln in stdout.splitlines() if " passed" in ln or " failed" in ln or " error" in ln]
        print(f"vLLM's own tests, {self.label}: {lines[-1] if lines else stdout[-500:]}")
        if not os.path.exists(self.xml):
            return {}
        out = {}
        for case in ET.parse(self.xml).getroot().iter("testcase"):
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            out[f"{case.get('classname')}::{case.get('name')}"] = kind
        return out


def main(root: str, files: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, HF_HOME=os.path.join(tmp, "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.setdefault("OMP_NUM_THREADS", "1")  # two runs on two cores: no thread pools fighting
        fake_hf_cache(env["HF_HOME"])
        # the two runs side by side (each is one single-threaded pytest: on two cores this halves the
        # part's time); their outcomes are compared, never their timings
        runs = [Run(root, files, False, tmp, env), Run(root, files, True, tmp, env)]
        plain, inst = (r.outcomes() for r in runs)
        errors_path = os.path.join(tmp, "errors.json")
        errors = json.load(open(errors_path)) if os.path.exists(errors_path) else {"plugin": "did not run"}
    diverged = {k: (plain.get(k), inst.get(k)) for k in set(plain) | set(inst) if plain.get(k) != inst.get(k)}
    print(f"vLLM's own tests: {len(plain)} tests, {sum(v == 'passed' for v in plain.values())} passed plain, "
          f"{len(diverged)} diverged, instrumentation errors {errors or 'none'}")
    for k, (a, b) in sorted(diverged.items()):
        print(f"  diverged: {k}: plain {a}, instrumented {b}")
    # a run where no test passed plain tested nothing (a broken set-up, a collection error): a failure
    return 1 if diverged or errors or not any(v == "passed" for v in plain.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:] or FILES))
