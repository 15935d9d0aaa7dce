"""The step path's readers of untrusted bytes, fed random and garbled input: the shared-memory ring's reader
(``_step_fast.ring_read`` and ``shm_ring.RingReader.read``) and writer (``_step_fast.encode_into_rings``'s
ring write and ``RingWriter.write``, whose reader's words are untrusted), and the step record's decoder
(``_step_fast.decode`` and ``step_wire.decode_py``).

Neither path crashes, both take and refuse the same (the same records, errors, positions and memory
afterwards), and every error is one the receiver counts. The rings here live in a ``bytearray`` rather than
an mmap: heap memory, so a read or write past the ring is one AddressSanitizer reports when CI runs these
tests against the sanitized build (.ci/c_checks.py, with PYTHONMALLOC=malloc)."""

from __future__ import annotations

import gc
import struct
import sys

import pytest
from hypothesis import given, settings, strategies as st

from otel_llm import shm_ring
from otel_llm.instrumentation.vllm import step_transport, step_wire
from test_step_fast import _decoded

fast = pytest.mark.skipif(step_wire.encode_into_rings is None, reason=f"no C accelerator: {step_wire.REASON}")
fast_read = pytest.mark.skipif(step_wire.ring_read is None, reason=f"no C ring reader: {step_wire.REASON}")
U64 = (1 << 64) - 1
# what StepReceiver._take counts as a malformed record: anything else would reach vLLM's output thread
COUNTED = (step_wire.WireError, struct.error, UnicodeDecodeError)


# -- rings over heap memory -----------------------------------------------------------------------------------

def _ring_memory(cap: int, fill: bytes = b"") -> bytearray:
    mem = bytearray(shm_ring.DATA_AT + cap)
    shm_ring.META.pack_into(mem, 0, shm_ring.MAGIC, shm_ring.LAYOUT, cap)
    mem[shm_ring.DATA_AT:shm_ring.DATA_AT + len(fill[:cap])] = fill[:cap]
    return mem


def _reader(mem: bytearray, cap: int, tail: int | None = None) -> shm_ring.RingReader:
    """A RingReader as ``RingReader.__init__`` makes one, over ``mem``; its tail from the ring's word (as
    there) unless given."""
    r = object.__new__(shm_ring.RingReader)
    r.mm, r.cap, r.writer_pid = mem, cap, 1
    r._words, r._data, r._sizes = shm_ring._views(mem)
    r.tail = r._words[shm_ring.TAIL_AT // 8] if tail is None else tail
    r.consumed = r._words[shm_ring.CONSUMED_AT // 8]
    r.ids = step_wire.reader_cache()
    return r


def _writer(mem: bytearray, cap: int, head: int = 0, written: int = 0) -> shm_ring.RingWriter:
    w = object.__new__(shm_ring.RingWriter)
    w.mm, w.cap, w.head, w.written, w._fd = mem, cap, head, written, -1
    w._words, w._data, w._sizes = shm_ring._views(mem)
    return w


def _release(*ends) -> None:
    for end in ends:
        shm_ring._release(end._words, end._data, end._sizes)


def _set_word(mem: bytearray, at: int, value: int) -> None:
    struct.pack_into("<Q", mem, at, value & U64)


def _python_read(reader: shm_ring.RingReader) -> tuple:
    try:
        return ("ok", reader.read())
    except shm_ring.RingError as exc:
        return ("refused", exc.args)


def _both_read(mem: bytearray, cap: int, tail: int | None = None) -> tuple:
    """The C reader on one copy of the ring, the Python reader on another, as StepReceiver.drain uses them
    (None from C: the Python reader reads that ring). Checks they agree; returns the Python reader's answer."""
    copy = bytearray(mem)
    c, py = _reader(mem, cap, tail), _reader(copy, cap, tail)
    try:
        got = step_wire.ring_read(c)
        want = _python_read(py)
        if got is None:
            assert want[0] == "refused", want
            assert _python_read(c) == want  # what the receiver does next: the Python reader raises alike
        else:
            assert ("ok", got) == want
            assert all(len(record) <= cap - 4 for record in got)
        assert (c.tail, c.consumed) == (py.tail, py.consumed)
        assert mem == copy  # the published positions too
        return want
    finally:
        _release(c, py)


caps = st.sampled_from([64, 68, 128, 256, 1020])


@st.composite
def positions(draw, cap: int) -> tuple[int, int]:
    """(tail, head): near each other (what a writer and reader in step have) or anything at all."""
    tail = draw(st.one_of(st.integers(0, 4 * cap), st.integers(0, U64), st.just(U64 - 3)))
    near = st.integers(max(0, tail - 8), min(U64, tail + cap + 8))
    head = draw(st.one_of(near, near.map(lambda h: h & ~3), st.integers(0, U64)))
    return tail, head


@fast_read
@settings(max_examples=300)
@given(data=st.data(), cap=caps)
def test_a_ring_of_random_bytes_and_positions_is_read_alike_or_refused_alike(data, cap):
    mem = _ring_memory(cap, data.draw(st.binary(min_size=cap, max_size=cap)))
    tail, head = data.draw(positions(cap))
    _set_word(mem, shm_ring.HEAD_AT, head)
    _set_word(mem, shm_ring.TAIL_AT, tail)
    _set_word(mem, shm_ring.CONSUMED_AT, data.draw(st.integers(0, U64)))
    _both_read(mem, cap)


@fast_read
@settings(max_examples=300)
@given(data=st.data(), cap=caps)
def test_records_written_then_garbled_are_read_alike_or_refused_alike(data, cap):
    """A ring a writer filled honestly (records wrapping around the end), then size words, bytes or the head
    changed as a hostile or broken writer would: both readers take the same records or refuse alike."""
    mem = _ring_memory(cap)
    start = data.draw(st.integers(0, 3 * cap).map(lambda t: t & ~3))
    for word in (shm_ring.HEAD_AT, shm_ring.TAIL_AT):
        _set_word(mem, word, start)
    writer = _writer(mem, cap, head=start)
    sizes = []
    for record in data.draw(st.lists(st.binary(max_size=cap), max_size=8)):
        if writer.write(record):
            sizes.append(writer.head)
    head = writer.head
    _release(writer)
    for _ in range(data.draw(st.integers(0, 3))):
        what = data.draw(st.sampled_from(["size", "byte", "head"]))
        if what == "size" and sizes:  # a record's size word
            at = data.draw(st.sampled_from([start] + sizes[:-1])) % cap
            size = data.draw(st.one_of(st.integers(0, 2 * cap), st.integers(0, (1 << 32) - 1)))
            struct.pack_into("<I", mem, shm_ring.DATA_AT + at, size)
        elif what == "byte":
            mem[shm_ring.DATA_AT + data.draw(st.integers(0, cap - 1))] = data.draw(st.integers(0, 255))
        else:
            head = data.draw(st.one_of(st.integers(max(0, head - 12), head + 12), st.integers(0, U64)))
            _set_word(mem, shm_ring.HEAD_AT, head)
    _both_read(mem, cap)


@fast_read
@pytest.mark.parametrize("tail", [1, 2, 3, 255, 253])
def test_a_tail_off_the_4_byte_grid_is_refused_by_both_readers(tail):
    """A reader starts from the ring's tail word (RingReader.__init__): one off the grid put the C reader's size
    word up to 3 bytes past the ring (tail 255 of 256); now both refuse the positions."""
    cap = 256
    mem = _ring_memory(cap, bytes(range(256)))
    _set_word(mem, shm_ring.TAIL_AT, tail)
    _set_word(mem, shm_ring.HEAD_AT, (tail + 4) & ~3)
    assert _both_read(mem, cap)[0] == "refused"


@fast_read
def test_a_size_changed_between_check_and_copy_is_never_used_unchecked():
    """The writer side is another process: a record's size may change while the reader reads. The C reader
    once read each size twice (checked in a first pass, used unchecked in the second), so a size changed in
    between made its copy run past the ring. Here the change comes from a finalizer run by the cycle
    collector, which CPython 3.11 runs inside the allocation of a list (when its free list is empty): the one
    allocation between the two passes of that reader. Now each size is read once and the list is made before
    the first: the reader sees the new size before it copies anything and refuses the ring."""
    if sys.version_info >= (3, 12):  # the collector runs at the interpreter's next check, never inside a C call
        pytest.skip("the cycle collector does not run inside C calls on this Python")
    cap = 256
    mem = _ring_memory(cap)
    writer = _writer(mem, cap)
    assert writer.write(b"a" * 8) and writer.write(b"b" * 8)
    reader = _reader(mem, cap)
    ran = []

    class Changer:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            ran.append(calling)
            writer._sizes[12 >> 2] = 1 << 16  # the second record's size: far past the ring

    threshold = gc.get_threshold()
    gc.disable()
    gc.collect()
    gc.set_threshold(1)
    try:
        Changer()  # garbage, in a cycle: collected at the next collection
        keep = [[] for _ in range(200)]  # lists' free list emptied: the next list is a new allocation
        calling = True
        gc.enable()
        got = step_wire.ring_read(reader)
        calling = False
    finally:
        gc.enable()
        gc.set_threshold(*threshold)
    del keep
    assert ran == [True]  # the size changed during the read
    assert got is None or all(len(r) == 8 for r in got)  # never a record past the ring (was: 65536 bytes)
    with pytest.raises(shm_ring.RingError):
        reader.read()
    _release(writer, reader)


# -- the writer, whose reader's words are untrusted -------------------------------------------------------

ids = st.lists(st.text(st.characters(blacklist_characters="\0", max_codepoint=0x2FF), max_size=12), max_size=24)


@st.composite
def payloads(draw, ids=ids) -> tuple:
    """Plain steps of random shapes (records of ~100 bytes to a few KB)."""
    batch = draw(ids)
    n = len(batch)
    counts = st.lists(st.integers(0, (1 << 32) - 1), min_size=n, max_size=n)
    tokens = draw(st.one_of(st.none(), counts))
    indices = st.lists(st.integers(0, max(0, n - 1)), max_size=3 if n else 0, unique=True).map(sorted)
    z, m = draw(indices), draw(indices)
    small = st.lists(st.integers(0, 999), min_size=len(m), max_size=len(m))
    shares = step_wire.Shares(batch, tokens, draw(counts), z, m, draw(small), draw(small))
    seconds = st.floats(allow_nan=False)
    return step_wire.StepPayload(draw(st.integers(0, 1 << 40)), draw(seconds), draw(seconds), n,
                                 draw(st.integers(0, 99)), draw(st.integers(0, 9)), draw(seconds), shares,
                                 draw(st.integers(0, 5)), draw(seconds), draw(seconds), draw(seconds),
                                 draw(st.none() | seconds), draw(st.none() | seconds))


@fast
@settings(max_examples=300)
@given(data=st.data(), cap=st.sampled_from([128, 256, 1024, 4096]), payload=payloads())
def test_a_ring_whose_reader_words_are_random_is_written_alike_and_only_inside(data, cap, payload):
    """Whatever the reader's tail and consumed words say, the C writer and RingWriter.write write the same
    record or refuse it alike, and nothing outside the record's place in the ring changes."""
    head = data.draw(st.integers(0, 4 * cap).map(lambda h: h & ~3))
    tail = data.draw(st.one_of(st.integers(max(0, head - cap - 8), head + 8), st.integers(0, U64)))
    consumed = data.draw(st.integers(0, U64))
    fill = data.draw(st.binary(min_size=cap, max_size=cap))
    mems = [_ring_memory(cap, fill) for _ in range(2)]
    for mem in mems:
        _set_word(mem, shm_ring.HEAD_AT, head)
        _set_word(mem, shm_ring.TAIL_AT, tail)
        _set_word(mem, shm_ring.CONSUMED_AT, consumed)
    before = bytes(mems[0])
    c, py = _writer(mems[0], cap, head, written=5), _writer(mems[1], cap, head, written=5)
    try:
        full = step_wire.encode_into_rings(payload, step_wire.sender_cache(), (c,))
        record = step_wire.encode_py(payload, step_wire.sender_cache(), True)
        assert full == (not py.write(record))
        assert mems[0] == mems[1] and (c.head, c.written) == (py.head, py.written)
        end = head + ((len(record) + 7) & ~3)
        if full:
            assert bytes(mems[0]) == before and c.head == head
        else:
            assert head >= tail >= end - cap and c.head == end
            changed = [i - shm_ring.DATA_AT for i in range(shm_ring.DATA_AT, len(before)) if before[i] != mems[0][i]]
            assert all((i - head) % cap < end - head for i in changed)  # only inside the record's place
        assert 0 <= py.unread() <= py.written
    finally:
        _release(c, py)


@pytest.mark.parametrize("tail_beyond", [4, 1 << 40])
@pytest.mark.parametrize("path", ["c", "python"])
def test_a_tail_beyond_the_end_refuses_even_a_record_larger_than_the_ring(path, tail_beyond):
    """The C writer once skipped its size-against-free-space check when the reader's tail lay beyond the
    record's end (Python's `end - tail` negative): a record larger than the ring was then written past it
    (C) or raised into the EngineCore (Python). Both refuse it now, and a record that would fit too: no
    reader publishes a tail beyond the writer's head."""
    if path == "c" and step_wire.encode_into_rings is None:
        pytest.skip(f"no C accelerator: {step_wire.REASON}")
    cap = 256
    big = (7, 1.0, 2.0, 40, 0, 0, 0.5, ([f"cmpl-{i:030d}" for i in range(40)], None, list(range(40)), [], [], [], []),
           0, 0.1, 0.2, 0.3, None, None)
    small = big[:7] + ((["a"], None, [1], [], [], [], []),) + big[8:]
    for payload in (big, small):
        record = step_wire.encode_py(payload, None, True)
        assert (len(record) > cap) == (payload is big)
        mem = _ring_memory(cap, bytes(range(256)))
        head = 16
        _set_word(mem, shm_ring.HEAD_AT, head)
        _set_word(mem, shm_ring.TAIL_AT, head + ((len(record) + 7) & ~3) + tail_beyond)
        before = bytes(mem)
        writer = _writer(mem, cap, head)
        try:
            if path == "c":
                assert step_wire.encode_into_rings(payload, step_wire.sender_cache(), (writer,)) == 1
            else:
                assert writer.write(record) is False
            assert bytes(mem) == before and writer.head == head and writer.written == 0
        finally:
            _release(writer)


def test_unread_records_are_bounded_by_those_written_whatever_the_reader_says():
    mem = _ring_memory(64)
    writer = _writer(mem, 64, written=3)
    for consumed, unread in ((0, 3), (2, 1), (3, 0), (4, 0), (U64, 0)):
        _set_word(mem, shm_ring.CONSUMED_AT, consumed)
        assert writer.unread() == unread
    _release(writer)


# -- the decoder ------------------------------------------------------------------------------------------

def _both_decode(data: bytes, cache_c: list | None, cache_py: list | None) -> tuple:
    got, want = _decoded(step_wire.decode, data, cache_c), _decoded(step_wire.decode_py, data, cache_py)
    assert repr(got) == repr(want)  # repr: a NaN from changed bytes compares unequal to itself
    assert cache_c == cache_py
    if want[0] != "ok":
        assert issubclass(want[0], COUNTED), want
    return want


@st.composite
def garbled(draw, record: bytes) -> bytes:
    """A record changed as a lossy or hostile channel would: u32 fields set to edge values (counts, sizes),
    bits flipped, cut short, bytes added."""
    b = bytearray(record)
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["u32", "flip", "cut", "add"]))
        if what == "u32" and len(b) >= 4:
            at = draw(st.one_of(st.sampled_from([87, 91, 95]), st.integers(0, len(b) - 4)))  # shares, z, m
            if at + 4 <= len(b):
                value = draw(st.one_of(st.sampled_from([0, 1, 2, 3, 63, 64, 65, 1 << 31, (1 << 32) - 1]),
                                       st.integers(0, (1 << 32) - 1)))
                struct.pack_into("<I", b, at, value)
        elif what == "flip" and b:
            b[draw(st.integers(0, len(b) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif what == "cut":
            del b[draw(st.integers(0, len(b))):]
        else:
            b += draw(st.binary(min_size=1, max_size=12))
    return bytes(b)


@fast
@settings(max_examples=400)
@given(data=st.data(), steps=st.lists(payloads(), min_size=1, max_size=3), cache=st.booleans())
def test_garbled_step_records_are_decoded_alike_or_refused_alike(data, steps, cache):
    """A sender's records (the same batch repeated: ids left out), each read by both decoders with their own
    reader cache, the last one garbled: the same record or the same counted error, the same cache after."""
    sender = step_wire.sender_cache()
    records = []
    for i, payload in enumerate(steps):
        if i and data.draw(st.booleans()):  # the batch of the step before, the next step: SAME_IDS
            payload = payload._replace(step_id=steps[i - 1].step_id + 1, shares=steps[i - 1].shares)
            steps[i] = payload
        records.append(step_wire.encode_py(payload, sender, True))
    records[-1] = data.draw(garbled(records[-1]))
    caches = (step_wire.reader_cache(), step_wire.reader_cache()) if cache else (None, None)
    for record in records:
        _both_decode(record, *caches)


@fast
@settings(max_examples=300)
@given(data=st.binary(max_size=300), header=st.booleans(), cache=st.booleans())
def test_random_bytes_are_refused_alike_by_both_decoders(data, header, cache):
    if header:  # past the version check: a header of this version, then anything
        data = bytes([step_wire.VERSION]) + data
    caches = (step_wire.reader_cache(), step_wire.reader_cache()) if cache else (None, None)
    _both_decode(data, *caches)


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_garbled_ring_costs_its_records_counted_never_an_exception(path, monkeypatch, tmp_path):
    """Through the receiver: a ring whose size words and head were garbled after honest records is counted
    as malformed, and the next honest record still arrives, on either reader."""
    if path == "python":
        monkeypatch.setattr(step_wire, "ring_read", None)
    elif step_wire.ring_read is None:
        pytest.skip(f"no C ring reader: {step_wire.REASON}")
    if not shm_ring.AVAILABLE:
        pytest.skip("no step rings on this platform")
    from test_step_sockets import record

    receiver = step_transport.StepReceiver(str(tmp_path))
    sink = step_transport.SocketSink(str(tmp_path))
    try:
        sink(record(1))
        got: list = []
        receiver.drain(got.append)
        ring = next(iter(receiver.rings.values()))
        sink(record(2))
        ring._sizes[(ring.tail % ring.cap) >> 2] = (1 << 32) - 1
        receiver.drain(got.append)
        other = record(3)  # another batch: a record that lists its ids (one reusing them would refer to the lost one)
        sink(other._replace(shares=other.shares._replace(ids=["req-c", "req-d"])))
        receiver.drain(got.append)
        assert [s.step_id for s in got] == [1, 3] and receiver.malformed == 1
    finally:
        sink.close()
        receiver.close()
