"""The shared-memory ring between an EngineCore and a frontend (shm_ring), on its own and through the
sink and receiver: every record read is one written, in order; what does not fit is refused (counted by
the sink), never overwritten unread; a bad ring or announcement is refused and counted."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest

from otel_llm import shm_ring
from otel_llm.instrumentation.vllm import step_transport

pytestmark = pytest.mark.skipif(not shm_ring.AVAILABLE, reason="no step rings on this platform")


def pair(capacity: int) -> tuple[shm_ring.RingWriter, shm_ring.RingReader]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        writer = shm_ring.RingWriter(capacity)
        writer.announce(a)
        data, fds, _, _ = socket.recv_fds(b, 1 << 16, 1)
        try:
            return writer, shm_ring.RingReader(data, fds[0])
        finally:
            os.close(fds[0])
    finally:
        a.close()
        b.close()


def test_records_wrap_around_the_end_and_read_back_in_order_none_overwritten_unread():
    writer, reader = pair(256)
    written, read, refused, wrapped = [], [], 0, 0
    for i in range(600):
        record = bytes([i % 251]) * (1 + (i * 37) % 90)  # 1..90 bytes, sizes that don't divide the ring
        before = writer.head % writer.cap
        if writer.write(record):
            written.append(record)
            wrapped += before + 4 + len(record) > writer.cap
        else:
            refused += 1
        if i % 7 == 6:  # the reader comes by now and then: the ring fills up in between
            read.extend(reader.read())
            assert writer.unread() == 0
    read.extend(reader.read())
    assert read == written
    assert refused and wrapped  # the case is exercised: full rings and records split at the end
    assert writer.written == reader.consumed == len(written)
    writer.close()
    reader.close()


def test_a_full_ring_refuses_and_keeps_what_it_holds():
    writer, reader = pair(128)
    accepted = [r for r in (bytes([i]) * 20 for i in range(10)) if writer.write(r)]
    assert len(accepted) == 5  # 24 bytes each, 128 of room
    assert not writer.write(b"x" * 200)  # larger than the ring: never fits
    assert writer.unread() == 5
    assert reader.read() == accepted and writer.unread() == 0
    assert writer.write(b"y" * 20) and reader.read() == [b"y" * 20]
    writer.close()
    reader.close()


def test_a_record_with_an_impossible_size_is_refused_and_the_ring_goes_on():
    writer, reader = pair(256)
    writer.write(b"good")
    assert reader.read() == [b"good"]
    writer.write(b"bad record")
    writer._sizes[8 >> 2] = 10_000  # its size field (after "good": 4 + 4 bytes), mangled
    with pytest.raises(shm_ring.RingError) as err:
        reader.read()
    assert err.value.args[1] == []
    writer.write(b"after")
    assert reader.read() == [b"after"]
    writer.close()
    reader.close()


@pytest.mark.parametrize("mangle, why", [
    (lambda data: b"notaring" + data[8:], "layout"),
    (lambda data: data[:8] + (shm_ring.LAYOUT + 1).to_bytes(4, "little") + data[12:], "layout"),
    (lambda data: data[:12] + (1 << 16).to_bytes(4, "little") + data[16:], "capacity"),
    (lambda data: data[:-1], "bytes"),
])
def test_a_bad_announcement_is_refused_and_counted(mangle, why):
    """Another layout, a capacity its memory file does not have, a short announcement: refused,
    counted as malformed, its descriptor closed; the frontend's records still arrive."""
    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.connect(receiver.path)
        writer = shm_ring.RingWriter(256)
        data = shm_ring.ANNOUNCE.pack(shm_ring.MAGIC, shm_ring.LAYOUT, 256, 1)
        socket.send_fds(sock, [mangle(data)], [writer._fd])
        with pytest.raises(shm_ring.RingError, match=why):
            shm_ring.RingReader(mangle(data), writer._fd)
        before = len(os.listdir("/proc/self/fd"))
        assert receiver.drain(lambda step: None) is None
        assert receiver.malformed == 1 and receiver.rings == {}
        assert len(os.listdir("/proc/self/fd")) == before  # the descriptor it carried was received and closed
        writer.close()
        sock.close()
        receiver.close()


def test_several_frontends_each_read_every_record_from_their_ring_with_no_datagram(monkeypatch):
    with tempfile.TemporaryDirectory() as d:
        receivers = []
        for pid in (999_101, 999_102):
            monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
            receivers.append(step_transport.StepReceiver(d))
        monkeypatch.undo()
        sink = step_transport.SocketSink(d)
        from test_step_sockets import record

        sink(record(1))  # connects, hands each frontend its ring
        for step_id in range(2, 6):
            sink(record(step_id))
        for r in receivers:
            got: list = []
            r.drain(got.append)
            assert [s.step_id for s in got] == [1, 2, 3, 4, 5] and len(r.rings) == 1
            with pytest.raises(BlockingIOError):
                r.sock.recv(1 << 16)  # nothing left on the socket: the records came through the ring
        assert sink.dropped == 0
        for r in receivers:
            r.close()
        sink.close()


def test_a_frontend_that_lags_loses_records_counted_by_the_sink():
    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        sink = step_transport.SocketSink(d)
        sink.RING_CAPACITY = 1024  # a few records' room
        from test_step_sockets import record

        for step_id in range(1, 41):
            sink(record(step_id))
        got: list = []
        receiver.drain(got.append)
        assert got and [s.step_id for s in got] == list(range(1, len(got) + 1))  # the first ones, in order
        assert sink.dropped == 40 - len(got)
        sink(record(41))
        receiver.drain(got.append)
        assert got[-1].step_id == 41 and sink.dropped == 40 - len(got) + 1
        receiver.close()
        sink.close()


def test_a_restarted_engine_replaces_its_ring_and_rings_of_engines_gone_are_bounded(monkeypatch):
    """Rings are keyed by the EngineCore's pid: a new one from the same pid (it reconnected) replaces
    the old; at most MAX_RINGS are kept, the oldest closed first."""
    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.connect(receiver.path)
        writers = []
        for pid in [1, 2, 1] + list(range(3, 3 + step_transport.StepReceiver.MAX_RINGS)):
            monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
            writer = shm_ring.RingWriter(256)
            writer.announce(sock)
            writer.write(pid.to_bytes(4, "little") * 8)  # not a step record: refused when read, counted
            writers.append(writer)
            receiver.drain(lambda step: None)
        monkeypatch.undo()
        assert list(receiver.rings) == list(range(3, 3 + step_transport.StepReceiver.MAX_RINGS))  # 1 and 2 went first
        assert receiver.malformed == 3 + step_transport.StepReceiver.MAX_RINGS
        for w in writers:
            w.close()
        sock.close()
        receiver.close()


def test_after_a_drop_or_a_new_frontend_the_next_record_lists_its_ids(monkeypatch):
    """A steady batch's records leave their ids out (step_wire SAME_IDS); a frontend whose ring was
    full, and one that appears at a rescan, get a record with every id next: each frontend decodes
    every record it was given, none refused, and the lost ones are counted by the sink."""
    from test_step_sockets import steady

    with tempfile.TemporaryDirectory() as d:
        monkeypatch.setattr(os, "getpid", lambda: 999_201)
        a = step_transport.StepReceiver(d)
        monkeypatch.undo()
        sink = step_transport.SocketSink(d)
        sink.RING_CAPACITY = 2048  # room for the first full record and a few short ones
        ids = [f"cmpl-{i:032x}-0" for i in range(32)]
        got_a: list = []
        for step_id in range(1, 31):  # a lags: its ring fills up
            sink(steady(step_id, ids, [50 + step_id] * 32))
        a.drain(got_a.append)
        lost = sink.dropped
        assert lost and [s.step_id for s in got_a] == list(range(1, 31 - lost))
        monkeypatch.setattr(os, "getpid", lambda: 999_202)
        b = step_transport.StepReceiver(d)  # a frontend that starts now
        monkeypatch.undo()
        sink._scanned = float("-inf")
        got_b: list = []
        for step_id in range(31, 41):
            sink(steady(step_id, ids, [50 + step_id] * 32))
            a.drain(got_a.append)
            b.drain(got_b.append)
        assert [s.step_id for s in got_a[-10:]] == [s.step_id for s in got_b] == list(range(31, 41))
        assert all(s.ids == ids and s.contexts == [50 + s.step_id] * 32 for s in got_a + got_b)
        assert a.malformed == b.malformed == 0 and sink.dropped == lost
        a.close()
        b.close()
        sink.close()


def test_two_engines_rings_into_one_frontend_each_keep_their_own_ids(monkeypatch):
    """Two EngineCores (data parallel) with steady batches of different requests, read by one
    frontend in one drain: each ring's records reuse that ring's ids, never the other's."""
    from test_step_sockets import steady

    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        sinks = []
        for pid in (999_301, 999_302):
            monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
            sinks.append(step_transport.SocketSink(d))
            sinks[-1](steady(pid << 32 | 1, [f"{pid}-{i}" for i in range(8)], [1] * 8))  # rings announced as pid
        monkeypatch.undo()
        got: list = []
        receiver.drain(got.append)
        for k in range(2, 6):  # drained after each pair: the two engines' records alternate
            for pid, sink in zip((999_301, 999_302), sinks):
                sink(steady(pid << 32 | k, [f"{pid}-{i}" for i in range(8)], [k] * 8))
            receiver.drain(got.append)
        assert receiver.malformed == 0 and len(got) == 10
        for pid in (999_301, 999_302):
            mine = [s for s in got if s.step_id >> 32 == pid]
            assert [s.step_id & 0xFFFFFFFF for s in mine] == [1, 2, 3, 4, 5]
            assert all(s.ids == [f"{pid}-{i}" for i in range(8)] for s in mine)
        for sink in sinks:
            sink.close()
        receiver.close()


def test_the_socket_is_still_read_at_every_drain_once_a_ring_is_attached(monkeypatch):
    """The receiver asks the socket whether anything waits (poll) instead of reading it empty: a second
    EngineCore's ring announced after the first ring is attached, and a sender of datagrams (no ring),
    are read in the very next drain, in the order the socket holds them; a closed receiver drains nothing."""
    from test_step_sockets import record

    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        monkeypatch.setattr(os, "getpid", lambda: 999_401)
        first = step_transport.SocketSink(d)
        first(record(999_401 << 32 | 1))
        got: list = []
        receiver.drain(got.append)
        for _ in range(3):
            receiver.drain(got.append)  # nothing waits: nothing read, nothing counted
        assert len(receiver.rings) == 1 and [s.step_id & 0xFFFFFFFF for s in got] == [1]
        monkeypatch.setattr(os, "getpid", lambda: 999_402)
        second = step_transport.SocketSink(d)
        second(record(999_402 << 32 | 1))  # announced (and written) after the first ring was attached
        datagrams = step_transport.SocketSink(d)
        datagrams.RING = False  # this one sends a datagram a step
        datagrams(record(7))
        monkeypatch.undo()
        receiver.drain(got.append)
        assert len(receiver.rings) == 2 and receiver.malformed == 0
        assert sorted(s.step_id for s in got[1:]) == sorted([7, 999_402 << 32 | 1])
        receiver.close()
        datagrams(record(8))
        receiver.drain(got.append)  # closed: nothing read, nothing raised
        assert len(got) == 3
        for sink in (first, second, datagrams):
            sink.close()
