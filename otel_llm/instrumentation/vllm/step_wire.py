"""The step record's wire format between an EngineCore process and its frontends (one datagram a step).

A fixed binary layout (``struct``), not pickle: a frontend never executes what arrives on its socket,
and a record of another layout is refused (and counted), never misread. Layout, little-endian:

    header   version:u8 flags:u8 step_id:i64 start:f64 end:f64 running:u32 waiting:u32 preempted:u32
             kv_cache_usage:f64 queue_blocked:u8 schedule_s:f64 execute_s:f64 output_s:f64 idle_s:f64
             model_s:f64 shares:u32
    shares   tokens:u32[n] context:u32[n] prefill:u8[n] ids:utf-8, joined by NUL (an id with a NUL in it
             is refused at the sender: the step is dropped and counted, never mis-split)

``flags`` says which optional seconds are present (idle, model). A change of layout is a new
``VERSION``; both sides are always the same otel-llm (the EngineCore imports the frontend's package).
"""

from __future__ import annotations

import struct

from ...core.timeline import StepRecord

VERSION = 1
_HAS_IDLE, _HAS_MODEL = 1, 2
HEADER = struct.Struct("<BBqddIIIdBdddddI")


class WireError(ValueError):
    """A datagram that is not a step record of this version: refused whole."""


def encode(payload: tuple) -> bytes:
    """The step hook's tuple (steps.py: 14 fields, shares of 4) as one datagram."""
    (step_id, start, end, running, waiting, preempted, kv, shares, blocked,
     schedule_s, execute_s, output_s, idle, model) = payload
    flags = (_HAS_IDLE if idle is not None else 0) | (_HAS_MODEL if model is not None else 0)
    n = len(shares)
    head = HEADER.pack(VERSION, flags, step_id, start, end, running, waiting, preempted, kv, blocked,
                       schedule_s, execute_s, output_s, idle or 0.0, model or 0.0, n)
    if not n:
        return head
    ids, tokens, prefill, contexts = zip(*shares)
    joined = "\0".join(ids)
    if joined.count("\0") != n - 1:
        raise WireError("a request id contains NUL: this step cannot be sent")
    return head + _arrays(n).pack(*tokens, *contexts, *prefill) + joined.encode()


def decode(data: bytes) -> StepRecord:
    """A step record from one datagram; ``WireError`` for any other version or size."""
    if len(data) < HEADER.size:
        raise WireError(f"step record of {len(data)} bytes, shorter than the {HEADER.size}-byte header")
    if data[0] != VERSION:
        raise WireError(f"step record of wire version {data[0]}, this otel-llm reads version {VERSION}")
    (_, flags, step_id, start, end, running, waiting, preempted, kv, blocked,
     schedule_s, execute_s, output_s, idle, model, n) = HEADER.unpack_from(data)
    shares: list = []
    contexts: list[int] = []
    if n:
        arrays = _arrays(n)
        at = HEADER.size + arrays.size
        if len(data) <= at:
            raise WireError(f"step record of {len(data)} bytes, too short for its {n} shares")
        fields = arrays.unpack_from(data, HEADER.size)
        ids = data[at:].decode().split("\0")
        if len(ids) != n:
            raise WireError(f"step record with {len(ids)} request ids for its {n} shares")
        shares = list(zip(ids, fields[:n], map(bool, fields[2 * n:])))
        contexts = list(fields[n:2 * n])
    elif len(data) != HEADER.size:
        raise WireError(f"step record of {len(data)} bytes for no shares, not {HEADER.size}")
    step = StepRecord(step_id, start, end, shares, running, waiting, preempted, kv, queue_blocked=blocked)
    step.contexts = contexts
    step.schedule_s, step.execute_s, step.output_s = schedule_s, execute_s, output_s
    step.idle_s = idle if flags & _HAS_IDLE else None
    step.model_s = model if flags & _HAS_MODEL else None
    return step


_ARRAYS: dict[int, struct.Struct] = {}


def _arrays(n: int) -> struct.Struct:
    """The shares' fixed part for n shares (compiled once per batch size: a step's n repeats)."""
    s = _ARRAYS.get(n)
    if s is None:
        if len(_ARRAYS) > 4096:
            _ARRAYS.clear()
        s = _ARRAYS[n] = struct.Struct(f"<{n}I{n}I{n}B")
    return s
