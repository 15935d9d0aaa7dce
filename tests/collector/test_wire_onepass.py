"""The one-pass receive path (``otel_llm_collector.fast._wire``) against its oracles.

upb (``ExportTraceServiceRequest.FromString``) decides which bytes are a valid request: the C reader must give
the same verdict on every input. For accepted inputs its reading must equal the two-pass path's (the view's
reading of each span, and ``extract``'s result field for field). Inputs: requests built with the real classes
(every AnyValue kind, events, links, status, request / native / client spans), changed on a wire-level tree
(unknown fields and groups, duplicated fields, wrong wire types, bad UTF-8 in string vs bytes fields, deep
nesting, overlong varints) and then at the byte level (flips, truncations, insertions, deletions). Fixed seeds:
the same inputs every run."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm import semconv as sc
from otel_llm.otlp.messages import MalformedRequest, parse_request
from otel_llm.otlp.view import RequestView, SpanView, is_error
from otel_llm_collector import spans as S
from otel_llm.otlp import wire_schema
from otel_llm_collector.fast import wire

_DESC = ExportTraceServiceRequest.DESCRIPTOR
_KEYS = sorted({v for k, v in vars(sc).items() if k.isupper() and isinstance(v, str) and "." in v}) + \
    ["odd", "", "user.id", "k\u00e9y"]
_BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"\xc2", b"a\xe2\x82",
             b"\xf5\x80\x80\x80", b"\x80"]
_GOOD_UTF8 = [b"", b"\x00", b"\xef\xbf\xbf", b"\xf0\x9f\x98\x80", b"\xc2\x80", b"\xed\x9f\xbf", b"\xf4\x8f\xbf\xbf"]
POLICY_KEYS = frozenset({"user.id", sc.REQUEST_MODEL, "odd"})


def test_the_extension_is_built() -> None:
    """Fails loudly where the C extension did not build (or cannot be used), so CI never tests only the fallback."""
    from otel_llm_collector.fast import _wire  # noqa: F401 - the import is the check

    assert wire.AVAILABLE, wire.REASON
    assert S.ONE_PASS
    assert wire.LIMIT == 100  # upb's default; measured at import (this pins what the boundary tests cover)


# -- builders ------------------------------------------------------------------------------------------------

def _value(r: random.Random, depth: int = 0) -> AnyValue:
    kind = r.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return AnyValue(string_value=r.choice(["m", "", "text_completion", "vllm", "\u00e9\u4e2d", "stop", '["x"]']))
    if kind == 1:
        return AnyValue(bool_value=r.random() < 0.5)
    if kind == 2:
        return AnyValue(int_value=r.choice([0, 1, 127, 128, 16383, 16384, -1, 2**63 - 1, -2**63]))
    if kind == 3:
        return AnyValue(double_value=r.choice([0.0, 0.1, 1.5, -2.0, 1e300, float("inf")]))
    if kind == 4:
        return AnyValue(bytes_value=bytes(r.randrange(256) for _ in range(r.randrange(5))))
    if kind == 5:
        return AnyValue()  # empty
    if kind == 6:
        return AnyValue(array_value=ArrayValue(values=[_value(r, depth + 1) for _ in range(r.randrange(4))]))
    if kind == 7:
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=r.choice(_KEYS), value=_value(r, depth + 1))
                                                          for _ in range(r.randrange(3))]))
    counts = [AnyValue(int_value=r.randrange(300)) for _ in range(r.randrange(6))]  # bucket counts' shape
    return AnyValue(array_value=ArrayValue(values=counts))


def _attrs(r: random.Random, n: int) -> list[KeyValue]:
    out = [KeyValue(key=r.choice(_KEYS), value=_value(r)) for _ in range(n)]
    for kv in out:
        if r.random() < 0.05:  # a profiles-style string-table index: the view's map leaves such an entry out
            kv.key_strindex = r.randrange(1, 4)
        if r.random() < 0.05:
            kv.value.string_value_strindex = r.randrange(3)
    return out


def _request_attrs(r: random.Random) -> list[KeyValue]:
    """A request span's attributes: ours (llm.latency.*) or a native engine's, with some odd types."""
    def num(x: float) -> AnyValue:
        return r.choice([AnyValue(double_value=x), AnyValue(int_value=int(x * 10)), AnyValue(string_value=str(x))])
    if r.random() < 0.5:
        keys = [sc.LATENCY_E2E, sc.LATENCY_TTFT, sc.LATENCY_TPOT, sc.REQUEST_MODEL, sc.USAGE_INPUT_TOKENS,
                sc.USAGE_OUTPUT_TOKENS, sc.PROVIDER_NAME, sc.OPERATION_NAME, sc.SAMPLING_REASON]
    else:
        keys = [sc.VLLM_TTFT, sc.VLLM_E2E, sc.VLLM_QUEUE, sc.VLLM_PREFILL, sc.VLLM_DECODE, sc.VLLM_PROMPT_TOKENS,
                sc.VLLM_COMPLETION_TOKENS, sc.VLLM_RESPONSE_MODEL, sc.RESPONSE_FINISH_REASONS]
    out = []
    for key in r.sample(keys, r.randrange(1, len(keys) + 1)):
        v = num(r.random()) if r.random() < 0.7 else _value(r)
        out.append(KeyValue(key=key, value=v))
    return out + _attrs(r, r.randrange(3))


def _id(r: random.Random, n: int) -> bytes:
    c = r.random()
    if c < 0.85:
        return bytes(r.randrange(1, 4) for _ in range(n))
    return r.choice([b"", b"\0" * n, b"\1" * (n + 1), b"\1" * (n - 1)])


def _span(r: random.Random) -> Span:
    s = Span(trace_id=_id(r, 16), span_id=_id(r, 8), name=r.choice(["s", "", "llm_request", "\u00e9"]),
             kind=r.randrange(6), start_time_unix_nano=r.randrange(2**64), end_time_unix_nano=r.randrange(2**64),
             trace_state=r.choice(["", "a=b"]), flags=r.randrange(2**32), dropped_attributes_count=r.randrange(3))
    if r.random() < 0.5:
        s.parent_span_id = _id(r, 8)
    c = r.random()
    if c < 0.4:
        s.attributes.extend(_request_attrs(r))
    elif c < 0.55:
        s.kind = Span.SPAN_KIND_CLIENT if r.random() < 0.8 else s.kind
        s.attributes.append(KeyValue(key=sc.RESPONSE_TIME_TO_FIRST_CHUNK,
                                     value=r.choice([AnyValue(double_value=0.25), AnyValue(int_value=1)])))
        s.attributes.extend(_attrs(r, r.randrange(3)))
    else:
        s.attributes.extend(_attrs(r, r.randrange(6)))
    for _ in range(r.randrange(3)):
        s.events.add(time_unix_nano=r.randrange(2**40), name=r.choice(["e", "\u00e9"]), attributes=_attrs(r, 2))
    for _ in range(r.randrange(2)):
        s.links.add(trace_id=_id(r, 16), span_id=_id(r, 8), attributes=_attrs(r, 1), flags=r.randrange(3))
    if r.random() < 0.5:
        s.status.code = r.randrange(3)
        s.status.message = r.choice(["", "boom"])
    return s


def _request(r: random.Random) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(r.randrange(1, 3)):
        rs = req.resource_spans.add(schema_url=r.choice(["", "https://x/1"]))
        if r.random() < 0.9:
            rs.resource.attributes.append(KeyValue(key="service.name", value=r.choice(
                [AnyValue(string_value="svc"), AnyValue(string_value=""), AnyValue(int_value=3)])))
            rs.resource.attributes.extend(_attrs(r, r.randrange(3)))
        for _ in range(r.randrange(1, 3)):
            ss = rs.scope_spans.add(schema_url=r.choice(["", "s"]))
            ss.scope.name = r.choice(["test", "vllm.engine", "trt.llm", ""])
            ss.scope.version = r.choice(["", "1"])
            ss.spans.extend(_span(r) for _ in range(r.randrange(0, 5)))
    return req


# -- a wire-level tree: [number, wire type, payload], payload an int (varint), bytes, or a list (message/group)

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _parse(buf: bytes, desc: Any) -> list:
    """A valid message's fields, known submessages parsed (the input was encoded by the classes)."""
    out, i = [], 0
    while i < len(buf):
        tag, i = _read_varint(buf, i)
        num, wt = tag >> 3, tag & 7
        f = desc.fields_by_number.get(num) if desc is not None else None
        if wt == 0:
            v, i = _read_varint(buf, i)
            out.append([num, 0, v])
        elif wt in (1, 5):
            n = 8 if wt == 1 else 4
            out.append([num, wt, buf[i:i + n]])
            i += n
        else:
            n, i = _read_varint(buf, i)
            body = buf[i:i + n]
            i += n
            sub = f.message_type if f is not None and f.message_type is not None else None
            out.append([num, 2, _parse(body, sub) if sub is not None else body, sub])
    return out


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _encode(fields: list) -> bytes:
    out = bytearray()
    for f in fields:
        num, wt, payload = f[0], f[1], f[2]
        if wt == 3:  # a group: payload is its fields
            out += _varint(num << 3 | 3) + _encode(payload) + _varint(num << 3 | 4)
            continue
        out += f[4] if wt == 2 and len(f) > 4 else _varint(num << 3 | wt)  # f[4]: an overlong tag, when set
        if wt == 0:
            out += _varint(payload)
        elif wt in (1, 5):
            out += payload
        else:
            body = _encode(payload) if isinstance(payload, list) else payload
            out += _varint(len(body)) + body
    return bytes(out)


def _messages(fields: list, out: list) -> list:
    """Every (fields list, descriptor) in the tree, the root's first."""
    for f in fields:
        if f[1] == 2 and isinstance(f[2], list):
            out.append((f[2], f[3]))
            _messages(f[2], out)
    return out


def _unknown(r: random.Random, depth: int = 0) -> list:
    num = r.choice([17, 99, 1000, 2**29 - 1])
    wt = r.choice([0, 1, 2, 5, 3] if depth < 3 else [0, 1, 2, 5])
    if wt == 0:
        return [num, 0, r.choice([0, 1, 2**64 - 1])]
    if wt in (1, 5):
        return [num, wt, b"\xff" * (8 if wt == 1 else 4)]
    if wt == 2:
        return [num, 2, r.choice(_BAD_UTF8 + _GOOD_UTF8), None]
    inner = [_unknown(r, depth + 1) for _ in range(r.randrange(3))]
    if r.random() < 0.2:
        inner.append([0, 0, 1])  # field number 0 inside a group (upb accepts it there)
    return [num, 3, inner]


def _deep(level: int, target: int, r: random.Random) -> list:
    """Fields for an AnyValue at ``level`` whose innermost message (or group) is at ``target``."""
    if level >= target:
        return [[1, 2, b"x", None]] if r.random() < 0.5 else []
    if r.random() < 0.2 and target - level >= 1:
        inner: list = []  # finish with groups
        for _ in range(target - level):
            inner = [[9, 3, inner]]
        return inner
    return [[5, 2, [[1, 2, _deep(level + 2, target, r), None]], None]]  # array_value.values: two levels


def _mutate_tree(r: random.Random, root: list) -> None:
    msgs = _messages(root, [(root, _DESC)])
    for _ in range(r.randrange(1, 4)):
        fields, desc = r.choice(msgs)
        c = r.random()
        if c < 0.2:
            fields.insert(r.randrange(len(fields) + 1), _unknown(r))
        elif c < 0.35 and fields:  # a field twice: a repeated key, a second copy of a message or bytes field
            f = r.choice(fields)
            fields.insert(r.randrange(len(fields) + 1), f)
        elif c < 0.5 and fields:  # a known field with another wire type
            i = r.randrange(len(fields))
            num = fields[i][0]
            fields[i] = r.choice([[num, 0, 5], [num, 1, b"12345678"], [num, 5, b"1234"], [num, 2, b"\xff", None],
                                  [num, 3, []]])
        elif c < 0.7 and fields:  # bad or unusual UTF-8 in a length-delimited field (string: refused; bytes: not)
            cands = [f for f in fields if f[1] == 2 and not isinstance(f[2], list)]
            if cands:
                f = r.choice(cands)
                f[2] = r.choice(_BAD_UTF8 + _GOOD_UTF8) + (f[2] if r.random() < 0.5 else b"")
        elif c < 0.8 and desc is not None and desc.name == "AnyValue":  # nesting around the limit
            level = _level_of(root, fields)
            if level is not None:
                fields[:] = _deep(level, wire.LIMIT + r.randrange(-3, 3), r)
        elif c < 0.9 and fields:
            del fields[r.randrange(len(fields))]
        elif fields:  # an overlong (5-byte) tag on a length-delimited field
            f = r.choice(fields)
            if f[1] == 2:
                tag = f[0] << 3 | 2
                b = [(tag >> (7 * k)) & 0x7F for k in range(5)]
                f[3:] = [f[3] if len(f) > 3 else None, bytes([x | 0x80 for x in b[:4]] + [b[4]])]


def _level_of(root: list, target: list, level: int = 0) -> int | None:
    if root is target:
        return level
    for f in root:
        if f[1] == 2 and isinstance(f[2], list):
            found = _level_of(f[2], target, level + 1)
            if found is not None:
                return found
    return None


def _mutate_bytes(r: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(r.randrange(1, 3)):
        c = r.random()
        if not b:
            b += bytes([r.randrange(256)])
        elif c < 0.35:
            i = r.randrange(len(b))
            b[i] ^= 1 << r.randrange(8)
        elif c < 0.55:
            del b[r.randrange(len(b)):]
        elif c < 0.75:
            i = r.randrange(len(b) + 1)
            b[i:i] = bytes(r.choice([[r.randrange(256)], [0x0E], [0x0F], [0xFF] * 11, [0x2B], [0x2C], [0x80]]))
        elif c < 0.9:
            i = r.randrange(len(b))
            del b[i:i + r.randrange(1, 4)]
        else:
            i = r.randrange(len(b))
            b[i] = r.choice([0x06, 0x07, 0x0B, 0x0C, 0xFF, 0x80, 0x00])
    return bytes(b)


# -- the comparisons -----------------------------------------------------------------------------------------

def _upb_accepts(raw: bytes) -> bool:
    try:
        parse_request(raw)
        return True
    except MalformedRequest:
        return False


def _c_reads(raw: bytes, wanted: frozenset[str] | None) -> list | None:
    try:
        return wire.read(raw, wanted)
    except MalformedRequest:
        return None


def _view_reading(raw: bytes) -> list:
    """What the two-pass path reads (``otel_llm.otlp.view``), in the shape ``fast.wire.read`` returns."""
    out = []
    for rs in RequestView.FromString(raw).resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans = []
            for encoded in ss.spans:
                s = SpanView.FromString(encoded)
                status = s.status
                spans.append((encoded, s.trace_id, s.span_id, s.parent_span_id, s.kind, s.start_time_unix_nano,
                              s.end_time_unix_nano, bool(status) and is_error(status), dict(s.attributes) or None))
            scopes.append((ss.scope, ss.schema_url, spans))
        out.append((rs.resource, rs.schema_url, scopes))
    return out


def _check(raw: bytes, counts: dict[str, int]) -> None:
    upb = _upb_accepts(raw)
    every = _c_reads(raw, None)
    assert (every is not None) == upb, (raw, upb)
    counts["accepted" if upb else "refused"] += 1
    if not upb:
        return
    assert every == _view_reading(raw), raw  # every key kept: the same reading as the view's, span by span
    keys = POLICY_KEYS if len(raw) % 2 else frozenset()
    one = S.extract(S.read_request(raw, keys, one_pass=True), raw, keys)
    two = S.extract(S.read_request(raw, keys, one_pass=False), raw, keys)
    assert repr(one) == repr(two), raw  # repr: a NaN latency from a flipped byte compares unequal to itself


def test_differential_against_upb_and_the_two_pass_path() -> None:
    r = random.Random(20261130)
    counts = {"accepted": 0, "refused": 0}
    for _ in range(800):
        raw = _request(r).SerializeToString()
        _check(raw, counts)
        for _ in range(3):
            tree = _parse(raw, _DESC)
            _mutate_tree(r, tree)
            changed = _encode(tree)
            _check(changed, counts)
            _check(_mutate_bytes(r, changed), counts)
        for _ in range(2):
            _check(_mutate_bytes(r, raw), counts)
    # both verdicts well represented (the inputs are fixed by the seed: these are what they give)
    assert counts["accepted"] > 2000 and counts["refused"] > 2000, counts


@pytest.mark.parametrize("seed", range(3))
def test_random_bytes_and_small_inputs(seed: int) -> None:
    """Short random inputs and every prefix of a valid request: framing errors at every position."""
    r = random.Random(seed)
    counts = {"accepted": 0, "refused": 0}
    for _ in range(1500):
        _check(bytes(r.randrange(256) for _ in range(r.randrange(12))), counts)
    raw = _request(random.Random(seed + 100)).SerializeToString()
    for i in range(len(raw) + 1):
        _check(raw[:i], counts)
    assert counts["accepted"] and counts["refused"]


def _field(num: int, body: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(body)) + body


def _span_request(span_body: bytes) -> bytes:
    return _field(1, _field(2, _field(2, span_body)))  # request.resource_spans.scope_spans.spans


@pytest.mark.parametrize("delta", range(-3, 4))
def test_nesting_limit_boundary(delta: int) -> None:
    """Depths around the limit, as messages (array / kvlist values) and as groups, at several levels: the same
    verdict as upb (which accepts exactly ``LIMIT`` levels below the request)."""
    counts = {"accepted": 0, "refused": 0}
    target = wire.LIMIT + delta
    # a span attribute's AnyValue is at level 5 (request 0, resource_spans 1, scope_spans 2, span 3, kv 4)
    for finish in ("array", "kvlist", "groups", "empty"):
        value = _encode(_deep_exact(5, target, finish))
        attribute = _field(9, _field(1, b"k") + _field(2, value))
        raw = _span_request(_field(1, b"\1" * 16) + _field(2, b"\1" * 8) + attribute)
        _check(raw, counts)
    groups = b"\x2b" * target + b"\x2c" * target  # at the top: unknown field 5 groups, levels 1..target
    _check(groups, counts)
    _check(_span_request(b"\x9b\x01" * (target - 3) + b"\x9c\x01" * (target - 3)), counts)  # in a span (level 3)
    assert counts["accepted"] if delta <= 0 else counts["refused"]


def _deep_exact(level: int, target: int, finish: str) -> list:
    """An AnyValue's fields at ``level`` whose deepest message or group is at exactly ``target``."""
    if finish == "groups" and target - level <= 3:
        inner: list = []
        for _ in range(target - level):
            inner = [[9, 3, inner]]
        return inner
    if target == level:
        return [[1, 2, b"x", None]]
    if finish == "kvlist" and target - level >= 3:  # AnyValue > KeyValueList > KeyValue > AnyValue
        return [[6, 2, [[1, 2, [[2, 2, _deep_exact(level + 3, target, finish), None]], None]], None]]
    if target - level == 1:
        return [[5, 2, [], None]]  # an empty ArrayValue one level down
    return [[5, 2, [[1, 2, _deep_exact(level + 2, target, finish), None]], None]]


def test_the_fallback_reads_the_same() -> None:
    """``read_request`` without the extension's pass (``one_pass=False``) parses with the full classes, and
    ``extract`` over either gives the same result; a refused request is refused with a reason either way."""
    raw = _request(random.Random(7)).SerializeToString()
    two = S.read_request(raw, one_pass=False)
    assert isinstance(two, ExportTraceServiceRequest)
    one = S.read_request(raw, one_pass=True)
    assert isinstance(one, S.Received)
    assert repr(S.extract(one, raw)) == repr(S.extract(two, raw))
    # keys the one-pass reading did not keep: extract reads the view instead (still the same result)
    assert repr(S.extract(one, raw, POLICY_KEYS)) == repr(S.extract(two, raw, POLICY_KEYS))
    bad = _span_request(_field(5, b"\xff"))  # a span name that is not UTF-8
    for one_pass in (True, False):
        with pytest.raises(MalformedRequest, match="malformed ExportTraceServiceRequest"):
            S.read_request(bad, one_pass=one_pass)
    with pytest.raises(MalformedRequest, match="invalid UTF-8 in opentelemetry.proto.trace.v1.Span.name"):
        S.read_request(bad, one_pass=True)


def test_wanted_keys_cover_what_extract_reads() -> None:
    """The one-pass reading keeps only the attribute keys extract reads; each reader's keys are among them."""
    from otel_llm.core.summary import ATTRIBUTE_SLOTS

    for key in (*ATTRIBUTE_SLOTS, sc.LATENCY_E2E, sc.LATENCY_TTFT, sc.VLLM_TTFT, sc.VLLM_E2E, sc.VLLM_QUEUE,
                sc.VLLM_PREFILL, sc.VLLM_DECODE, sc.VLLM_PROMPT_TOKENS, sc.VLLM_COMPLETION_TOKENS,
                sc.VLLM_RESPONSE_MODEL, sc.RESPONSE_FINISH_REASONS, sc.RESPONSE_TIME_TO_FIRST_CHUNK,
                sc.REQUEST_MODEL, sc.SAMPLING_REASON, sc.PROVIDER_NAME):
        assert key in S.WANTED, key


def test_schema_tables_follow_the_descriptors() -> None:
    """The C tables list every field of every message type under the request, with its number and kind."""
    msgs = wire.tables(_DESC)
    seen, todo, n = set(), [_DESC], 0
    while todo:
        d = todo.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        n += 1
        todo.extend(f.message_type for f in d.fields if f.message_type is not None)
    assert len(msgs) == n
    names = {name: (number, kind) for fields in msgs for number, kind, _, _, name in fields}
    assert names["opentelemetry.proto.trace.v1.Span.name"] == (5, wire_schema.STRING)
    assert names["opentelemetry.proto.trace.v1.Span.trace_id"] == (1, wire_schema.BYTES)
    assert names["opentelemetry.proto.trace.v1.Span.start_time_unix_nano"] == (7, wire_schema.FIXED64)
    assert names["opentelemetry.proto.common.v1.AnyValue.double_value"] == (4, wire_schema.FIXED64)
    assert names["opentelemetry.proto.trace.v1.Span.flags"] == (16, wire_schema.FIXED32)


def test_the_gateway_says_when_its_receivers_parse_twice(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Without the extension the gateway starts anyway and logs why its receivers use two passes."""
    from collector_testkit import loopback_config
    from otel_llm_collector.gateway import Gateway

    monkeypatch.setattr(wire, "AVAILABLE", False)
    monkeypatch.setattr(wire, "REASON", "the C extension is not built (test)")
    with caplog.at_level("WARNING", logger="otel_llm_collector"):
        g = Gateway(loopback_config(), manual_ticks=True).start()
        g.shutdown()
    assert any("two passes" in r.getMessage() and "(test)" in r.getMessage() for r in caplog.records)
