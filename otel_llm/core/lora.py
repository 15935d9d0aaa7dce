"""LoRA adapters as labels and names, bounded: adapter names come from users, and a server may load thousands.

``AdapterLabels`` gives a request's adapter label for its metrics: the first ``cap`` distinct names (each
cut to ``max_length`` characters) label series of their own; every later one is ``other`` and counted
(``collapsed``, in ``stats()``), so the series a metric can have stay ``cap + 1`` per other label set.
``AdapterNames`` remembers the names of adapter ids, for step spans, within ``max_entries``.
"""

from __future__ import annotations

from typing import Any

from .. import semconv as sc

DEFAULT_CAP = 64  # adapters with series of their own (per process): more is what "other" is for
MAX_LABEL_LENGTH = 128  # characters of an adapter name kept as a label value


class AdapterLabels:
    def __init__(self, cap: int = DEFAULT_CAP, max_length: int = MAX_LABEL_LENGTH) -> None:
        if cap < 0 or max_length < 1:
            raise ValueError(f"adapter label cap {cap} and length {max_length}: need cap >= 0, length >= 1")
        self.cap = cap
        self.max_length = max_length
        self._admitted: set[str] = set()
        self.collapsed = 0  # requests whose adapter was labelled "other"

    def label(self, name: str | None) -> str | None:
        """The label value for a request of adapter ``name`` (None: the base model, no label)."""
        if name is None:
            return None
        if not isinstance(name, str):
            name = str(name)
        name = name[:self.max_length]
        admitted = self._admitted
        if name in admitted:
            return name
        if len(admitted) < self.cap and name != sc.LORA_OTHER:
            admitted.add(name)
            return name
        self.collapsed += 1
        return sc.LORA_OTHER


class AdapterNames:
    """Adapter id -> name, for the adapters the engine's steps ran (bounded: cleared when full)."""

    def __init__(self, max_entries: int = 4096, max_length: int = MAX_LABEL_LENGTH) -> None:
        self._names: dict[int, str] = {}
        self._max = max_entries
        self._length = max_length

    def note(self, lora_id: int, name: str | None) -> None:
        if name is None or self._names.get(lora_id) == name:
            return
        if len(self._names) >= self._max:
            self._names.clear()
        self._names[lora_id] = str(name)[:self._length]

    def name(self, lora_id: int) -> str:
        return self._names.get(lora_id) or str(lora_id)

    def step_attributes(self, loras: tuple[int, ...], max_loras: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {sc.STEP_LORA_ADAPTERS: tuple(self.name(i) for i in loras),
                               sc.STEP_LORA_COUNT: len(loras)}
        if max_loras:
            out[sc.STEP_LORA_MAX] = max_loras
        return out
