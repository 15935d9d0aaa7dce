"""``marshal.loads`` for bytes another process wrote: walked first, so bad bytes cost no more than their size.

``marshal`` reads a list's or tuple's length and allocates it before it reads the items: four changed
bytes make it ask for billions of slots (gigabytes, or the kernel's OOM killer), and Python's documentation
says it is not meant for untrusted data. ``check`` first walks the bytes with the grammar of the values our
records hold (None, booleans, ints, floats, strings, bytes, tuples, lists, sets, dicts, back-references),
without recursion, and checks every declared count against the bytes left; only then does ``loads`` hand
them to ``marshal``. Anything else (code objects, complex numbers, a count past the end, containers nested
deeper than ``MAX_DEPTH``) is a ``ValueError`` before a byte is allocated for it. One walker for every record
that crosses to the agent (request records, control records).

The walk is in C where the optional extension ``_bounded_fast`` was built (setup.py): it takes and refuses
exactly what ``check_py``, the reference, does, with the same messages (tests/agent/test_bounded_marshal.py),
and its ``loads`` walks and reads a record's body in place. This module is the one place that chooses
(``FAST``, ``REASON``).
"""

from __future__ import annotations

import marshal
from typing import Any


MAX_DEPTH = 64  # open containers at once (a record nests a few); _bounded_fast.c's stack has as many levels


def loads_py(data: bytes, start: int = 0) -> Any:
    """The value in ``data[start:]``; ValueError for bytes that ``check`` refuses, and marshal's own errors
    (EOFError, ValueError, TypeError) for what it cannot read. ``loads`` is this, or its C twin where it was
    built (the same answers, without a copy of ``data[start:]``)."""
    if not 0 <= start <= len(data):
        raise ValueError(f"start {start} outside {len(data)} bytes")
    raw = bytes(data[start:]) if start else bytes(data)
    check_py(raw)
    return marshal.loads(raw)


# marshal's value codes a record may hold (Python's marshal.c, format 4; the 0x80 bit marks a value it keeps
# a reference to): how many bytes follow the code, or how a length is read
_FIXED = {ord(c): size for c, size in (("0", 0), ("N", 0), ("F", 0), ("T", 0), ("i", 4), ("g", 8), ("r", 4))}
_SIZED = {ord(c): 4 for c in "stuaA"} | {ord(c): 1 for c in "zZ"}  # a length of this many bytes, then the bytes
_COUNTED = {ord(c): 4 for c in "([<>"} | {ord(")"): 1}  # a count of this many bytes, then the items
_DICT, _LONG, _NULL = ord("{"), ord("l"), ord("0")


def check_py(raw: bytes) -> None:
    """Refuses bytes that would make ``marshal.loads`` allocate more than they hold: marshal allocates a
    tuple's or list's items, and a long's digits, by the count it reads, before reading them (a flipped byte
    can ask for gigabytes). Each count, and each fixed-size value, is checked against the bytes left; only
    the codes a record's values use are accepted, nested at most ``MAX_DEPTH`` deep. ``marshal.loads`` still
    checks everything else. The reference: ``check`` is this, or the C walker, which answers alike."""
    end, i = len(raw), 0
    open_: list[int] = [1]  # values still to read at each open level (-1: a dict's, until its NULL key)
    while open_:
        left = open_[-1]
        if left == 0:
            open_.pop()
            continue
        if i >= end:
            raise ValueError("marshal data cut short")
        code = raw[i] & 0x7F
        i += 1
        if left > 0:
            open_[-1] = left - 1
        elif code == _NULL:  # a dict's end
            open_.pop()
            continue
        size = _FIXED.get(code)
        if size is not None:
            if i + size > end:
                raise ValueError("marshal data cut short")
            i += size
            continue
        width = _SIZED.get(code) or _COUNTED.get(code) or (4 if code == _LONG else 0)
        if not width:
            if code == _DICT:
                if len(open_) >= MAX_DEPTH:
                    raise ValueError(f"marshal data nested deeper than {MAX_DEPTH}")
                open_.append(-1)
                continue
            raise ValueError(f"marshal data of type {chr(code)!r}")
        if i + width > end:
            raise ValueError("marshal data cut short")
        count = int.from_bytes(raw[i:i + width], "little", signed=width == 4)
        i += width
        if code == _LONG:
            count = abs(count) * 2  # 15-bit digits, two bytes each
        if count < 0 or count > end - i:
            raise ValueError(f"marshal data claims {count} items or bytes where {end - i} are left")
        if code in _COUNTED:
            if len(open_) >= MAX_DEPTH:
                raise ValueError(f"marshal data nested deeper than {MAX_DEPTH}")
            open_.append(count)
        else:
            i += count


def _choose() -> tuple[Any, Any, str | None]:
    try:
        from . import _bounded_fast
    except ImportError as exc:
        return loads_py, check_py, f"the C walker is not importable ({exc}): the Python walker"
    if _bounded_fast.MAX_DEPTH != MAX_DEPTH:
        return loads_py, check_py, f"the C walker's depth is {_bounded_fast.MAX_DEPTH}, not {MAX_DEPTH}: the Python one"
    return _bounded_fast.loads, _bounded_fast.check, None


# loads(data, start=0) -> the value (as loads_py); check(raw) -> None or ValueError (as check_py); REASON: why
# the Python walker, or None
loads, check, REASON = _choose()
FAST = REASON is None
