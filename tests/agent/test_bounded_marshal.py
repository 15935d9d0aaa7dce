"""The bounded walk over marshal bytes another process wrote (otel_llm/agent/bounded_marshal.py): the C walker
(``_bounded_fast.c``) against the Python one, its reference, on every record kind the agent reads, their
truncations, flipped bits, replaced bytes and random bytes: the same bytes taken, the same refused with the same
message, and ``loads`` the same value or the same error. Deterministic seeds; thousands of cases a kind.

CI also runs this file against a build with AddressSanitizer and UndefinedBehaviorSanitizer (.ci/c_checks.py):
the C walker also reads each input from a heap buffer of exactly its size (``_exact``: Python's allocator is
``malloc`` there), so a read one byte past the end is reported (a ``bytes`` object has a NUL byte after its
end)."""

from __future__ import annotations

import ctypes
import marshal
import random
import struct

import pytest

from otel_llm.agent import bounded_marshal, control, records
from test_control_records import _config, _destinations, _engine
from test_request_records import _enrichment, _finish, _start

fast = pytest.mark.skipif(not bounded_marshal.FAST, reason=f"no C walker: {bounded_marshal.REASON}")


def _bodies() -> dict[str, bytes]:
    """Each kind's marshal bytes as they cross (a request record's body after its tag and kind bytes)."""
    out = {name: records.encode(r)[2:] for name, r in (
        ("start", _start()), ("finish", _finish()), ("enrichment", _enrichment()),
        ("sink_counts", records.SinkCounts(pid=7, steps_dropped=3, requests_dropped=1)))}
    out["batch"] = records.batch([records.encode(_start()), records.encode(_finish())])[2:]
    out["config"] = control.config_message(_config(), _destinations())[2:]  # (after its tag and kind bytes)
    out["engine"] = control.engine_message(_engine())[2:]
    out["release"] = control.release_message()[2:]
    # every code the walker takes, in one value: sets, frozensets, longs, bytes, interned and ASCII strings,
    # short tuples, references
    shared = "shared-string"
    out["every_code"] = marshal.dumps(({1, 2}, frozenset({"x"}), 2 ** 100, -(2 ** 70), b"\x00bytes", "é",
                                       "ascii", (), [None, True, False, 1.5, -3], {"k": (shared, shared)}))
    return out


BODIES = _bodies()


def _checked(check, data: bytes) -> str | None:
    try:
        check(data)
    except ValueError as exc:
        return str(exc)
    return None


def _loaded(loads, data: bytes, start: int = 0) -> tuple:
    """What ``loads`` answered, comparable: a value as marshal writes it again (a back-reference can make
    a list that holds itself, which ``==`` would recurse into)."""
    try:
        return ("value", marshal.dumps(loads(data, start)))
    except (EOFError, ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


def _exact(data: bytes):
    """``data`` in a buffer of exactly its size (ctypes allocates one for more than 16 bytes)."""
    return (ctypes.c_char * len(data)).from_buffer_copy(data)


def _same(data: bytes) -> str | None:
    """The walkers' common answer on ``data`` (each asserted equal), and ``loads``' too."""
    got = _checked(bounded_marshal.check_py, data)
    exact = _exact(data)
    assert _checked(bounded_marshal.check, data) == got == _checked(bounded_marshal.check, exact), data
    value = _loaded(bounded_marshal.loads_py, data)
    assert _loaded(bounded_marshal.loads, data) == value == _loaded(bounded_marshal.loads, exact), data
    if got is not None:  # refused by the walk: marshal never saw it
        assert value == ("ValueError", got)
    return got


def _garbled(body: bytes, rng: random.Random):
    """Truncations at every length, every single flipped bit, and replaced bytes (several at once)."""
    for n in range(len(body)):
        yield body[:n]
    for i in range(len(body)):
        for bit in range(8):
            data = bytearray(body)
            data[i] ^= 1 << bit
            yield bytes(data)
    for _ in range(2000):
        data = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        yield bytes(data[:rng.randint(1, len(data))]) if rng.random() < 0.2 else bytes(data)


def test_the_python_walker_takes_every_record_kind_and_loads_reads_it():
    for name, body in BODIES.items():
        assert bounded_marshal.check_py(body) is None, name
        assert bounded_marshal.loads_py(body) == marshal.loads(body), name
        assert bounded_marshal.loads_py(b"\xd0\x01" + body, 2) == marshal.loads(body), name


@fast
@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_c_walker_takes_and_refuses_what_the_python_one_does(name):
    body = BODIES[name]
    assert _same(body) is None
    assert bounded_marshal.loads(b"\xd0\x01" + body, 2) == marshal.loads(body)
    rng = random.Random(f"bounded-marshal-{name}")
    refused = 0
    for data in _garbled(body, rng):
        refused += _same(data) is not None
    assert refused > len(body)  # every truncation at least (the bytes end before the values do)


@fast
def test_random_bytes_alike_in_both_walkers():
    rng = random.Random(4343)
    codes = b"0NFTigrstuaAzZ([<>){l" + bytes(c | 0x80 for c in b"([{stz") + b"c\x00\xff"
    answers = set()
    for i in range(20000):
        if i % 2:  # mostly codes the walker knows, so the walk goes deep before it stops
            n = rng.randint(1, 40)
            data = bytes(rng.choice(codes) if rng.random() < 0.6 else rng.randrange(256) for _ in range(n))
        else:
            data = rng.randbytes(rng.randint(0, 64))
        said = _same(data)
        answers.add("taken" if said is None else said.split(" ")[2])
    # the run saw each answer: taken, cut short, a refused code and a count past the end
    assert {"taken", "cut", "of", "claims"} <= answers


@pytest.mark.parametrize("data, says", [
    (b"(" + struct.pack("<i", 2 ** 31 - 1), "claims 2147483647 items or bytes where 0 are left"),
    (b"[" + struct.pack("<i", -1), "claims -1 items"),
    (b"l" + struct.pack("<i", -(2 ** 31)), "claims 4294967296 items"),  # digits: two bytes each
    (b"s" + struct.pack("<i", 5) + b"abcd", "claims 5 items or bytes where 4 are left"),
    (b"z\x09abc", "claims 9"),
    (b")\x03NN", "claims 3 items or bytes where 2 are left"),
    (b"g\x00\x00\x00", "cut short"),  # a float's eight bytes past the end
    (b"i\x01", "cut short"),
    (b"{z\x01a", "cut short"),  # a dict without its NULL
    (b"c" + b"\x00" * 40, "of type 'c'"),  # a code object
    (b"y" + b"\x00" * 16, "of type 'y'"),  # a complex number
    (b"\xe3", "of type 'c'"),  # the reference flag does not hide a code
    (b"[\x01\x00\x00\x00" * (bounded_marshal.MAX_DEPTH + 1) + b"N", "nested deeper than 64"),
    (b"{" * (bounded_marshal.MAX_DEPTH + 1), "nested deeper than 64"),
])
def test_bad_counts_codes_and_depths_are_refused_with_a_clear_message(data, says):
    for check in (bounded_marshal.check_py, bounded_marshal.check):
        with pytest.raises(ValueError, match=says.replace("(", r"\(")):
            check(data)


def test_nesting_up_to_the_bound_is_taken():
    value: object = None
    for _ in range(bounded_marshal.MAX_DEPTH - 1):
        value = [value]
    data = marshal.dumps(value)
    for loads in (bounded_marshal.loads_py, bounded_marshal.loads):
        assert loads(data) == value


def test_loads_reads_from_start_of_any_bytes_like_and_refuses_a_start_outside():
    body = BODIES["finish"]
    data = b"\xd0\x02" + body
    for loads in (bounded_marshal.loads_py, bounded_marshal.loads):
        for given in (data, bytearray(data), memoryview(data)):
            assert loads(given, 2) == marshal.loads(body)
        for start in (-1, len(data) + 1):
            with pytest.raises(ValueError, match="outside"):
                loads(data, start)
        with pytest.raises(ValueError, match="cut short"):
            loads(data, len(data))


@fast
def test_the_choice_is_the_c_walker_where_it_was_built():
    from otel_llm.agent import _bounded_fast

    assert bounded_marshal.loads is _bounded_fast.loads and bounded_marshal.check is _bounded_fast.check
    assert bounded_marshal.REASON is None
