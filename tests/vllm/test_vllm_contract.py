"""The vLLM contract (otel_llm/instrumentation/vllm/contract.py) against the installed vLLM, its recorded
static table of vLLM's newest release, the declared range, and its warnings. No engine is started."""

from __future__ import annotations

import json
import logging
import os
import sys
import tomllib
import types

import pytest

from otel_llm.guard import Guard
from otel_llm.instrumentation.vllm import contract

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _installed_root() -> str:
    import vllm
    return os.path.dirname(os.path.dirname(vllm.__file__))


def test_the_installed_release_has_exactly_what_the_table_says_it_lacks():
    """On a verified release every entry is there but those whose ``absent`` names it (each with a fallback)."""
    version = contract.installed_version()
    fence = contract.Contract()
    missing = fence.check_all()
    expected = {e.key for e in contract.ENTRIES if version in e.absent}
    if version not in contract.VERIFIED:
        pytest.skip(f"vllm {version} is not a verified release; missing here: {missing}")
    assert set(missing) == expected, missing
    assert all(contract.entry(k).fallback for k in expected)


def test_the_source_check_agrees_with_the_live_check():
    """The static checker (ast, used for releases we cannot install) finds what importing finds."""
    live = contract.Contract().check_all()
    assert set(contract.source_check(_installed_root())) == set(live)


def test_the_newest_release_without_a_cpu_build_has_every_entry_without_a_fallback():
    for release in contract.STATIC:
        with open(os.path.join(ROOT, "tests", "vllm", "data", f"vllm-static-{release}.json")) as f:
            record = json.load(f)
        assert record["release"] == release and len(record["sha256"]) == 64
        rows = record["entries"]
        # a new entry needs a new record: scripts/vllm_static_table.py
        assert set(rows) == {e.key for e in contract.ENTRIES}, "re-run scripts/vllm_static_table.py"
        lacking = [k for k, r in rows.items() if not r["present"] and contract.entry(k).fallback is None]
        assert lacking == [], f"vllm {release} lacks {lacking}"
        for e in contract.ENTRIES:
            if e.params and rows[e.key]["present"]:
                sig = rows[e.key]["signature"]
                assert set(e.params) <= set(sig) or any(p.startswith("**") for p in sig), (e.key, sig)


def test_every_wrap_target_is_a_contract_entry():
    """Nothing of vLLM's is wrapped unfenced: the instrumentor's and the step hooks' tables name entries."""
    from otel_llm.instrumentation.vllm import VLLMInstrumentor
    from otel_llm.instrumentation.vllm.step_hooks import StepHooks
    from otel_llm.instrumentation.vllm.model_timing import ModelTimer

    keys = {(e.module, e.qualname) for e in contract.ENTRIES}
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    inst = VLLMInstrumentor()
    inst.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    try:
        tables = [inst.instrumentation.table, StepHooks()._table]
    finally:
        inst.uninstrument()
    from otel_llm.instrumentation.vllm.kv_connector import ConnectorWrapper

    tables.append(ModelTimer()._table)
    tables.append(ModelTimer().facts._table)  # the worker's LoRA adapter cache and drafter (worker_facts.py)
    tables.append(ConnectorWrapper(None)._table)
    targets = [(t.module, t.name) for table in tables for t in table.targets]
    assert targets and all(t in keys for t in targets), [t for t in targets if t not in keys]


# names read with getattr/hasattr in the adapter that are not vLLM's (so not contract entries), and why
NOT_VLLM = {
    "__dict__": "Python's: whether an output object can carry our attribute",
    "memfd_create": "os", "send_fds": "socket", "CMSG_SPACE": "socket",
    "type": "torch.device.type (the model runner's device)",
    "scope": "the ASGI request's scope (Starlette), for the server address",
    "headers": "the HTTP request's headers (Starlette), a tenant source",
}


def test_every_name_the_adapter_reads_by_string_is_a_contract_entry_or_not_vllms():
    """A vLLM internal read with ``getattr(obj, "name", default)`` outside contract.py would skip the fence
    silently: every such name is an entry's member, ours (``_otel_llm_*``), or named in NOT_VLLM."""
    import ast
    import glob

    members = {e.qualname.rsplit(".", 1)[-1] for e in contract.ENTRIES}
    adapter = os.path.join(ROOT, "otel_llm", "instrumentation", "vllm")
    unfenced = []
    for path in sorted(glob.glob(os.path.join(adapter, "*.py"))):
        if path.endswith("contract.py"):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                name = node.args[1].value
                if name not in members and name not in NOT_VLLM and not name.startswith("_otel_llm"):
                    unfenced.append(f"{os.path.basename(path)}:{node.lineno} {name}")
    assert unfenced == [], unfenced


def test_the_declared_range_is_the_tested_one():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    # no extra names vLLM (pip would replace the user's engine): the range lives in the instrumentor only
    assert not any(r.startswith("vllm") for extra in project.get("optional-dependencies", {}).values() for r in extra)
    from otel_llm.instrumentation.vllm import VLLMInstrumentor
    (dep,) = VLLMInstrumentor().instrumentation_dependencies()
    assert dep.endswith(contract.REQUIREMENT) and contract.OLDEST.startswith(contract.REQUIREMENT[2:])


def test_a_release_outside_the_range_warns_once(monkeypatch, caplog):
    for version, warns in (("0.27.1", True), ("0.33.0", True), ("0.30.0", False), ("0.32.0+cpu", False)):
        monkeypatch.setattr(contract, "installed_version", lambda v=version: v)
        fence = contract.Contract()
        caplog.clear()
        with caplog.at_level(logging.WARNING, "otel_llm"):
            fence.check_version()
            fence.check_version()
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == (1 if warns else 0), (version, said)
        if warns:
            assert version in said[0] and contract.OLDEST in said[0] and contract.NEWEST in said[0]


def test_a_missing_symbol_warns_once_naming_it_and_the_feature_and_is_counted(caplog):
    """A fake module lacking what two entries name: the one without a fallback warns and counts; the one
    with a fallback only notes it and its reader uses the fallback. Nothing raises."""
    name = "otel_llm_test_fake_vllm_module"
    module = types.ModuleType(name)

    class NewRequestData:
        def __init__(self) -> None:
            self.prompt_token_ids = [1, 2, 3]

    class Broken:
        def __getattr__(self, _name):  # a module whose attributes raise: judged, not raised
            raise RuntimeError("boom")

    module.NewRequestData = NewRequestData
    module.Broken = Broken()
    entries = (contract.Entry(name, "NewRequestData.prompt_len", contract.PREFILL, fallback="len(prompt_token_ids)"),
               contract.Entry(name, "NewRequestData.num_computed_tokens", contract.STEPS),
               contract.Entry(name, "Broken.thing", contract.STEPS))
    sys.modules[name] = module
    guard = Guard()  # its owner's
    try:
        fence = contract.Contract(entries, guard)
        with caplog.at_level(logging.INFO, "otel_llm"):
            fence.check_module(name)
            fence.check_module(name)
    finally:
        del sys.modules[name]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "NewRequestData.num_computed_tokens" in warnings[0] and contract.STEPS in warnings[0]
    # counted in the owner's guard; the entry with a fallback is only said (at INFO), not counted
    assert guard.errors == {"vllm contract: NewRequestData.num_computed_tokens": 1, "vllm contract: Broken.thing": 1}
    assert set(fence.missing) == {e.key for e in entries}
    # the fallback reader: prompt_len from prompt_token_ids
    fence._checked.add(name)
    assert _reader(fence, "NewRequestData.prompt_len", missing=True)(NewRequestData()) == 3


def _reader(fence: contract.Contract, key: str, missing: bool):
    fence.missing[key] = "missing" if missing else fence.missing.pop(key, None)
    return contract._FALLBACKS[key](missing)
