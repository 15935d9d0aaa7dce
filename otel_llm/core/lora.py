"""LoRA adapters as labels and names, bounded: adapter names come from users, and a server may load thousands.

``AdapterLabels`` gives a request's adapter label for its metrics: the first ``cap`` distinct names (each
cut to ``max_length`` characters) label series of their own; every later one is ``other`` and counted
(``collapsed``, in ``stats()``), so the series a metric can have stay ``cap + 1`` per other label set.
The step metrics use the same instance (``AdapterStepMetrics``), so an adapter has one label everywhere and
one cap bounds every metric.
``AdapterNames`` remembers the names of adapter ids, for step spans, within ``max_entries``.
``LoRAEvent``: an adapter loaded into or evicted from the model runner's cache, as a step record carries it
(instrumentation/vllm/worker_facts.py measures it where it happens).

How a step that ran several adapters is counted (``AdapterStepMetrics``):

* the step-scoped metrics (step time, steps, MFU, MBU) count each step once, so their sums over adapters stay
  the engine's totals: the label is the adapter's when the step ran one, ``multiple`` when it ran several,
  none when it ran the base model only. A list of the adapters as a label would grow with the combinations
  of adapters (``cap`` choose ``max_loras``), which no cap bounds;
* the adapter-scoped counter ``llm.server.lora.steps`` counts one point per adapter active in the step, so
  each adapter's steps are complete, mixed steps included; its sum over adapters is adapter-steps, not steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import semconv as sc

LORA_LOADED, LORA_EVICTED = 1, 2  # LoRAEvent.kind (the step record's wire carries the number)
EVENT_NAMES = {LORA_LOADED: sc.LORA_EVENT_LOADED, LORA_EVICTED: sc.LORA_EVENT_EVICTED}


class LoRAEvent(NamedTuple):
    """An adapter loaded into or evicted from the model runner's adapter cache in a step. ``at``: when it began
    (time.monotonic, the step hooks' clock); ``seconds``: the load's time (0 for an eviction)."""

    kind: int  # LORA_LOADED | LORA_EVICTED
    lora_id: int
    at: float
    seconds: float

_RESERVED = frozenset((sc.LORA_OTHER, sc.LORA_MULTIPLE))  # label values of ours: an adapter so named is "other"
DEFAULT_CAP = 64  # adapters with series of their own (per process): more is what "other" is for
MAX_LABEL_LENGTH = 128  # characters of an adapter name kept as a label value


class AdapterLabels:
    reserved = _RESERVED  # label values of ours: a name so spelt is ``other``
    other = sc.LORA_OTHER

    def __init__(self, cap: int = DEFAULT_CAP, max_length: int = MAX_LABEL_LENGTH) -> None:
        if cap < 0 or max_length < 1:
            raise ValueError(f"adapter label cap {cap} and length {max_length}: need cap >= 0, length >= 1")
        self.cap = cap
        self.max_length = max_length
        self._admitted: set[str] = set()
        self.collapsed = 0  # points labelled "other": requests, and the steps and cache events that share the cap

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
        if len(admitted) < self.cap and name not in self.reserved:
            admitted.add(name)
            return name
        self.collapsed += 1
        return self.other


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

    def event_attributes(self, event: LoRAEvent) -> dict[str, Any]:
        """A load or evict event's attributes on a span: the adapter (name and id) and a load's seconds."""
        out: dict[str, Any] = {sc.LORA_ID: event.lora_id, sc.LORA_NAME: self.name(event.lora_id)}
        if event.kind == LORA_LOADED:
            out[sc.LORA_LOAD_TIME] = event.seconds
        return out


class AdapterStepMetrics:
    """The adapters of engine steps as metrics (``labels``: the request metrics' ``AdapterLabels``, so the same
    cap bounds both): the model runner's adapter-cache events (load time and count, evictions) and the steps
    each adapter was active in, by adapter label; ``step_label`` is the label of a step's step-scoped metrics."""

    def __init__(self, meter: Any, names: AdapterNames, labels: AdapterLabels) -> None:
        from .metrics import LORA_EVICTIONS, LORA_LOAD_DURATION, LORA_STEPS, create
        self._loads = create(meter, LORA_LOAD_DURATION)
        self._evictions = create(meter, LORA_EVICTIONS)
        self._steps = create(meter, LORA_STEPS)
        self._names = names
        self._labels = labels

    def label(self, lora_id: int) -> str:
        return self._labels.label(self._names.name(lora_id))  # type: ignore[return-value]  (a name: never None)

    def step_label(self, step: Any) -> str | None:
        """The adapter label of a step's step-scoped metrics: None for the base model only, the adapter's label
        when the step ran one, ``multiple`` when it ran several (each step counted once: see the module's doc)."""
        loras = step.loras
        if not loras:
            return None
        return self.label(loras[0]) if len(loras) == 1 else sc.LORA_MULTIPLE

    def record(self, steps: Any) -> None:
        """A batch of steps: one add per adapter label for the steps they were active in, and the cache's
        events (``StepRecord.worker``); nothing for steps that ran no adapter."""
        active: dict[int, int] = {}  # adapter id -> steps: labelled once per batch, not once per step
        for step in steps:
            loras = step.loras
            if loras:
                for lora_id in loras:
                    active[lora_id] = active.get(lora_id, 0) + 1
            worker = step.worker
            if worker is None or not worker.lora_events:
                continue
            for e in worker.lora_events:
                attributes = {sc.LORA_NAME: self.label(e.lora_id)}
                if e.kind == LORA_LOADED:
                    self._loads.record(e.seconds, attributes)
                elif e.kind == LORA_EVICTED:
                    self._evictions.add(1, attributes)
        by_label: dict[str, int] = {}
        for lora_id, n in active.items():
            name = self.label(lora_id)
            by_label[name] = by_label.get(name, 0) + n
        for name, n in by_label.items():
            self._steps.add(n, {sc.LORA_NAME: name})


def span_parts(step: Any, names: AdapterNames) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any], float]]]:
    """What a step's worker facts add to its span: attributes (the drafter's time) and events (adapter loads
    and evictions: name, attributes, engine monotonic start)."""
    worker = step.worker
    attributes: dict[str, Any] = {}
    if worker is None:
        return attributes, []
    if worker.draft_s is not None:
        attributes[sc.STEP_SPEC_DRAFT_TIME] = worker.draft_s
    events = [(EVENT_NAMES[e.kind], names.event_attributes(e), e.at) for e in worker.lora_events
              if e.kind in EVENT_NAMES]
    return attributes, events


def request_load_events(lora_id: int | None, steps: Any,
                        names: AdapterNames) -> list[tuple[str, dict[str, Any], float]]:
    """The loads of a request's adapter in the steps that served it (the request needed them: the worker loads
    a step's adapters before its forward), as events for its span: the step span's ``llm.lora.loaded``, same
    attributes (name, id, load time), same engine monotonic start."""
    if lora_id is None:
        return []
    return [(sc.LORA_EVENT_LOADED, names.event_attributes(e), e.at)
            for step in steps if step.worker is not None
            for e in step.worker.lora_events if e.kind == LORA_LOADED and e.lora_id == lora_id]
