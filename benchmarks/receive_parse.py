"""The collector's receive path: validate-then-view (two passes) against one validating pass.

    .venv/bin/python benchmarks/receive_parse.py [--rounds 7] [--requests 4]

Per-span CPU (process time) of turning received OTLP bytes into what the gateway ingests, for trace
shapes 1 (request spans only, 8 attributes each) and 8 (a request span and 7 decode steps), in
interleaved rounds (medians). Writes benchmarks/results/receive_parse.json.

* ``one_pass``: what the receivers do when the C extension is built: ``spans.read_request`` (``fast/_wire.c``:
  validates as upb does and builds, per span, its bytes, ids, times, status and the map of the attribute keys
  extract reads, in one pass) then ``spans.extract`` over that. ``one_pass_read_only``: the C pass alone.
* ``two_pass``: the fallback (no extension): ``messages.parse_request`` (the full OTLP classes, in C: this is
  what refuses malformed bytes, invalid UTF-8 anywhere, truncated nested messages) then ``spans.extract``
  over the bytes through ``otlp.view`` (spans kept as received, attributes as a C-built map of encoded values):
  what the receivers did before the one-pass path, unchanged.
* ``view_only``: ``extract`` alone. NOT a valid receive path (the view leaves attribute values, events
  and links unparsed, so it would forward what a backend refuses); the floor any one-pass design could reach.
* ``one_pass_value_checks``: ``extract`` plus the Python-level validation of every attribute value the view
  leaves unparsed (a remembered-valid set, a fast path for doubles, the full ``AnyValue`` class otherwise):
  one parse, but the checks run per value in Python.
* ``one_pass_message_map``: one C parse of the whole request through a view whose spans are messages and
  whose attribute map holds full ``AnyValue`` messages (validates everything), each span re-serialized and
  the request spans' values read from the messages. Compared with ``two_pass_prototype``, the same
  reading over the two-pass view, since it cannot reuse ``extract``.
* ``one_pass_checked_spans``: the request parsed with resources and scopes as full messages and spans as bytes;
  each span parsed once by a type declaring every ``Span`` field as trace.proto does except
  ``attributes: map<string, AnyValue>`` (validates everything the full parse does, duplicates included; a
  per-span parse allows three more nesting levels than the request's); values read through the messages.
* ``one_pass_bytesize_checks``: the view's span type with every other field declared, ``ByteSize() == len``
  (nothing dropped by last-wins), and a remembered set of validated attribute values.
* ``one_pass_full_read``: the validating parse's result read directly, spans re-encoded for buffering.
  (These three against ``two_pass_prototype``.)
* ``parse_only`` / ``view_parse_only``: components: the full parse alone; the view's parses alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "collector"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402
from opentelemetry.proto.common.v1 import common_pb2  # noqa: E402
from opentelemetry.proto.resource.v1 import resource_pb2  # noqa: E402
from opentelemetry.proto.trace.v1 import trace_pb2  # noqa: E402

from collector_throughput import build_requests  # noqa: E402
from otel_llm.core import semconv as sc  # noqa: E402
from otel_llm.otlp import messages, view  # noqa: E402
from otel_llm_collector import spans as S  # noqa: E402
from otel_llm_collector.fast import wire  # noqa: E402
from otel_llm_collector.spans import extract  # noqa: E402

_F = descriptor_pb2.FieldDescriptorProto


def _trace_file_copy(pkg: str) -> tuple[descriptor_pool.DescriptorPool, descriptor_pb2.FileDescriptorProto, dict]:
    """A pool holding common.proto and resource.proto, and a copy of trace.proto renamed into ``pkg`` (not yet
    added: the caller edits its messages first), with its messages by name."""
    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2):
        fdp = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fdp)
        pool.Add(fdp)
    fdp = descriptor_pb2.FileDescriptorProto()
    trace_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name, fdp.package = f"{pkg}.proto", pkg
    for m in fdp.message_type:
        for f in list(m.field) + [f for n in m.nested_type for f in n.field]:
            if f.type_name.startswith(".opentelemetry.proto.trace.v1."):
                f.type_name = f.type_name.replace(".opentelemetry.proto.trace.v1.", f".{pkg}.")
    return pool, fdp, {m.name: m for m in fdp.message_type}


def _attributes_as_map_and_request(pool: descriptor_pool.DescriptorPool, fdp: descriptor_pb2.FileDescriptorProto,
                                   span: descriptor_pb2.DescriptorProto, pkg: str) -> None:
    """``Span.attributes`` as ``map<string, AnyValue>`` (a KeyValue is a map entry on the wire), an
    ``ExportTraceServiceRequest`` of the copy's ``ResourceSpans`` added, and the file added to the pool."""
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=_F.TYPE_MESSAGE, label=_F.LABEL_OPTIONAL,
                    type_name=".opentelemetry.proto.common.v1.AnyValue")
    next(f for f in span.field if f.name == "attributes").type_name = f".{pkg}.Span.AttributesEntry"
    req = fdp.message_type.add(name="ExportTraceServiceRequest")
    req.field.add(name="resource_spans", number=1, type=_F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
                  type_name=f".{pkg}.ResourceSpans")
    pool.Add(fdp)


def _message_map_view() -> type:
    """ExportTraceServiceRequest whose resources and scopes stay bytes, spans are full messages except
    ``attributes``: ``map<string, AnyValue>`` (a KeyValue is a map entry on the wire)."""
    pkg = "bench.onepass"
    pool, fdp, by_name = _trace_file_copy(pkg)
    for msg, name in (("ResourceSpans", "resource"), ("ScopeSpans", "scope")):
        f = next(f for f in by_name[msg].field if f.name == name)
        f.type = _F.TYPE_BYTES
        f.ClearField("type_name")
    _attributes_as_map_and_request(pool, fdp, by_name["Span"], pkg)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.ExportTraceServiceRequest"))


ONE_PASS = _message_map_view()


def _checked_views() -> tuple[type, type]:
    """(request, span) view types for ``one_pass_checked_spans``: the request with its resources and scopes as
    full messages (validated) and each span as bytes; a span type with every ``Span`` field declared as in
    trace.proto (so its parse validates name, trace_state, events, links, status) except ``attributes``:
    ``map<string, AnyValue>`` (each entry parsed as a full ``AnyValue``: validated, duplicates included)."""
    pkg = "bench.checked"
    pool, fdp, by_name = _trace_file_copy(pkg)
    spans = next(f for f in by_name["ScopeSpans"].field if f.name == "spans")
    spans.type = _F.TYPE_BYTES
    spans.ClearField("type_name")
    _attributes_as_map_and_request(pool, fdp, by_name["Span"], pkg)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.{name}"))
                 for name in ("ExportTraceServiceRequest", "Span"))  # type: ignore[return-value]


CHECKED_REQUEST, CHECKED_SPAN = _checked_views()


def _validating_bytes_view() -> type:
    """``view.SpanView`` with every other ``Span`` field declared (name, trace_state, events, links, status as
    in trace.proto): its parse validates all but the attribute map's encoded values (and what last-wins drops)."""
    pkg = "bench.bytesview"
    pool, fdp, by_name = _trace_file_copy(pkg)
    span = by_name["Span"]
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=_F.TYPE_BYTES, label=_F.LABEL_OPTIONAL)
    next(f for f in span.field if f.name == "attributes").type_name = f".{pkg}.Span.AttributesEntry"
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.Span"))


BYTES_SPAN = _validating_bytes_view()
E2E = sc.LATENCY_E2E


def two_pass(raw: bytes) -> int:
    return len(extract(S.read_request(raw, one_pass=False), raw).spans)


def one_pass(raw: bytes) -> int:
    return len(extract(S.read_request(raw, one_pass=True), raw).spans)


def one_pass_read_only(raw: bytes) -> int:
    """Component: the C pass alone (validation and the reading extract takes)."""
    return sum(len(ss[2]) for rs in wire.read(raw, S.WANTED) for ss in rs[2])


def view_only(raw: bytes) -> int:
    return len(extract(None, raw).spans)  # type: ignore[arg-type]


_valid: set[bytes] = set()


def _check(encoded: bytes) -> None:
    if encoded in _valid or (len(encoded) == 9 and encoded[0] == 0x21):
        return
    common_pb2.AnyValue.FromString(encoded)  # validates (C)
    if len(_valid) > 4096:
        _valid.clear()
    _valid.add(encoded)


def one_pass_value_checks(raw: bytes) -> int:
    n = len(extract(None, raw).spans)  # type: ignore[arg-type]
    for rs in view.RequestView.FromString(raw).resource_spans:  # the values extract's view left unparsed
        for ss in rs.scope_spans:
            for encoded in ss.spans:
                attrs = view.SpanView.FromString(encoded).attributes
                for key in attrs:
                    _check(attrs[key])
    return n


def two_pass_prototype(raw: bytes) -> int:
    messages.parse_request(raw)
    n = 0
    for rs in view.RequestView.FromString(raw).resource_spans:
        view.read_resource(rs.resource)
        for ss in rs.scope_spans:
            for encoded in ss.spans:
                s = view.SpanView.FromString(encoded)
                attrs = s.attributes
                _ = (s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano, s.status)
                if E2E in attrs:
                    for key in attrs:
                        view.value_of(attrs[key])
                n += 1
    return n


def one_pass_message_map(raw: bytes) -> int:
    n = 0
    for rs in ONE_PASS.FromString(raw).resource_spans:
        view.read_resource(rs.resource)
        for ss in rs.scope_spans:
            common_pb2.InstrumentationScope.FromString(ss.scope)  # the scope's validation, once per ScopeSpans
            for s in ss.spans:
                _ = s.SerializeToString()  # the span's bytes, to buffer and export
                attrs = s.attributes
                _ = (s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano,
                     s.status.code)
                if E2E in attrs:
                    for key in attrs:
                        v = attrs[key]
                        kind = v.WhichOneof("value")
                        _ = getattr(v, kind) if kind else None
                n += 1
    return n


def _anyvalue(v: common_pb2.AnyValue) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def one_pass_checked_spans(raw: bytes) -> int:
    """One C parse per span that validates all of it (attribute values as full ``AnyValue`` map values); spans'
    bytes as received (no re-encoding); resources and scopes validated in the request's parse and encoded once
    per group. Values read from the ``AnyValue`` messages (no bytes to remember decodings by)."""
    n = 0
    for rs in CHECKED_REQUEST.FromString(raw).resource_spans:
        view.read_resource(rs.resource.SerializeToString())  # once per ResourceSpans: the group's key
        for ss in rs.scope_spans:
            ss.scope.SerializeToString()
            for encoded in ss.spans:
                s = CHECKED_SPAN.FromString(encoded)
                attrs = s.attributes
                _ = (s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano,
                     s.HasField("status") and s.status.code)
                if E2E in attrs:
                    for key in attrs:
                        _anyvalue(attrs[key])
                n += 1
    return n


_valid_values: set[bytes] = set()


def one_pass_bytesize_checks(raw: bytes) -> int:
    """The two-pass view with every ``Span`` field but the attribute values validated by its parse (BYTES_SPAN),
    ``ByteSize() == len`` to prove nothing was dropped by last-wins (duplicate keys, repeated fields), and each
    attribute value validated once (a remembered set; the full ``AnyValue`` class for a new one)."""
    n = 0
    for rs in view.RequestView.FromString(raw).resource_spans:
        view.read_resource(rs.resource)
        for ss in rs.scope_spans:
            view.scope_name(ss.scope)
            for encoded in ss.spans:
                s = BYTES_SPAN.FromString(encoded)
                if s.ByteSize() != len(encoded):
                    raise AssertionError("the benchmark's spans are canonical")
                attrs = s.attributes
                _ = (s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano,
                     s.HasField("status") and s.status.code)
                for key in attrs:
                    encoded_value = attrs[key]
                    if encoded_value not in _valid_values:
                        common_pb2.AnyValue.FromString(encoded_value)
                        _valid_values.add(encoded_value)
                if E2E in attrs:
                    for key in attrs:
                        view.value_of(attrs[key])
                n += 1
        if len(_valid_values) > 4096:
            _valid_values.clear()
    return n


def one_pass_full_read(raw: bytes) -> int:
    """The validating parse's result read directly: the full classes, each span re-encoded for buffering."""
    n = 0
    for rs in messages.parse_request(raw).resource_spans:
        rs.resource.SerializeToString()
        for ss in rs.scope_spans:
            ss.scope.SerializeToString()
            for s in ss.spans:
                _ = s.SerializeToString()
                _ = (s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano,
                     s.HasField("status") and s.status.code)
                attrs = {kv.key: kv.value for kv in s.attributes}
                if E2E in attrs:
                    for v in attrs.values():
                        _anyvalue(v)
                n += 1
    return n


def parse_only(raw: bytes) -> int:
    """Component: the validating full parse alone."""
    return messages.span_count(messages.parse_request(raw))


def view_parse_only(raw: bytes) -> int:
    """Component: the view's parses alone (request, then each span), nothing read."""
    n = 0
    for rs in view.RequestView.FromString(raw).resource_spans:
        for ss in rs.scope_spans:
            for encoded in ss.spans:
                view.SpanView.FromString(encoded)
                n += 1
    return n


VARIANTS = (one_pass, two_pass, one_pass_read_only, view_only, one_pass_value_checks, two_pass_prototype,
            one_pass_message_map,
            one_pass_checked_spans, one_pass_bytesize_checks, one_pass_full_read, parse_only, view_parse_only)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=4, help="export requests of ~1000 spans per round and shape")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "receive_parse.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    results: dict[str, dict[str, float]] = {}
    for shape in (1, 8):
        payloads = build_requests(shape, args.requests)
        for f in VARIANTS:  # each accepts what it measures (and warms caches) before timing
            assert sum(f(p) for p in payloads) > 0
        for p in payloads:  # the paths the receivers can take read the same
            one, two = S.read_request(p, one_pass=True), S.read_request(p, one_pass=False)
            assert repr(extract(one)) == repr(extract(two, p))
        times: dict[str, list[float]] = {f.__name__: [] for f in VARIANTS}
        for r in range(args.rounds):
            for f in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:  # rotated order
                gc.collect()
                gc.disable()  # a collection landing in one variant's timing is most of the noise between rounds
                try:
                    t0, spans = time.process_time(), 0
                    for p in payloads:
                        spans += f(p)
                    times[f.__name__].append((time.process_time() - t0) / spans * 1e6)
                finally:
                    gc.enable()
        results[f"shape_{shape}"] = {k: round(statistics.median(v), 3) for k, v in times.items()}
    out = {"unit": "us CPU per span (median of rounds)", "rounds": args.rounds,
           "machine": "2 cores shared with other sessions' tests and benchmarks (loaded)", "load_avg_before": load,
           "load_avg_after": os.getloadavg(), "results": results}
    print(json.dumps(out, indent=2))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
