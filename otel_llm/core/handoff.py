"""The KV hand-off of one request: what a disaggregated deployment's prefill instance saved and its
decode instance loaded (or waited for), as the engine's KV connector did it.

Engine-agnostic: an adapter (instrumentation/vllm/kv_connector.py) fills it where the connector runs
and hands it to the frontend that owns the request; the spans, the verdict and the metrics read it.
Stamps are on the engine host's monotonic clock, like every other engine stamp of the request.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any

from .diagnosis.history import RecentBySize

LOAD, SAVE = "load", "save"  # the hand-off's direction, as a span's llm.kv_transfer.direction


@dataclass(slots=True)
class KVHandoff:
    request_id: str
    connector: str = ""  # the connector's class name (the concrete one vLLM's factory built)
    # the decode side: prompt tokens whose KV came from outside (vLLM's num_external_computed_tokens)
    external_tokens: int = 0
    load_async: bool = False  # the connector loads outside the forward pass (the request waits for it)
    load_start: float | None = None  # engine monotonic: loading (or waiting for the KV) began / ended
    load_end: float | None = None
    load_s: float = 0.0  # seconds inside the connector's load calls (sync) or waiting for them (async)
    # the prefill side: the KV saved for another instance
    save_start: float | None = None
    save_end: float | None = None
    save_s: float = 0.0
    save_pending: bool = False  # the connector kept the blocks after the request finished (async send)
    # failures: blocks the connector could not load (recomputed by the engine), and calls that raised
    failed_blocks: int = 0
    failed_recv: bool = False  # the connector reported the request's receive as failed
    errors: int = 0
    error_type: str | None = None
    # the connector's own statistics where it keeps them (e.g. NIXL's transfer_duration)
    transfer_s: float | None = None
    bytes_transferred: int | None = None

    @property
    def failed(self) -> bool:
        return bool(self.errors or self.failed_blocks or self.failed_recv)

    @property
    def loaded(self) -> bool:
        return self.external_tokens > 0 or self.load_start is not None

    @property
    def saved(self) -> bool:
        return self.save_start is not None

    def merge(self, other: "KVHandoff") -> None:
        """Another record of the same request (a connector that both loads and saves reports twice)."""
        for f in fields(self):
            name = f.name
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in ("load_start", "save_start"):
                value = theirs if mine is None else mine if theirs is None else min(mine, theirs)
            elif name in ("load_end", "save_end"):
                value = theirs if mine is None else mine if theirs is None else max(mine, theirs)
            elif name in ("load_s", "save_s", "failed_blocks", "errors"):
                value = mine + theirs
            elif name in ("external_tokens",):
                value = max(mine, theirs)
            elif isinstance(mine, bool):
                value = mine or theirs
            else:
                value = mine if mine not in (None, "") else theirs
            setattr(self, name, value)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: Any) -> "KVHandoff":
        """A record as another process sent it; a field of the wrong type is refused (ValueError)."""
        if not isinstance(data, dict) or not isinstance(data.get("request_id"), str):
            raise ValueError("a KV hand-off record needs a request_id")
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            kind = _KINDS[f.name]
            if value is not None and not isinstance(value, kind):
                if kind is float and isinstance(value, int) and not isinstance(value, bool):
                    value = float(value)
                else:
                    raise ValueError(f"KV hand-off field {f.name}: {type(value).__name__}")
            kwargs[f.name] = value
        return cls(**kwargs)


_KINDS: dict[str, type] = {
    "request_id": str, "connector": str, "external_tokens": int, "load_async": bool, "load_start": float,
    "load_end": float, "load_s": float, "save_start": float, "save_end": float, "save_s": float,
    "save_pending": bool, "failed_blocks": int, "failed_recv": bool, "errors": int, "error_type": str,
    "transfer_s": float, "bytes_transferred": int,
}


class HandoffBook:
    """The frontend's hand-off records of requests still running, by request id, until each finishes.

    Bounded: a record for a request this frontend never finishes (another API server's, an engine that
    died) is evicted, oldest first, and counted."""

    def __init__(self, max_records: int = 4096) -> None:
        self.max_records = max_records
        self.records: dict[str, KVHandoff] = {}
        self.evicted = 0

    def add(self, record: KVHandoff) -> None:
        held = self.records.get(record.request_id)
        if held is not None:
            held.merge(record)
            return
        if len(self.records) >= self.max_records:
            self.records.pop(next(iter(self.records)))
            self.evicted += 1
        self.records[record.request_id] = record

    def pop(self, request_id: str) -> KVHandoff | None:
        return self.records.pop(request_id, None)


def handoff_attributes(h: KVHandoff) -> dict[str, Any]:
    """What the request span says of its hand-off (semconv's ``llm.kv_transfer.*``)."""
    from .. import semconv as sc

    a: dict[str, Any] = {sc.KV_TRANSFER_FAILED: h.failed}
    if h.connector:
        a[sc.KV_TRANSFER_CONNECTOR] = h.connector
    if h.loaded:
        a[sc.KV_TRANSFER_EXTERNAL_TOKENS] = h.external_tokens
        a[sc.LATENCY_KV_LOAD] = h.load_s
        a[sc.KV_TRANSFER_ASYNC] = h.load_async
    if h.saved:
        a[sc.LATENCY_KV_SAVE] = h.save_s
    if h.save_pending:
        a[sc.KV_TRANSFER_SAVE_PENDING] = True
    if h.failed_blocks:
        a[sc.KV_TRANSFER_FAILED_BLOCKS] = h.failed_blocks
    if h.errors:
        a[sc.KV_TRANSFER_ERRORS] = h.errors
    if h.transfer_s is not None:
        a[sc.KV_TRANSFER_CONNECTOR_DURATION] = h.transfer_s
    if h.bytes_transferred is not None:
        a[sc.KV_TRANSFER_BYTES] = h.bytes_transferred
    return a


class HandoffHistory(RecentBySize):
    """Recent decode-side hand-off times of one frontend's requests, by size: what a load of so many
    external tokens usually costs on this instance (the ``kv_transfer`` verdict's baseline).

    Sizes are grouped in powers of two of external tokens (a 40-token load is compared with 32..63);
    each group keeps its last ``per_size`` times."""

    def __init__(self, per_size: int = 256, min_samples: int = 3) -> None:
        super().__init__(per_size, min_samples)

    def add(self, h: KVHandoff) -> None:
        if h.loaded and h.load_end is not None:
            self.note(h.external_tokens, h.load_s)

    def median(self, tokens: int) -> float | None:
        """The median load time of comparable requests, or None with fewer than ``min_samples``."""
        times = self.recent(tokens)
        return statistics.median(times) if times is not None else None
