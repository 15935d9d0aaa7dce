"""The step record's wire format between an EngineCore process and its frontends (one datagram a step).

A fixed binary layout (``struct``), not pickle: a frontend never executes what arrives on its socket,
and a record of another layout is refused (and counted), never misread. Layout, little-endian:

    header   version:u8 flags:u8 step_id:i64 start:f64 end:f64 running:u32 waiting:u32 preempted:u32
             kv_cache_usage:f64 queue_blocked:u8 schedule_s:f64 execute_s:f64 output_s:f64 idle_s:f64
             model_s:f64 shares:u32 no_output:u32 prompts:u32
    shares   tokens:u32[n] (absent with flag ONE_EACH: one token each, a plain decode batch)
             computed:u32[n] no_output_at:u32[z] prompt_at:u32[m] prompt_len:u32[m] outputs:u32[m]
    extras   (flag EXTRAS only) spec:u32 loras:u32 events:u32 draft_s:f64 (NaN: none)
             spec_at:u32[s] drafted:u32[s] accepted:u32[s] loras:u32[l]
             event_kind:u32[e] event_lora:u32[e] event_at:f64[e] event_s:f64[e]
    grammar  (flag GRAMMAR only) seconds:f64 (NaN: no bitmask computed) requests:u32 hits:u32 misses:u32
             hit_at:u32[h] miss_at:u32[x]
             ids:utf-8, joined by NUL (an id with a NUL in it is refused at the sender: the step is
             dropped and counted, never mis-split)

The shares are vLLM's own per-step lists, shipped as the scheduler made them (step_hooks.py: no Python loop
over the batch in the EngineCore): per scheduled request its id, the tokens scheduled and the tokens it
had computed before the step; which shares have no output yet (``no_output_at``: vLLM's output count,
in-flight placeholders included, is 0); and for the shares at ``prompt_at`` whose prefill flag needs
them (new requests, requests recomputing after a preemption) their prompt length and output count. The
frontend derives each share's prefill flag and context from these (``derive_prefill``), exactly as the
scheduler hook once did per request.

``extras`` are the production features' facts, present only in steps that have them (flag ``EXTRAS``):
the shares that verified speculative drafts (``spec_at``, indices into the shares) with the draft tokens
scheduled and the drafts accepted for each, as vLLM's scheduler counts them (core/spec_decode.py), and
the integer ids of the LoRA adapters the step ran (empty without LoRA), and what the model runner's process
saw (worker_facts.py): the adapters it loaded or evicted (kind, id, start, seconds) and the drafter's time.
A plain step carries none and is
encoded byte for byte as before (the C accelerator takes it; a step with extras is the Python encoder's).

``grammar`` is a structured-output step's (flag ``GRAMMAR``; grammar.py): the seconds the EngineCore spent computing
the grammar bitmask, how many requests it covered, and the shares first scheduled in this step whose grammar was
a cache hit or was compiled anew (``core.timeline.StepGrammar``). The payload carries it as a 16th item (the
15th, the extras, then None where the step has none); such a step is the Python encoder's and decoder's.

``flags`` says which optional seconds are present (idle, model), whether every share is one token, and
whether the ids are left out (``SAME_IDS``): a steady batch lists the same requests step after step, and
their ids are most of a record's bytes. A record with SAME_IDS carries no id bytes; its ids are
those of the record numbered ``step_id - 1`` (the EngineCore numbers its records one by one), which the
reader must have read last from the same sender: a reader that missed that record (lost, refused, or a
reader that came later) refuses this one as a ``WireError`` (counted) and never reuses older ids. The
sender lists the ids again after anything it could not deliver to every reader (step_transport.SocketSink), so a
gap costs at most the records up to the next full one, and only where a record was already lost.

A change of layout is a new ``VERSION``; both sides are always the same otel-llm (the EngineCore imports
the frontend's package). Versions 1 (tokens, context, prefill flag per share, derived in the EngineCore)
2 (no SAME_IDS) 3 (extras without the worker's facts) and 4 (no grammar block) are refused.
"""

from __future__ import annotations

import platform
import struct
import sys
from array import array as _array
from operator import not_
from typing import Any, Callable, NamedTuple, Sequence

from ...core.lora import LoRAEvent
from ...core.spec_decode import SpecStep
from ...core.timeline import BLOCKED_NAMES, StepGrammar, StepRecord, StepWorkerFacts

VERSION = 5
_HAS_IDLE, _HAS_MODEL, _ONE_EACH, _SAME_IDS, _EXTRAS, _GRAMMAR = 1, 2, 4, 8, 16, 32
# The header, field by field: the one declaration of its layout. ``HEADER`` is made from it; the C
# accelerator (_step_fast.c) reads and writes the same fields at the same offsets, which
# tests/vllm/test_c_layout.py reads out of its source and compares with ``header_offsets()``.
HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("version", "B"), ("flags", "B"), ("step_id", "q"), ("start", "d"), ("end", "d"), ("running", "I"),
    ("waiting", "I"), ("preempted", "I"), ("kv_cache_usage", "d"), ("queue_blocked", "B"), ("schedule_s", "d"),
    ("execute_s", "d"), ("output_s", "d"), ("idle_s", "d"), ("model_s", "d"), ("shares", "I"),
    ("no_output", "I"), ("prompts", "I"))
HEADER = struct.Struct("<" + "".join(code for _, code in HEADER_FIELDS))
_EXTRA_COUNTS = struct.Struct("<IIId")  # the extras block's counts: spec, loras, events, draft_s
_GRAMMAR_COUNTS = struct.Struct("<dIII")
BLOCKED_LAST = len(BLOCKED_NAMES) - 1  # the highest queue_blocked a reader takes (timeline.BLOCKED_*)


def header_offsets() -> dict[str, int]:
    """Each header field's byte offset (no padding: ``<``)."""
    out, at = {}, 0
    for name, code in HEADER_FIELDS:
        out[name] = at
        at += struct.calcsize("<" + code)
    return out
# array("I") is the wire's u32 where it is 4 little-endian bytes (every platform vLLM runs on): then a
# list of counts converts in one C call, cheaper than struct's argument unpacking (benchmarks/engine_step_hooks.py)
_NATIVE_U32 = _array("I").itemsize == 4 and sys.byteorder == "little"


class WireError(ValueError):
    """A datagram that is not a step record of this version: refused whole."""


class Shares(NamedTuple):
    """A step's shares as the scheduler hook hands them over (in-process too): vLLM's parallel lists of the
    scheduled requests, then the sparse prompt entries. The one declaration of the layout: the hooks hand a
    plain tuple of these fields in this order (step_hooks: the NamedTuple's own construction costs several
    times a literal there), and every reader (``encode``, the C accelerator, step_hooks.decode) takes a
    ``Shares`` or that tuple alike, reading it whole or by these names' positions."""

    ids: Sequence[str]
    tokens: Sequence[int] | None  # tokens scheduled per share; None: one each (a plain decode batch)
    computed: Sequence[int]  # tokens each share had computed before the step: the context its tokens attend to
    no_output_at: Sequence[int]  # the shares with no output yet (vLLM's count, in-flight placeholders included)
    prompt_at: Sequence[int]  # the shares whose prefill flag needs their prompt entry (new, recomputing)
    prompt_len: Sequence[int]  # their prompt lengths
    prompt_outputs: Sequence[int]  # their output counts


class StepPayload(NamedTuple):
    """One engine step as the scheduler hook hands it to its sink: ``encode`` writes it as one record, the
    in-process path turns it into a ``StepRecord`` (step_hooks.decode). The fields in the wire's header order;
    like ``Shares``, handed over as the plain tuple of these fields."""

    step_id: int
    start: float  # schedule() entered (time.monotonic, the hooks' clock)
    end: float  # the outputs' stamp
    running: int
    waiting: int
    preempted: int
    kv_cache_usage: float
    shares: Shares
    queue_blocked: int  # why waiting requests stayed waiting (timeline.BLOCKED_*)
    schedule_s: float
    execute_s: float
    output_s: float
    idle_s: float | None  # None: no step before it
    model_s: float | None  # None: the model runner was not timed
    # A step with speculative drafts or LoRA adapters has one more item after these, its ``Extras`` (the C
    # encoder takes the 14 fields of a plain step; ``encode_py`` a step with extras). Not a field with a
    # default: every plain step stays the 14-item tuple. A structured-output step has a 16th, its
    # ``StepGrammar`` (the 15th then None where it has no extras): the Python encoder's.


START = StepPayload._fields.index("start")  # for a reader of one field (step_transport.SocketSink)


# The ids caches (encode's and decode's ``cache``): a list of three, read and written by index here and in the
# C accelerator. A sender's: the last ids encoded, their bytes, and the step id of the last record that may be
# followed by one leaving them out (``sender_cache``); a reader's: the last ids' bytes, the ids, and the step id
# of the last record read whole (``reader_cache``). Whether a record may leave its ids out is encode's explicit
# ``same_ids`` argument, never the cache's shape.
CACHE_KEY, CACHE_VALUE, CACHE_LAST_STEP = 0, 1, 2


def sender_cache() -> list:
    return [None, b"", None]


def reader_cache() -> list:
    return [None, None, None]


def _check_cache(cache: list | None) -> None:
    if cache is not None and (cache.__class__ is not list or len(cache) != 3):
        raise ValueError(f"an ids cache is a list of three (step_wire.sender_cache, reader_cache), not {cache!r}")


_NONE: tuple = ()  # no share prefills (a plain decode batch): nothing to allocate


class Extras(NamedTuple):
    """A step's optional facts (the hook's payload carries them as a 15th field only when there are any):
    the shares that verified speculative drafts, with their counts, the LoRA adapters it ran, and the model
    runner's LoRA cache events (``LoRAEvent``-shaped tuples) and drafter time (worker_facts.py)."""

    spec_at: list[int]
    drafted: list[int]
    accepted: list[int]
    loras: Sequence[int]
    lora_events: Sequence[tuple[int, int, float, float]] = ()
    draft_s: float | None = None


def derive_prefill(n: int, computed: Sequence[int], no_output_at: Sequence[int], prompt_at: Sequence[int],
                   prompt_len: Sequence[int], outputs: Sequence[int]) -> list[int]:
    """The indices of the prefilling shares, ascending (what the frontend keeps: ``StepRecord.prefill_at``;
    a share's context is its ``computed``, the tokens it had before the step).

    A request is prefilling until its prompt is computed (it has no output yet), or, when it recomputes
    after a preemption, until all but its last sampled token are: ``computed < prompt + outputs - 1``
    with outputs, ``computed < prompt`` without. A request with no output (vLLM counts in-flight
    placeholders as outputs) can only be prefilling; one with outputs that is neither new nor
    recomputing has computed all but its last token, so it decodes: only the shares at ``prompt_at``
    need the comparison, with their prompt length and output count. A plain decode batch lists no
    index at all (an empty tuple, shared)."""
    if not no_output_at and not prompt_at:
        return _NONE
    flags = dict.fromkeys(no_output_at, True)
    for i, p, o in zip(prompt_at, prompt_len, outputs):
        flags[i] = computed[i] < (p + o - 1 if o else p)
    return sorted(i for i, f in flags.items() if f and 0 <= i < n)


def encode_py(payload: StepPayload, cache: list | None = None, same_ids: bool = False) -> bytes:
    """The step hook's ``StepPayload`` as one record.

    ``cache`` (a sender's, ``sender_cache()``) keeps the last ids encoded: in a steady batch vLLM lists the
    same request ids, the same str objects, step after step (comparing them is a pointer compare each), so
    they are joined and encoded only when the batch changes. With ``same_ids`` (every reader reads a ring of
    its own: step_transport.SocketSink), a record whose ``step_id`` follows the cache's last step id (the last
    record encoded had these ids) leaves them out (flag SAME_IDS): the sender sets the cache's last step id to
    None when a record may not have reached every reader, and the next record lists them again. Without
    ``same_ids`` the ids are always listed and the last step id is left alone."""
    extras = grammar = None
    if len(payload) > 14:  # a step with extras (speculative drafts, LoRA adapters), a grammar block (16th)
        extras = payload[14]
        if len(payload) > 15:
            grammar = payload[15]
        payload = payload[:14]
    (step_id, start, end, running, waiting, preempted, kv, shares, blocked,
     schedule_s, execute_s, output_s, idle, model) = payload
    ids, tokens, computed, no_output_at, prompt_at, prompt_len, outputs = shares
    flags = (_HAS_IDLE if idle is not None else 0) | (_HAS_MODEL if model is not None else 0)
    tail = b""
    if extras is not None:
        flags |= _EXTRAS
        tail = _extras_bytes(extras, len(ids))
    if grammar is not None and ids:
        flags |= _GRAMMAR
        tail += _grammar_bytes(grammar, len(ids))
    if tokens is None:
        flags |= _ONE_EACH
    _check_cache(cache)
    n = len(ids)
    joined = b""
    if n:
        if cache is not None and cache[CACHE_KEY] == ids:
            if not same_ids:
                joined = cache[CACHE_VALUE]
            else:
                if cache[CACHE_LAST_STEP] == step_id - 1:
                    flags |= _SAME_IDS
                else:
                    joined = cache[CACHE_VALUE]
                cache[CACHE_LAST_STEP] = step_id
        else:
            text = "\0".join(ids)
            if text.count("\0") != n - 1:
                raise WireError("a request id contains NUL: this step cannot be sent")
            joined = text.encode()
            if cache is not None:
                cache[CACHE_KEY], cache[CACHE_VALUE] = ids, joined
                if same_ids:
                    cache[CACHE_LAST_STEP] = step_id
    head = HEADER.pack(VERSION, flags, step_id, start, end, running, waiting, preempted, kv, blocked,
                       schedule_s, execute_s, output_s, idle or 0.0, model or 0.0, n, len(no_output_at), len(prompt_at))
    if not n:
        return head + tail
    if tokens is None:
        if not (no_output_at or prompt_at) and _NATIVE_U32:  # a plain decode batch: the context counts alone, in C
            return head + _array("I", computed) + tail + joined  # bytes + any buffer: no tobytes() copy
        return head + _arrays(0, n, len(no_output_at), len(prompt_at)).pack(
            *computed, *no_output_at, *prompt_at, *prompt_len, *outputs) + tail + joined
    return head + _arrays(n, n, len(no_output_at), len(prompt_at)).pack(
        *tokens, *computed, *no_output_at, *prompt_at, *prompt_len, *outputs) + tail + joined


def _extras_bytes(extras: Extras, n: int) -> bytes:
    spec_at, drafted, accepted, loras, events, draft = extras
    s = len(spec_at)
    if len(drafted) != s or len(accepted) != s or any(i >= n for i in spec_at):
        raise WireError("speculative counts that do not line up with the step's shares: this step cannot be sent")
    e = len(events)
    out = _EXTRA_COUNTS.pack(s, len(loras), e, _NAN if draft is None else draft) + struct.pack(
        f"<{3 * s + len(loras)}I", *spec_at, *drafted, *accepted, *loras)
    if e:
        kinds, ids, at, seconds = zip(*events)
        out += struct.pack(f"<{2 * e}I{2 * e}d", *kinds, *ids, *at, *seconds)
    return out


_NAN = float("nan")


def _grammar_bytes(grammar: StepGrammar, n: int) -> bytes:
    seconds, requests, hit_at, miss_at = grammar
    h, x = len(hit_at), len(miss_at)
    if any(i >= n for i in hit_at) or any(i >= n for i in miss_at):
        raise WireError("grammar facts that do not line up with the step's shares: this step cannot be sent")
    return _GRAMMAR_COUNTS.pack(_NAN if seconds is None else seconds, requests, h, x) + struct.pack(
        f"<{h + x}I", *hit_at, *miss_at)


def _read_grammar(data: bytes, at: int, n: int) -> tuple[int, StepGrammar]:
    """The grammar block at ``at``: (the offset after it, the step's StepGrammar)."""
    if len(data) < at + _GRAMMAR_COUNTS.size:
        raise WireError("step record too short for its grammar block")
    seconds, requests, h, x = _GRAMMAR_COUNTS.unpack_from(data, at)
    at += _GRAMMAR_COUNTS.size
    end = at + 4 * (h + x)
    if h + x > n or len(data) < end:
        raise WireError(f"step record with {h + x} grammar shares for its {n} shares, or too short for them")
    fields = struct.unpack_from(f"<{h + x}I", data, at)
    if any(i >= n for i in fields):
        raise WireError(f"step record with a grammar share index beyond its {n} shares")
    return end, StepGrammar(seconds if seconds == seconds else None, requests, fields[:h], fields[h:])


def _read_extras(data: bytes, at: int, n: int) -> tuple[int, SpecStep | None, tuple[int, ...] | None,
                                                     StepWorkerFacts | None]:
    """The extras block at ``at``: (the offset after it, the step's SpecStep or None, its LoRA ids or None,
    the worker's facts or None)."""
    if len(data) < at + _EXTRA_COUNTS.size:
        raise WireError("step record too short for its extras")
    s, l, e, draft = _EXTRA_COUNTS.unpack_from(data, at)
    at += _EXTRA_COUNTS.size
    end = at + 4 * (3 * s + l)
    if s > n or len(data) < end + 24 * e:
        raise WireError(f"step record with {s} speculative shares for its {n} shares, or too short for them")
    fields = struct.unpack_from(f"<{3 * s + l}I", data, at)
    worker = None
    if e or draft == draft:  # (NaN: no drafter time)
        events = ()
        if e:
            f = struct.unpack_from(f"<{2 * e}I{2 * e}d", data, end)
            events = tuple(map(LoRAEvent._make, zip(f[:e], f[e:2 * e], f[2 * e:3 * e], f[3 * e:])))
            end += 24 * e
        worker = StepWorkerFacts(events, draft if draft == draft else None)
    spec = None
    if s:
        spec = SpecStep(list(fields[:s]), list(fields[s:2 * s]), list(fields[2 * s:3 * s]))
        try:
            spec.check(n)
        except ValueError as exc:
            raise WireError(str(exc)) from None
    return end, spec, tuple(fields[3 * s:]) if l else None, worker


def decode_py(data: bytes, cache: list | None = None) -> StepRecord:
    """A step record from one datagram; ``WireError`` for any other version or size. (``decode``: this, or
    the C accelerator's equal decoder where it is built, see ``accelerator``.)

    The record keeps the shares as the datagram lists them (``StepRecord.of_lists``: ids, tokens or
    ``None`` for one each, the prefilling shares' indices, contexts): no tuple per share. ``cache`` (a
    receiver's ``reader_cache()``, one per sender) keeps the last id list: in a steady batch the ids' bytes
    repeat step after step, so they are split and decoded only when the batch changes, and consecutive
    records share one list (read-only: nothing downstream changes a record's ids). A record with SAME_IDS
    needs a cache that read the record before it (``step_id - 1``), else it is refused."""
    if len(data) < HEADER.size:
        raise WireError(f"step record of {len(data)} bytes, shorter than the {HEADER.size}-byte header")
    if data[0] != VERSION:
        raise WireError(f"step record of wire version {data[0]}, this otel-llm reads version {VERSION}")
    (_, flags, step_id, start, end, running, waiting, preempted, kv, blocked,
     schedule_s, execute_s, output_s, idle, model, n, z, m) = HEADER.unpack_from(data)
    if blocked > BLOCKED_LAST:
        raise WireError(f"step record of queue_blocked {blocked}, this otel-llm knows up to {BLOCKED_LAST}")
    _check_cache(cache)
    ids: list[str] = []
    tokens = None
    prefill_at: Sequence[int] = _NONE
    contexts: list[int] = []
    spec = loras = worker = grammar = None
    if n:
        if z > n or m > n:
            raise WireError(f"step record with {z} shares without output, {m} prompt lengths for its {n} shares")
        k = 0 if flags & _ONE_EACH else n  # tokens listed, or one each
        arrays = _arrays(k, n, z, m)
        at = HEADER.size + arrays.size
        if flags & _EXTRAS:
            at, spec, loras, worker = _read_extras(data, at, n)
        if flags & _GRAMMAR:
            at, grammar = _read_grammar(data, at, n)
        raw = None
        if flags & _SAME_IDS:  # the ids of the record before, which must be the last one this cache saw
            last = cache[CACHE_LAST_STEP] if cache is not None else None
            if last != step_id - 1:
                raise WireError(f"step record {step_id:#x} reuses the ids of the record before it, but the last "
                                f"record read from its sender was {'none' if last is None else hex(last)}: "
                                "a record in between was lost")
            if len(data) != at:
                raise WireError(f"step record of {len(data)} bytes, not {at}: ids where none should be")
            ids = cache[CACHE_VALUE]
            if len(ids) != n:
                raise WireError(f"step record reusing {len(ids)} request ids for its {n} shares")
        elif len(data) <= at:
            raise WireError(f"step record of {len(data)} bytes, too short for its {n} shares")
        else:
            raw = data[at:]
            if cache is not None and cache[CACHE_KEY] == raw:
                ids = cache[CACHE_VALUE]
            else:
                ids = raw.decode().split("\0")
                if len(ids) != n:
                    raise WireError(f"step record with {len(ids)} request ids for its {n} shares")
        fields = arrays.unpack_from(data, HEADER.size)
        c = k + n  # computed ends, the indices begin
        at_z, at_m = fields[c:c + z], fields[c + z:c + z + m]
        if (z and max(at_z) >= n) or (m and max(at_m) >= n):
            raise WireError(f"step record with a share index beyond its {n} shares")
        if k:
            tokens = list(fields[:k])
        contexts = list(fields[k:c])
        prefill_at = derive_prefill(n, contexts, at_z, at_m, fields[c + z + m:c + z + 2 * m], fields[c + z + 2 * m:])
        if cache is not None:  # only a record read whole: a refused one never lends its ids to the next
            if raw is not None:
                cache[CACHE_KEY], cache[CACHE_VALUE] = raw, ids
            cache[CACHE_LAST_STEP] = step_id
    elif flags & _GRAMMAR:
        raise WireError("step record with a grammar block and no shares")
    elif flags & _EXTRAS and not (z or m):
        at, spec, loras, worker = _read_extras(data, HEADER.size, 0)
        if len(data) != at:
            raise WireError(f"step record of {len(data)} bytes for no shares, not {at}")
    elif z or m or len(data) != HEADER.size:
        raise WireError(f"step record of {len(data)} bytes for no shares, not {HEADER.size}")
    step = StepRecord.of_lists(step_id, start, end, ids, tokens, prefill_at, running, waiting, preempted, kv,
                               queue_blocked=blocked)
    step.contexts = contexts
    step.schedule_s, step.execute_s, step.output_s = schedule_s, execute_s, output_s
    step.idle_s = idle if flags & _HAS_IDLE else None
    step.model_s = model if flags & _HAS_MODEL else None
    step.spec, step.loras, step.worker, step.grammar = spec, loras, worker, grammar
    return step


class Accelerator(NamedTuple):
    """What ``accelerator()`` chose for this process: the C accelerator's functions (``_step_fast.c``, built by
    setup.py where there is a compiler) or the pure-Python ones, which write and read the same bytes."""

    # encode(payload, cache=None, same_ids=False) -> bytes
    encode: Callable[..., bytes]
    # encode_into_rings(payload, cache, ring writers) -> the rings that were full (every reader has a ring
    # there: as encode with same_ids); None where there is no C accelerator
    encode_into_rings: Callable[..., Any] | None
    # decode(data, cache=None) -> StepRecord (cache: a reader_cache())
    decode: Callable[..., StepRecord]
    # ring_read(reader: shm_ring.RingReader) -> list[bytes] | None; None where there is no C accelerator
    ring_read: Callable[..., Any] | None
    reason: str | None  # why the pure-Python encoder, or None


def accelerator() -> Accelerator:
    """The process's choice, made (and the C module configured) on first use: where the first ring writer
    or reader is made, or the first record written or read. (The C module keeps its configuration in C
    statics, so this is once per process.)

    The C path is taken only on x86-64 (the ring's memory-ordering contract, and the wire's u32 is the native
    one), and produces the same bytes: any input it does not take whole it hands to ``encode_py``. Its decoder
    takes the valid records with no prefilling share (every steady decode batch) and hands any other record
    whole to ``decode_py``: the same StepRecord slots and the same reader cache afterwards, the same errors
    (tests/vllm/test_step_fast.py). Why in C: on the real engine vLLM's output thread runs cache-cold after
    each wait, and the Python decode was most of a drain (benchmarks/engine_step_hooks.py, per record).
    Its ring read returns the same records and leaves the reader and the ring's positions as
    ``RingReader.read`` does, or None when the positions or a size make no sense (then ``RingReader.read``
    reads and raises)."""
    global _chosen
    if _chosen is None:
        _chosen = _choose()
    return _chosen


def _choose() -> Accelerator:
    if platform.machine() not in ("x86_64", "AMD64") or not _NATIVE_U32:
        return Accelerator(encode_py, None, decode_py, None,
                           f"not on x86-64 ({platform.machine()}): the pure-Python encoder")
    try:
        from . import _step_fast
        from ... import shm_ring
        _step_fast.setup(encode_py, VERSION, HEADER.size, shm_ring.DATA_AT, shm_ring.HEAD_AT, shm_ring.TAIL_AT)
    except (ImportError, ValueError) as exc:
        return Accelerator(encode_py, None, decode_py, None,
                           f"the C accelerator is not importable ({exc}): the pure-Python encoder")
    try:
        from ...core import timeline
        _step_fast.setup_decode(decode_py, StepRecord, _NONE, timeline._NO_LINKS)
    except (AttributeError, TypeError):  # a build of the accelerator without the decoder
        return Accelerator(_step_fast.encode, _step_fast.encode_into_rings, decode_py, None, None)
    try:
        _step_fast.setup_ring_read(shm_ring.CONSUMED_AT)
        ring_read = _step_fast.ring_read
    except (AttributeError, TypeError, ValueError):
        ring_read = None
    return Accelerator(_step_fast.encode, _step_fast.encode_into_rings, _step_fast.decode, ring_read, None)


_chosen: Accelerator | None = None
_LAZY = {"encode": "encode", "encode_into_rings": "encode_into_rings", "decode": "decode", "ring_read": "ring_read",
         "REASON": "reason"}


def __getattr__(name: str) -> Any:
    """``step_wire.encode``, ``encode_into_rings``, ``decode``, ``ring_read``, ``REASON``: the accelerator's,
    chosen at the first such read (nothing is configured at import). Kept as module attributes from then on,
    so a read on the hot path is a plain attribute lookup."""
    field = _LAZY.get(name)
    if field is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(accelerator(), field)
    globals()[name] = value
    return value


_ARRAYS: dict[tuple[int, int, int, int], struct.Struct] = {}


def _arrays(k: int, n: int, z: int, m: int) -> struct.Struct:
    """The shares' fixed part: k tokens (n or 0), n computed, z indices, m prompt entries (compiled once
    per shape: they repeat)."""
    s = _ARRAYS.get((k, n, z, m))
    if s is None:
        if len(_ARRAYS) > 4096:
            _ARRAYS.clear()
        s = _ARRAYS[k, n, z, m] = struct.Struct(f"<{k + n + z + 3 * m}I")
    return s
