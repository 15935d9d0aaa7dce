"""The optional C accelerator of the EngineCore's step path (``_step_fast.c``, chosen in step_wire): on x86-64
it must be built (else CI would test only the fallback), and it must write exactly what the pure-Python path
writes: the same record bytes, the same sender cache afterwards, the same ring contents and positions, the
same errors (the hooks' guard counts them) and the same drops."""

from __future__ import annotations

import gc
import platform
import random
import struct
import sys

import pytest

from otel_llm import shm_ring
from otel_llm.instrumentation.vllm import step_hooks, step_transport, step_wire
from test_step_ring import pair as _pair  # a ring writer and its reader, as a frontend gets them

X86_64 = platform.machine() in ("x86_64", "AMD64")
fast = pytest.mark.skipif(step_wire.encode_into_rings is None, reason=f"no C accelerator: {step_wire.REASON}")


def test_the_c_accelerator_is_built_and_chosen_on_x86_64():
    """`pip install -e .` (setup.py) builds it wherever there is a compiler; a test run without it would
    silently test the fallback alone. Elsewhere the pure-Python encoder is the one chosen."""
    if not X86_64:
        assert step_wire.encode is step_wire.encode_py and step_wire.encode_into_rings is None
        return
    from otel_llm.instrumentation.vllm import _step_fast  # ImportError here: build it (pip install -e .)

    assert step_wire.REASON is None, step_wire.REASON
    assert step_wire.encode is _step_fast.encode and step_wire.encode_into_rings is _step_fast.encode_into_rings


def _ids(rng: random.Random, n: int) -> list[str]:
    return [f"cmpl-{rng.getrandbits(64):016x}-{i}" + ("é" if rng.random() < 0.1 else "") for i in range(n)]


def _payloads(rng: random.Random, count: int):
    """Steps of a changing batch: steady stretches (the same id list object: SAME_IDS), new batches, equal
    but new lists, gaps in the step ids, tokens listed or one each, prefilling shares, optional seconds
    None / 0 / -0.0 / floats, empty batches."""
    ids = _ids(rng, 64)
    step = 1 << 32
    for _ in range(count):
        r = rng.random()
        if r < 0.08:
            ids = _ids(rng, rng.choice((0, 1, 3, 64, 200)))
        elif r < 0.12:
            ids = list(ids)  # equal, another list
        step += 1 if rng.random() < 0.9 else rng.randint(2, 5)
        n = len(ids)
        computed = [rng.randint(0, 5000) for _ in range(n)]
        if n and rng.random() < 0.3:
            tokens = [rng.randint(1, 512) for _ in range(n)]
        else:
            tokens = None
        z = sorted(rng.sample(range(n), rng.randint(0, min(n, 3)))) if n and rng.random() < 0.3 else []
        m = sorted(rng.sample(range(n), rng.randint(0, min(n, 3)))) if n and rng.random() < 0.3 else []
        shares = (ids, tokens, computed, z, m, [rng.randint(1, 900) for _ in m], [rng.randint(0, 9) for _ in m])
        if rng.random() < 0.1:  # lists the plain decode path ignores (array of computed alone)
            shares = (ids, None, computed, [], [], [1, 2], [3])
        idle = rng.choice((None, 0.0, -0.0, 0, 0.25, rng.random()))
        model = rng.choice((None, -0.0, rng.random()))
        payload = step_wire.StepPayload(step, rng.random() * 1e4, rng.random() * 1e4, n, rng.randint(0, 9),
                                        rng.randint(0, 3), rng.random(), step_wire.Shares(*shares), rng.randint(0, 5),
                                        rng.random(), rng.random(), rng.random(), idle, model)
        if n and rng.random() < 0.25:  # a verify step, a LoRA batch (events: the Python path), both
            yield (*payload, _extras(rng, n))
        else:
            yield payload


def _extras(rng: random.Random, n: int) -> step_wire.Extras:
    spec = sorted(rng.sample(range(n), rng.randint(0, n))) if rng.random() < 0.7 else []
    if spec and rng.random() < 0.3:
        spec = list(range(n))  # share_positions' same-order answer
    loras = tuple(sorted(rng.sample(range(1, 40), rng.randint(0, 4))))
    events = ((1, 3, rng.random(), rng.random()),) if rng.random() < 0.1 else ()
    return step_wire.Extras(spec, [rng.randint(1, 7) for _ in spec], [rng.randint(0, 7) for _ in spec], loras,
                            events, rng.choice((None, rng.random(), 0.0)))


@fast
@pytest.mark.parametrize("cache, same_ids", [(False, False), (True, False), (True, True)])
def test_encode_writes_the_python_paths_bytes_and_leaves_the_same_cache(cache, same_ids):
    rng = random.Random(1200 + 2 * cache + same_ids)
    c_cache = py_cache = None
    if cache:
        c_cache, py_cache = step_wire.sender_cache(), step_wire.sender_cache()
    flags = 0
    for payload in _payloads(rng, 1500):
        got, want = step_wire.encode(payload, c_cache, same_ids), step_wire.encode_py(payload, py_cache, same_ids)
        assert got == want
        assert c_cache == py_cache
        flags |= want[1]
    assert bool(flags & step_wire._SAME_IDS) == same_ids
    if same_ids:  # the cases were exercised
        assert flags & step_wire._SAME_IDS and flags & step_wire._ONE_EACH and flags & step_wire._HAS_IDLE
    assert flags & step_wire._EXTRAS


@fast
@pytest.mark.parametrize("extras", [
    step_wire.Extras([0, 5], [1, 1], [0, 0], (), (), None),  # a share index past the step's 2 shares
    step_wire.Extras([0, 1], [1], [0, 0], (), (), None),  # counts that do not line up
    step_wire.Extras([0], [1 << 32], [0], (), (), None),
    step_wire.Extras([0], [1], [0], (-1,), (), None),
    step_wire.Extras([0], [1], [0], (), (), 1),  # a drafter time that is not a float: struct takes it
])
def test_extras_the_python_path_refuses_or_packs_are_handled_alike(extras):
    payload = (7, 1.0, 2.0, 2, 0, 0, 0.5, (["a", "b"], None, [1, 2], [], [], [], []), 0, 0.1, 0.2, 0.3, None, None,
               extras)
    caches = [[None, b"", None], [None, b"", None]]
    results = []
    for encode, cache in zip((step_wire.encode, step_wire.encode_py), caches):
        try:
            results.append(encode(payload, cache, True))
        except Exception as exc:
            results.append((type(exc), str(exc)))
    assert results[0] == results[1] and caches[0] == caches[1]


@fast
@pytest.mark.parametrize("bad", [
    ([1 << 32], None, [], []),  # a plain decode batch: array("I") refuses (OverflowError)
    ([-1], None, [], []),
    ([1], [1 << 32], [], []),  # tokens listed: struct refuses (struct.error)
    ([1 << 40], None, [0], []),
    ([1.5], None, [], []),
    ([1, 2], None, [], []),  # more counts than shares on the struct path: not packed
])
def test_encode_refuses_what_the_python_path_refuses_with_the_same_error(bad):
    computed, tokens, z, m = bad
    ids = ["a"]
    shares = (ids, tokens, computed, z, m, [5] * len(m), [0] * len(m))
    payload = (7, 1.0, 2.0, 1, 0, 0, 0.5, shares, 0, 0.1, 0.2, 0.3, None, None)
    caches = [[None, b"", None], [None, b"", None]]
    errors = []
    for encode, cache in zip((step_wire.encode, step_wire.encode_py), caches):
        try:
            encode(payload, cache)
        except Exception as exc:
            errors.append((type(exc), str(exc)))
        else:
            errors.append(None)
    assert errors[0] == errors[1]
    assert caches[0] == caches[1]
    if computed != [1, 2]:
        assert errors[0] is not None and errors[0][0] in (OverflowError, struct.error, TypeError)


@fast
@pytest.mark.parametrize("ids", [["a\0b", "c"], ["a", 5], ["\udcff"]])
def test_ids_the_python_path_refuses_are_refused_alike(ids):
    payload = (7, 1.0, 2.0, 1, 0, 0, 0.5, (ids, None, [1] * len(ids), [], [], [], []), 0, 0.1, 0.2, 0.3, None, None)
    caches = [[None, b"", None], [None, b"", None]]
    errors = []
    for encode, cache in zip((step_wire.encode, step_wire.encode_py), caches):
        with pytest.raises(Exception) as info:
            encode(payload, cache)
        errors.append((info.type, str(info.value)))
    assert errors[0] == errors[1] and caches[0] == caches[1]


@fast
@pytest.mark.skipif(not shm_ring.AVAILABLE, reason="no step rings on this platform")
def test_encode_into_rings_leaves_the_rings_byte_for_byte_as_encode_and_write_do():
    """Two rings per path (one lagging reader: full rings, drops), sizes that wrap around the end: after
    every step the whole memory of each ring, its positions and counts, the drops and the cache agree."""
    rng = random.Random(77)
    c_rings = [_pair(8192), _pair(20000)]
    py_rings = [_pair(8192), _pair(20000)]
    c_cache, py_cache = [None, b"", None], [None, b"", None]
    drops = wraps = 0
    for i, payload in enumerate(_payloads(rng, 900)):
        before = c_rings[0][0].head % c_rings[0][0].cap
        full = step_wire.encode_into_rings(payload, c_cache, tuple(w for w, _ in c_rings))
        data = step_wire.encode_py(payload, py_cache, True)
        py_full = sum(not w.write(data) for w, _ in py_rings)
        assert full == py_full and c_cache == py_cache
        drops += full
        wraps += full == 0 and before + 4 + len(data) > c_rings[0][0].cap
        if full:  # the sink lists the ids again after a drop
            c_cache[2] = py_cache[2] = None
        for (cw, cr), (pw, pr) in zip(c_rings, py_rings):
            assert cw.mm[:] == pw.mm[:]
            assert (cw.head, cw.written) == (pw.head, pw.written)
        if i % 5 == 4:
            assert c_rings[1][1].read() == py_rings[1][1].read()
        if i % 23 == 22:  # the first ring's reader lags
            assert c_rings[0][1].read() == py_rings[0][1].read()
    assert drops and wraps  # the cases were exercised
    for w, r in c_rings + py_rings:
        w.close()
        r.close()


@fast
def test_no_memory_is_kept_per_call():
    """Live allocations stay flat over many calls of every path (C encode, into rings, the fallback)."""
    rng = random.Random(5)
    payloads = list(_payloads(rng, 300))
    bad = payloads[0][:7] + (([" x"], None, [1 << 32], [], [], [], []),) + payloads[0][8:]
    writer, reader = _pair(1 << 16)
    rings = (writer,)

    def run() -> None:
        cache = [None, b"", None]
        for payload in payloads:
            step_wire.encode(payload, cache, True)
            step_wire.encode(payload)
            step_wire.encode_into_rings(payload, cache, rings)
            reader.read()
            try:
                step_wire.encode_into_rings(bad, cache, rings)
            except OverflowError:
                pass

    run()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(10):
        run()
    gc.collect()
    assert sys.getallocatedblocks() - before < 200  # 10 x 300 x 5 calls: a leak of one block each is 15,000
    writer.close()
    reader.close()


@pytest.mark.skipif(not shm_ring.AVAILABLE, reason="no step rings on this platform")
@pytest.mark.parametrize("path", ["c", "python"])
def test_the_sink_delivers_the_same_records_on_either_path(path, monkeypatch, tmp_path):
    """SocketSink through step_wire's choice, and with the C path switched off: the frontend reads every
    record, equal to the in-process record, SAME_IDS included."""
    if path == "c" and step_wire.encode_into_rings is None:
        pytest.skip(f"no C accelerator: {step_wire.REASON}")
    if path == "python":
        monkeypatch.setattr(step_wire, "encode_into_rings", None)
        monkeypatch.setattr(step_wire, "encode", step_wire.encode_py)
    receiver = step_transport.StepReceiver(str(tmp_path))
    sink = step_transport.SocketSink(str(tmp_path))
    rng = random.Random(9)
    payloads = list(_payloads(rng, 200))
    got = []
    try:
        for payload in payloads:
            sink(payload)
            receiver.drain(got.append)
    finally:
        sink.close()
        receiver.close()
    assert sink.dropped == 0 and receiver.malformed == 0
    assert [(s.step_id, s.requests, s.contexts, s.idle_s, s.model_s) for s in got] == \
        [(s.step_id, s.requests, s.contexts, s.idle_s, s.model_s) for s in map(step_hooks.decode, payloads)]


# -- the frontend's decoder (step_wire.decode: _step_fast.decode where built) --------------------------

def _slots(step) -> dict:
    from otel_llm.core.timeline import StepRecord

    return {name: getattr(step, name) for name in StepRecord.__slots__}


def _decoded(decode, data: bytes, cache):
    try:
        return ("ok", _slots(decode(data, cache)))
    except Exception as exc:
        return (type(exc), str(exc))


def _records(rng: random.Random, count: int):
    """A sender's records (steady stretches with SAME_IDS, new batches, prefilling shares, gaps), some
    damaged as a lossy or hostile channel would: truncated, a byte changed, another version, ids that are
    not UTF-8, the wrong number of ids, a record left out (the next SAME_IDS refers to it)."""
    cache = step_wire.sender_cache()
    for payload in _payloads(rng, count):
        data = step_wire.encode_py(payload, cache, True)
        r = rng.random()
        if r < 0.04:
            continue  # lost: the reader never sees it
        if r < 0.08:
            data = data[:rng.randint(0, len(data) - 1)]
        elif r < 0.12:
            i = rng.randrange(len(data))
            data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
        elif r < 0.14:
            data = data + (b"\xff\xfe" if rng.random() < 0.5 else b"\0x")
        yield data


@fast
@pytest.mark.parametrize("cache_items", [0, 3])
def test_decode_gives_the_python_paths_records_errors_and_cache(cache_items):
    """Record by record, the C decoder and decode_py give a StepRecord with equal slots (the same shared
    empty tuples for prefill_at and links) or the same error, and leave the reader's cache equal."""
    from otel_llm.instrumentation.vllm import _step_fast

    assert step_wire.decode is _step_fast.decode
    rng = random.Random(2400 + cache_items)
    c_cache = py_cache = None
    if cache_items:
        c_cache, py_cache = [None, None, None][:cache_items], [None, None, None][:cache_items]
    seen = {"ok": 0, "error": 0, "plain": 0, "same_ids": 0}
    for data in _records(rng, 3000):
        got, want = _decoded(step_wire.decode, data, c_cache), _decoded(step_wire.decode_py, data, py_cache)
        assert got == want
        assert c_cache == py_cache
        if got[0] == "ok":
            seen["ok"] += 1
            assert (got[1]["prefill_at"] is step_wire._NONE) == (want[1]["prefill_at"] is step_wire._NONE)
            assert got[1]["links"] is want[1]["links"]
            if got[1]["ids"] and not got[1]["prefill_at"]:
                seen["plain"] += 1
                seen["same_ids"] += bool(data[1] & step_wire._SAME_IDS)
        else:
            seen["error"] += 1
    assert seen["plain"] > 200 and seen["error"] > 100, seen  # both paths exercised
    assert (seen["same_ids"] > 100) == (cache_items == 3), seen


@fast
def test_decode_hands_anything_but_bytes_and_a_list_cache_to_the_python_path():
    payload = (9, 1.0, 2.0, 1, 0, 0, 0.5, (["a", "b"], None, [3, 4], [], [], [], []), 0, 0.1, 0.2, 0.3, None, None)
    data = step_wire.encode_py(payload)
    for arg, cache in ((bytearray(data), None), (memoryview(data), None), (data, (None, None, None)),
                       (data, [None])):
        copies = [list(cache) if isinstance(cache, list) else cache for _ in range(2)]  # decode_py may change it
        assert _decoded(step_wire.decode, arg, copies[0]) == _decoded(step_wire.decode_py, arg, copies[1])
        assert copies[0] == copies[1]


@fast
def test_the_decoder_keeps_no_memory_per_call():
    payload = (9, 1.0, 2.0, 3, 0, 0, 0.5, (["a", "b", "c"], [1, 2, 3], [3, 4, 5], [], [], [], []), 0, 0.1, 0.2, 0.3,
               0.5, None)
    full = step_wire.encode_py(payload)
    records = [full[:10], full]
    cache = [None, None, None]
    for _ in range(2000):  # warm up caches and free lists
        for data in records:
            _decoded(step_wire.decode, data, cache)
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(20000):
        for data in records:
            _decoded(step_wire.decode, data, cache)
    gc.collect()
    assert sys.getallocatedblocks() - before < 200


@fast
def test_ring_read_takes_what_the_python_reader_takes_and_leaves_the_same_positions():
    """Two rings written alike (records of random sizes, wrapping around the end), one read by
    ``_step_fast.ring_read`` and one by ``RingReader.read``: the same records, the same reader positions
    (``tail``, ``consumed``) and header words; a ring whose positions or a size make no sense is left
    untouched by the C read (None) and the Python reader raises for it as before."""
    assert step_wire.ring_read is not None
    rng = random.Random(77)
    (wc, rc), (wp, rp) = _pair(256), _pair(256)
    for _ in range(400):
        for _ in range(rng.randint(0, 4)):
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 60)))
            assert wc.write(data) == wp.write(data)
        assert step_wire.ring_read(rc) == rp.read()
        assert (rc.tail, rc.consumed) == (rp.tail, rp.consumed)
        assert list(rc._words) == list(rp._words)
    # a size word that runs past what was written: C leaves it to Python, which raises and skips it
    for w in (wc, wp):
        w.write(b"abcd")
    for r in (rc, rp):
        r._sizes[r.tail % r.cap >> 2] = 200
    before = (rc.tail, rc.consumed, list(rc._words))
    assert step_wire.ring_read(rc) is None and before == (rc.tail, rc.consumed, list(rc._words))
    for r in (rc, rp):
        with pytest.raises(shm_ring.RingError):
            r.read()
    assert (rc.tail, rc.consumed) == (rp.tail, rp.consumed) and step_wire.ring_read(rc) == []
    for w, r in ((wc, rc), (wp, rp)):
        w.close()
        r.close()
    with pytest.raises(ValueError):  # a closed ring: an error, never a read of unmapped memory
        step_wire.ring_read(rc)


@fast
def test_extras_without_lora_events_are_encoded_in_c():
    """A verify step's or a LoRA batch's extras are encoded by the C encoder itself; only LoRA load events
    (rare) go to the Python encoder. (The profile hook sees every Python function the C module calls.)"""
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in (step_wire.encode_py.__code__, step_wire._extras_bytes.__code__):
            calls.append(frame.f_code.co_name)

    shares = (["a", "b"], None, [1, 2], [], [], [], [])
    plain = (7, 1.0, 2.0, 2, 0, 0, 0.5, shares, 0, 0.1, 0.2, 0.3, None, None)
    spec = (*plain, step_wire.Extras([0, 1], [3, 3], [2, 1], (), (), None))
    lora = (*plain, step_wire.Extras([], [], [], (4,), (), 0.01))
    loaded = (*plain, step_wire.Extras([], [], [], (4,), ((1, 4, 2.0, 0.01),), None))
    sys.setprofile(profile)
    try:
        for payload in (spec, lora):
            step_wire.encode(payload)
        assert calls == []
        step_wire.encode(loaded)
    finally:
        sys.setprofile(None)
    assert calls[0] == "encode_py"
