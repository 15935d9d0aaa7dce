"""``marshal.loads`` for bytes another process wrote: walked first, so bad bytes cost no more than their size.

``marshal`` reads a list's or tuple's length and allocates it before it reads the items: four changed
bytes make it ask for billions of slots (gigabytes, or the kernel's OOM killer), and Python's documentation
says it is not meant for untrusted data. ``loads`` first walks the bytes with the grammar of the values our
records hold (None, booleans, ints, floats, strings, bytes, tuples, lists, dicts, back-references), checks
that every declared length is there, in full, and that nesting stays shallow; only then does it hand them
to ``marshal``. Anything else (code objects, sets, complex numbers, a length past the end) is a
``ValueError`` before a byte is allocated for it.
"""

from __future__ import annotations

import marshal
import struct
from typing import Any

MAX_DEPTH = 32
_I32 = struct.Struct("<i")
_FLAG_REF = 0x80
_FIXED = {ord("N"): 0, ord("F"): 0, ord("T"): 0, ord("i"): 4, ord("g"): 8, ord("r"): 4}
_SIZED = {ord(c) for c in "stuaA"}  # int32 length, then that many bytes
_SHORT = {ord("z"), ord("Z")}  # one-byte length, then that many bytes
_SEQUENCES = {ord("("), ord("[")}  # int32 count, then that many values
_SMALL_TUPLE = ord(")")  # one-byte count
_DICT, _NULL, _LONG = ord("{"), ord("0"), ord("l")


def loads(data: bytes) -> Any:
    """The value in ``data``; ValueError for bytes that are not one value of the grammar above, whole."""
    data = bytes(data)
    end = _walk(data, 0, 0)
    if end != len(data):
        raise ValueError(f"marshal data with {len(data) - end} bytes after its value")
    return marshal.loads(data)


def _walk(b: bytes, at: int, depth: int) -> int:
    """The offset after the value at ``at``."""
    if depth > MAX_DEPTH:
        raise ValueError("marshal data nested too deep")
    if at >= len(b):
        raise ValueError("marshal data ends inside a value")
    code = b[at] & ~_FLAG_REF
    at += 1
    fixed = _FIXED.get(code)
    if fixed is not None:
        return _need(b, at, fixed)
    if code in _SHORT:
        n = b[_need(b, at, 1) - 1]
        return _need(b, at + 1, n)
    if code in _SIZED or code == _LONG:
        n = _I32.unpack_from(b, _need(b, at, 4) - 4)[0]
        if code == _LONG:
            n = 2 * abs(n)  # digits of 15 bits, two bytes each
        elif n < 0:
            raise ValueError("marshal data with a negative length")
        return _need(b, at + 4, n)
    if code in _SEQUENCES or code == _SMALL_TUPLE:
        if code == _SMALL_TUPLE:
            n = b[_need(b, at, 1) - 1]
            at += 1
        else:
            n = _I32.unpack_from(b, _need(b, at, 4) - 4)[0]
            at += 4
        if n < 0 or n > len(b) - at:  # each value takes a byte at least
            raise ValueError(f"marshal data declaring {n} values where {len(b) - at} bytes are left")
        for _ in range(n):
            at = _walk(b, at, depth + 1)
        return at
    if code == _DICT:
        while True:
            if at >= len(b):
                raise ValueError("marshal data ends inside a dict")
            if b[at] == _NULL:
                return at + 1
            at = _walk(b, _walk(b, at, depth + 1), depth + 1)
    raise ValueError(f"marshal data of type {chr(code)!r}, which no record holds")


def _need(b: bytes, at: int, n: int) -> int:
    if at + n > len(b):
        raise ValueError("marshal data ends inside a value")
    return at + n
