"""One house for OTLP: nothing outside ``otel_llm/otlp/`` encodes or decodes OTLP, and nothing outside
``otel_llm/otlp/sdk_bridge.py`` reads opentelemetry-sdk internals (checked on the source, by AST)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OTLP = ROOT / "otel_llm" / "otlp"
BRIDGE = OTLP / "sdk_bridge.py"
# the code that ships or that users copy: the SDK, the collector, the examples
SCANNED = [ROOT / "otel_llm", ROOT / "collector" / "otel_llm_collector", ROOT / "examples"]
# No exception left: the test helpers that decode what they receive (tests/support/otlp_sink.py) live under
# tests/, which (like benchmarks/) builds and reads OTLP messages as fixtures and differential checks, on purpose.
ALLOWED: list[Path] = []

# the OTLP messages, protobuf itself, google.rpc error bodies, the SDK's OTLP encoder
CODEC_MODULES = ("opentelemetry.proto", "google.protobuf", "google.rpc", "opentelemetry.exporter.otlp.proto.common")
# private names of opentelemetry-sdk objects direct export relies on
SDK_PRIVATE = frozenset({"_span_processors", "_active_span_processor", "_batch_processor", "_instrumentation_scope",
                         "_span_limits", "_schedule_delay"})


def _codec_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith(CODEC_MODULES) or name.rsplit(".", 1)[-1].endswith("_pb2"):
                found.append(f"line {node.lineno}: import {name}")
                break
    return found


def _sdk_private_reads(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SDK_PRIVATE:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in SDK_PRIVATE):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def _files() -> list[Path]:
    return [p for base in SCANNED for p in sorted(base.rglob("*.py"))
            if not any(p.is_relative_to(a) for a in ALLOWED)]


def test_no_otlp_encoding_or_decoding_outside_the_otlp_package():
    offenders = {}
    for path in _files():
        if path.is_relative_to(OTLP):
            continue
        hits = _codec_imports(ast.parse(path.read_text(), str(path)))
        if hits:
            offenders[str(path.relative_to(ROOT))] = hits
    assert not offenders, f"OTLP codec imports outside otel_llm/otlp/ (use otel_llm.otlp.*): {offenders}"


def test_sdk_internals_are_read_only_in_the_bridge():
    offenders = {}
    for path in _files():
        if path == BRIDGE:
            continue
        hits = _sdk_private_reads(ast.parse(path.read_text(), str(path)))
        if hits:
            offenders[str(path.relative_to(ROOT))] = hits
    assert not offenders, f"opentelemetry-sdk internals read outside otlp/sdk_bridge.py: {offenders}"


def test_the_checks_catch_what_they_look_for():
    source = ("from opentelemetry.proto.trace.v1 import trace_pb2\nimport google.protobuf.message\n"
              "from x import y_pb2\nfrom opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans\n"
              "t._span_limits\ngetattr(p, '_batch_processor', None)\n")
    tree = ast.parse(source)
    assert len(_codec_imports(tree)) == 4
    assert len(_sdk_private_reads(tree)) == 2
    assert not _codec_imports(ast.parse("from otel_llm.otlp import messages\nimport grpc\n"))
    assert _files() and OTLP / "encode.py" in _files()  # the scan sees the package it exempts
