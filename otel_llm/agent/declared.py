"""The wire form of every record that crosses to the agent, read in one place.

Two families of declared records cross: the engine's request records (records.py: tag ``0xD0``) and the
agent link's (control.py: tag ``0xC1``). Each is a dataclass with named fields, a ``VERSION`` and each
field's accepted types; on the wire one tag byte, one kind byte, then ``marshal`` of ``(version, {field:
value})``. ``Codec`` is one family: it frames a record's fields and reads them back, refusing anything else
with a ``RecordError`` that says what (another tag, kind or shape, a newer version, a field of the wrong
type, a missing required one). The bytes come from another process: ``marshal``'s counts are checked
against the bytes before it allocates (bounded_marshal.py), and every value's type before a record is made.
A reader ignores the fields it does not know; a record without a field gets the field's default.
"""

from __future__ import annotations

import marshal
from dataclasses import fields
from typing import Any

from . import bounded_marshal


ATTRIBUTE_VALUES = (str, bool, int, float)  # a span attribute's value (or a sequence of them), as records carry it


def attribute_value(value: Any) -> Any:
    """``value`` as a span attribute takes it (a sequence as a tuple), or None where it is none: a value of
    another type, or a sequence holding one (every record's attributes, sampling parameters and resource
    are read by this one rule)."""
    if isinstance(value, ATTRIBUTE_VALUES):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(x, ATTRIBUTE_VALUES) for x in value):
        return tuple(value)
    return None


class RecordError(ValueError):
    """Bytes that are not a record of a kind and version this reader knows."""


class Codec:
    """One family of declared records. ``kinds``: kind byte -> record class; ``types``: each class's fields and
    their accepted types; ``max_size``: the longest record read; ``what``: the family's name in errors;
    ``foreign``: the error for bytes of another form (another tag)."""

    def __init__(self, tag: int, kinds: dict[int, type], types: dict[type, dict[str, tuple[type, ...]]],
                 max_size: int, what: str, foreign: str) -> None:
        self.tag, self.kinds, self.types, self.max_size = tag, kinds, types, max_size
        self.what, self.foreign = what, foreign
        self.kind_of = {cls: kind for kind, cls in kinds.items()}
        self.heads = {kind: bytes((tag, kind)) for kind in kinds}
        self.names = {cls: tuple(f.name for f in fields(cls)) for cls in kinds.values()}
        # each field's (name, type) pairs: marshal makes the built-in types themselves, never a subclass, so
        # a record's fields pass at once when each (name, type(value)) is one of these (bool is its own type
        # here: refused where only numbers are declared); anything else goes through the per-field check
        self.accepts = {cls: frozenset((name, t) for name, accepted in kind_types.items() for t in accepted)
                        for cls, kind_types in types.items()}

    def frame(self, kind: int, version: int, values: dict[str, Any]) -> bytes:
        """The wire form of a record of ``kind`` whose fields are ``values``, by name."""
        return self.heads[kind] + marshal.dumps((version, values))

    def fields_of(self, record: Any) -> dict[str, Any]:
        return {name: getattr(record, name) for name in self.names[type(record)]}

    def loads(self, data: bytes) -> Any:
        """What follows the tag and kind bytes, read by ``marshal`` in place once its counts were checked."""
        try:
            return bounded_marshal.loads(data, 2)
        except (EOFError, ValueError, TypeError) as exc:
            raise RecordError(f"{self.what} unreadable: {exc}") from None

    def read(self, data: bytes) -> tuple[type, dict[str, Any]]:
        """The class of the record in ``data`` and its fields this reader knows, each of a declared type (the
        dict marshal made for this call: the caller may keep it as the record's fields)."""
        if len(data) < 3 or data[0] != self.tag:
            raise RecordError(self.foreign)
        if len(data) > self.max_size:
            raise RecordError(f"{self.what} of {len(data)} bytes")
        cls = self.kinds.get(data[1])
        if cls is None:
            raise RecordError(f"{self.what} of unknown kind {data[1]}")
        body = self.loads(data)
        if not (type(body) is tuple and len(body) == 2 and type(body[0]) is int and type(body[1]) is dict):
            raise RecordError(f"{cls.__name__} of another shape")
        version, values = body
        if version > cls.VERSION or version < 1:
            raise RecordError(f"{cls.__name__} version {version}, this reader knows up to {cls.VERSION}")
        if not self.accepts[cls].issuperset(zip(values, map(type, values.values()))):
            values = self._known(cls, values)  # a field this reader does not know, or one of the wrong type
        return cls, values

    def make(self, cls: type, values: dict[str, Any]) -> Any:
        try:
            return cls(**values)
        except TypeError as exc:  # a required field missing
            raise RecordError(f"{cls.__name__}: {exc}") from None

    def decode(self, data: bytes) -> Any:
        """The record in ``data`` (``read``, then made)."""
        return self.make(*self.read(data))

    def _known(self, cls: type, values: dict) -> dict:
        """The fields of ``values`` this reader knows, each checked against its declared types."""
        types = self.types[cls]
        known = {}
        for name, value in values.items():
            accepted = types.get(name) if type(name) is str else None
            if accepted is None:
                continue  # a field a newer writer added
            if not isinstance(value, accepted) or isinstance(value, bool) and bool not in accepted:
                raise RecordError(f"{cls.__name__}.{name}: {type(value).__name__}")
            known[name] = value
        return known
