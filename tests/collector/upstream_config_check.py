"""Walk a generated Collector config against upstream_schema.py, as the upstream Collector would load it.

What is checked, and where upstream does it:
* every component section entry names a type the release registers (``otelcol/config.go``), and its
  body decodes strictly: unknown key, wrong type -> error (``confmap/internal/decoder.go``: ``ErrorUnused``,
  ``WeaklyTypedInput: false``, durations through ``StringToTimeDurationHookFunc``); required keys and
  one-of groups (the components' ``Validate()``);
* pipelines: ids ``<signal>[/<name>]``, at least one receiver and one exporter, no processor twice
  (``service/pipelines/config.go``); every reference defined, receivers/exporters may be connectors
  (``otelcol/config.go``); each component supports the pipeline's signal; a connector used as exporter in
  one pipeline is used as receiver in a pipeline of a signal it converts to, and the reverse
  (``service/internal/graph/graph.go``);
* our own rule on top: every defined component is used (upstream only ignores an unused one).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from upstream_schema import (ANY, BOOLEAN, DURATION, INTEGER, NUMBER, OPAQUE, STRING, Arr, MapOf, Node, Obj,
                             Release)

KINDS = {"receivers": "receiver", "processors": "processor", "exporters": "exporter", "connectors": "connector",
         "extensions": "extension"}
SIGNALS = ("traces", "metrics", "logs")
# Go's time.ParseDuration units (what StringToTimeDurationHookFunc accepts)
_DURATION = re.compile(r"^(0|[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+)$")


def check_node(value: Any, node: Node, path: str) -> list[str]:
    if node == ANY:
        return []
    if node == OPAQUE:
        return [] if value is None or isinstance(value, Mapping) else [f"{path}: expected a mapping"]
    if node == STRING:
        return [] if isinstance(value, str) else [f"{path}: expected type 'string', got {type(value).__name__}"]
    if node == BOOLEAN:
        return [] if isinstance(value, bool) else [f"{path}: expected type 'bool', got {type(value).__name__}"]
    if node == INTEGER:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer, got {type(value).__name__}"]
    if node == NUMBER:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected a number, got {type(value).__name__}"]
    if node == DURATION:
        ok = isinstance(value, str) and bool(_DURATION.match(value))
        return [] if ok else [f"{path}: expected a duration string like 5s, got {value!r}"]
    if isinstance(node, Arr):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        errs = [f"{path}: must not be empty"] if node.non_empty and not value else []
        for i, item in enumerate(value):
            errs += check_node(item, node.item, f"{path}[{i}]")
        return errs
    if isinstance(node, MapOf):
        if not isinstance(value, Mapping):
            return [f"{path}: expected a mapping"]
        return [e for k, v in value.items() for e in check_node(v, node.value, f"{path}::{k}")]
    if isinstance(node, Obj):
        return _check_obj(value, node, path)
    raise TypeError(f"unknown schema node {node!r}")


def _check_obj(value: Any, node: Obj, path: str) -> list[str]:
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        return [f"{path}: expected a mapping, got {type(value).__name__}"]
    errs = []
    for key, sub in value.items():
        if key not in node.props:
            errs.append(f"{path}: has invalid keys: {key}")
            continue
        errs += check_node(sub, node.props[key], f"{path}::{key}")
        if key in node.enums and isinstance(sub, str) and sub not in node.enums[key]:
            errs.append(f"{path}::{key}: {sub!r} is not one of {', '.join(node.enums[key])}")
    errs += [f"{path}: {key} is required" for key in node.required if key not in value]
    for group in node.one_of:
        present = [k for k in group if k in value]
        if len(present) != 1:
            errs.append(f"{path}: exactly one of {', '.join(group)} must be set, found {present or 'none'}")
    return errs


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def check_config(doc: Mapping[str, Any], release: Release) -> list[str]:
    """Every error the upstream Collector (and our 'all used' rule) would report for ``doc``."""
    errs: list[str] = []
    for key in doc:
        if key not in (*KINDS, "service"):
            errs.append(f"'' has invalid keys: {key}")
    defined: dict[str, dict[str, Any]] = {}
    for section, kind in KINDS.items():
        entries = doc.get(section) or {}
        defined[kind] = {}
        for cid, body in entries.items():
            comp = release.components.get((kind, component_type(cid)))
            if comp is None:
                errs.append(f"{section}::{cid}: unknown type {component_type(cid)!r} for release {release.name}")
                continue
            defined[kind][cid] = comp
            errs += check_node(body, comp.schema, f"{section}::{cid}")
    for cid in defined["connector"]:
        for kind in ("exporter", "receiver"):
            if cid in defined[kind]:
                errs.append(f"connectors::{cid}: ambiguous ID: found both {cid!r} {kind} and connector")
    errs += _check_service(doc.get("service"), defined)
    return errs


def _check_service(service: Any, defined: dict[str, dict[str, Any]]) -> list[str]:
    if not isinstance(service, Mapping):
        return ["service: missing"]
    errs = [f"service: has invalid keys: {k}" for k in service if k not in ("telemetry", "extensions", "pipelines")]
    pipelines = service.get("pipelines")
    if not isinstance(pipelines, Mapping) or not pipelines:
        return [*errs, "service::pipelines: must have at least one pipeline"]
    used: set[tuple[str, str]] = set()
    as_exporter: dict[str, set[str]] = {}
    as_receiver: dict[str, set[str]] = {}
    for pid, p in pipelines.items():
        where = f"service::pipelines::{pid}"
        signal = component_type(pid)
        if signal not in SIGNALS:
            errs.append(f"{where}: unknown signal {signal!r}")
            continue
        if not isinstance(p, Mapping):
            errs.append(f"{where}: expected a mapping")
            continue
        errs += [f"{where}: has invalid keys: {k}" for k in p if k not in ("receivers", "processors", "exporters")]
        if not p.get("receivers"):
            errs.append(f"{where}: must have at least one receiver")
        if not p.get("exporters"):
            errs.append(f"{where}: must have at least one exporter")
        procs = list(p.get("processors") or [])
        if len(set(procs)) != len(procs):
            errs.append(f"{where}: a processor is listed twice")
        for role, kinds in (("receivers", ("receiver", "connector")), ("processors", ("processor",)),
                            ("exporters", ("exporter", "connector"))):
            for ref in p.get(role) or []:
                kind = next((k for k in kinds if ref in defined[k]), None)
                if kind is None:
                    errs.append(f"{where}: references {role[:-1]} {ref!r} which is not configured")
                    continue
                used.add((kind, ref))
                if kind == "connector":
                    (as_receiver if role == "receivers" else as_exporter).setdefault(ref, set()).add(signal)
                elif signal not in defined[kind][ref].signals:
                    errs.append(f"{where}: {kind} {ref!r} does not support {signal}")
    for cid, comp in defined["connector"].items():
        ins, outs = as_exporter.get(cid, set()), as_receiver.get(cid, set())
        for s in sorted(ins):
            if not any((s, o) in comp.connects for o in outs):
                errs.append(f"connector {cid!r} used as exporter in {s} pipeline but not used in any supported "
                            "receiver pipeline")
        for s in sorted(outs):
            if not any((i, s) in comp.connects for i in ins):
                errs.append(f"connector {cid!r} used as receiver in {s} pipeline but not used in any supported "
                            "exporter pipeline")
    for kind, entries in defined.items():
        if kind == "extension":
            continue
        errs += [f"{kind} {cid!r} is defined but used in no pipeline" for cid in entries if (kind, cid) not in used]
    return errs


def deprecated_types(doc: Mapping[str, Any], release: Release) -> list[str]:
    """The component ids that use a type the release only keeps as a deprecated alias."""
    return [f"{section}::{cid}" for section, kind in KINDS.items() for cid in (doc.get(section) or {})
            if (kind, component_type(cid)) in release.deprecated]
