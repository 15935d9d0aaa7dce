"""Beside opentelemetry-instrumentation-openai-v2 under ``opentelemetry-instrument``: one CLIENT span per call
(theirs) with our extras on it, and one set of ``gen_ai.client.*`` points per call (theirs).

A clean venv: the wheel built from this checkout, openai, the upstream instrumentation (2.4b0, the newest
release that imports; with ``opentelemetry-util-genai`` 0.4b0, as 1.x lacks the module it imports) and
``opentelemetry-distro`` (the SDK providers ``opentelemetry-instrument`` sets up from ``OTEL_*``), the three
downloaded by scripts/setup.sh into ``.cache/upstream-openai``. Spans and metrics go to the console
exporters; the calls to the loopback replay server (replay_server.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from replay_server import ReplayServer, load
from support.distributions import ROOT, SDK, build_wheel, clean_env, closure, make_venv, repack

UPSTREAM = ROOT / ".cache" / "upstream-openai"

SCRIPT = """
import json, sys
import openai
from openai.resources.chat.completions import Completions
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as Theirs
from otel_llm.instrumentation.openai import OpenAIInstrumentor as Ours

def top():  # whose wrapper is on top of Completions.create, as the launcher left them
    return "ours" if Completions.__dict__["create"]._self_wrapper.__module__.startswith("otel_llm") else "theirs"

assert Ours().is_instrumented_by_opentelemetry and Theirs().is_instrumented_by_opentelemetry
if sys.argv[2] != "as_launched":  # the other order: take both off, top first, and wrap again the other way
    first, second = (Ours(), Theirs()) if top() == "ours" else (Theirs(), Ours())
    first.uninstrument()
    second.uninstrument()
    second.instrument()
    first.instrument()
print("top", top(), flush=True)
calls = json.loads(sys.argv[1])
for base_url, request in calls:
    client = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0)
    out = client.chat.completions.create(**request)
    if request.get("stream"):
        for _ in out:
            pass
print("calls done", flush=True)
"""


def objects(text: str) -> list[dict]:
    """The JSON objects the console exporters print one after another."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return out
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        out.append(obj)
        i = end


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = sorted(UPSTREAM.glob("*.whl")) if UPSTREAM.is_dir() else []
    if len(wheels) < 3:
        pytest.skip(f"the upstream openai instrumentation's wheels are not in {UPSTREAM} (scripts/setup.sh)")
    root = tmp_path_factory.mktemp("coexist")
    ours = build_wheel(SDK, root / "wheels", root / "src")
    house = root / "house"
    house.mkdir()
    for dist in closure(SDK.requirements() + [Requirement("openai"), Requirement("httpx")]).values():
        repack(dist, house)
    for wheel in wheels:
        (house / wheel.name).write_bytes(wheel.read_bytes())
    picks = [next(house.glob(f"{name}-*.whl")) for name in ("openai", "httpx")]
    return make_venv(root / "venv", [ours, *picks, *wheels], house)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("order", ["as_launched", "swapped"])
@pytest.mark.parametrize("opt_in", ["", "gen_ai_latest_experimental"])  # openai-v2's two code paths
def test_one_client_span_per_call_with_our_extras(venv_python: Path, tmp_path: Path, order: str, opt_in: str):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="console", OTEL_LOGS_EXPORTER="none",
               OTEL_METRIC_EXPORT_INTERVAL="600000", OTEL_SEMCONV_STABILITY_OPT_IN=opt_in)
    # the launcher instruments in entry-point order, which nobody controls: either wrapper may be on top, so
    # the script also runs with the two wrapped the other way round
    with ReplayServer() as server:
        calls = [(server.base_url(name), load(name).request) for name in ("chat_text", "chat_text_stream")]
        cmd = [str(venv_python.parent / "opentelemetry-instrument"), str(venv_python), str(script), json.dumps(calls),
               order]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = objects(proc.stdout)
    spans = [o for o in found if "context" in o and o.get("kind") == "SpanKind.CLIENT"]
    assert len(spans) == 2, [s.get("name") for s in spans]  # one per call, not one from each instrumentation
    tops = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("top ")]
    assert tops and tops[0] in ("ours", "theirs")
    plain, streamed = sorted(spans, key=lambda s: "gen_ai.response.time_to_first_chunk" in s["attributes"])
    assert "llm.client.duration" in plain["attributes"] and "llm.client.duration" in streamed["attributes"]
    assert streamed["attributes"]["gen_ai.response.time_to_first_chunk"] > 0
    assert streamed["attributes"]["llm.client.stream.end"] == "complete"
    points = {}
    for o in found:
        for rm in o.get("resource_metrics", ()):
            for sm in rm["scope_metrics"]:
                for m in sm["metrics"]:
                    if m["name"].startswith("gen_ai.client."):
                        for p in m["data"]["data_points"]:
                            points.setdefault(m["name"], []).append((sm["scope"]["name"], p))
    duration = points.get("gen_ai.client.operation.duration", [])
    assert sum(p["count"] for _, p in duration) == 2, duration  # theirs alone
    scopes = {scope for pts in points.values() for scope, _ in pts}
    assert scopes and not [s for s in scopes if s.startswith("otel_llm")], scopes  # theirs alone (either path's)
