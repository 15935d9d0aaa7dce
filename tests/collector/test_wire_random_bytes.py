"""The one-pass receive path's C reader (``_wire.c``) fed hypothesis-made bytes: random bytes, wire-format
trees built from field numbers the OTLP schema uses (so nesting reaches spans and their attributes), and real
requests with bytes changed. Each input gets upb's verdict (``_check``: accepted or refused alike, the same
reading as the two-pass path when accepted, and no exception but ``MalformedRequest``). Under the sanitized
build (.ci/c_checks.py) a read past the input is AddressSanitizer's report: the input is a ``bytes`` object on
the heap (PYTHONMALLOC=malloc there)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from otel_llm_collector.fast import wire
from test_wire_onepass import _check, _request

pytestmark = pytest.mark.skipif(not wire.AVAILABLE, reason=f"no one-pass reader: {wire.REASON}")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


numbers = st.one_of(st.integers(1, 16), st.sampled_from([0, 19, 100, 536870911, 1 << 29]))
scalars = st.one_of(
    st.tuples(numbers, st.just(0), st.one_of(st.integers(0, 300), st.integers(0, (1 << 64) - 1))).map(
        lambda f: _tag(f[0], 0) + _varint(f[2])),
    st.tuples(numbers, st.sampled_from([1, 5]), st.binary(min_size=8, max_size=8)).map(
        lambda f: _tag(f[0], f[1]) + f[2][:8 if f[1] == 1 else 4]),
    st.tuples(numbers, st.binary(max_size=20)).map(lambda f: _tag(f[0], 2) + _varint(len(f[1])) + f[1]),
    st.tuples(numbers, st.sampled_from([3, 4, 6, 7])).map(lambda f: _tag(f[0], f[1])),  # groups, bad wire types
    st.sampled_from([b"\xff" * 11, b"\x80", b"\x0a\x05ab", b"\x12\x02\xc3\x28"]),  # overlong, truncated, bad UTF-8
)


def _message(children: st.SearchStrategy) -> st.SearchStrategy:
    """A message: fields, some of them submessages (length-delimited, or wrapped as a group)."""
    nested = st.tuples(numbers, st.lists(children, max_size=4), st.booleans()).map(
        lambda f: (_tag(f[0], 3) + b"".join(f[1]) + _tag(f[0], 4)) if f[2] and f[0] > 8
        else _tag(f[0], 2) + _varint(len(b"".join(f[1]))) + b"".join(f[1]))
    return st.one_of(scalars, nested)


trees = st.recursive(scalars, _message, max_leaves=40)


def _field(number: int, body: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(body)) + body


# a span whose fields are a random tree, inside resource_spans (1) > scope_spans (2) > spans (2): the reader's
# span and attribute paths, not only its validation
in_a_span = st.lists(trees, max_size=8).map(lambda fields: _field(1, _field(2, _field(2, b"".join(fields)))))


@settings(max_examples=400)
@given(st.binary(max_size=200))
def test_random_bytes_get_upbs_verdict(raw):
    _check(raw, {"accepted": 0, "refused": 0})


@settings(max_examples=400)
@given(st.lists(trees, max_size=6).map(b"".join))
def test_wire_trees_get_upbs_verdict(raw):
    _check(raw, {"accepted": 0, "refused": 0})


@settings(max_examples=400)
@given(st.lists(in_a_span, min_size=1, max_size=3).map(b"".join))
def test_spans_of_random_fields_get_upbs_verdict(raw):
    _check(raw, {"accepted": 0, "refused": 0})


@settings(max_examples=300)
@given(seed=st.integers(0, 1 << 32), edits=st.lists(
    st.tuples(st.sampled_from(["flip", "cut", "insert", "delete", "length"]), st.integers(0, 1 << 16),
              st.binary(min_size=1, max_size=6)), min_size=1, max_size=4))
def test_real_requests_with_bytes_changed_get_upbs_verdict(seed, edits):
    """A request built with the real classes, then bytes flipped, cut, inserted or deleted, or a length
    varint made to claim more than is there."""
    b = bytearray(_request(random.Random(seed)).SerializeToString())
    for what, at, data in edits:
        at %= len(b) + 1
        if what == "flip" and b:
            b[at % len(b)] ^= data[0] | 1
        elif what == "cut":
            del b[at:]
        elif what == "insert":
            b[at:at] = data
        elif what == "delete":
            del b[at:at + len(data)]
        else:
            b[at:at] = b"\x0a" + _varint(len(b) - at + data[0])  # a field 1 longer than what follows
    _check(bytes(b), {"accepted": 0, "refused": 0})
