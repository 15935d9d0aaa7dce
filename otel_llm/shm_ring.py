"""A shared-memory ring from one process to another: records without a system call each.

Two pairs use it: an EngineCore and each frontend (or its agent) for the engine-step records, and a
frontend and its agent process for the requests' starts and finishes (agent/link.py).

The EngineCore's ``SocketSink`` makes one ring for each frontend socket it connects: an anonymous
memory file (``memfd_create``), whose descriptor travels once over the frontend's socket (SCM_RIGHTS,
in an announcement datagram); from then on each step's record is copied into the ring, with no
``send``. The frontend (``StepReceiver.drain``) reads its rings right after its socket, before the
outputs it is about to process: the EngineCore wrote a step's record before that step's outputs left
it over ZMQ (a syscall and locks after the copy), so the record is in the ring when the outputs
arrive. (Why not a datagram a step: the copy costs the EngineCore's loop less than a ``send``, and
the frontend less than a receive (benchmarks/engine_step_hooks.py, modes ``hooks`` and ``hooks_dgram``);
and a datagram socket queues at most ``net.unix.max_dgram_qlen`` records, 10 by default, where a ring
holds the records of a frontend that falls behind for many steps.)

One writer and one reader per ring, so no record is ever overwritten before it is read: the writer
publishes ``head`` (bytes written) after copying a record, the reader publishes ``tail`` (bytes read)
and ``consumed`` (records read) after copying records out. A record that does not fit in the free
space is dropped and counted by the writer (the frontend lags: as a full socket buffer did). A
frontend that died without reading is found by the sink's once-a-second probe on its socket; the
records it never read (written - consumed) are counted as dropped then.

Memory ordering: x86-64 only (``AVAILABLE``), where stores become visible in program order and loads
are not reordered with older loads: the writer's record bytes precede its ``head`` store, the
reader's ``head`` load precedes its loads of the bytes, which precede its ``tail`` store. CPython
makes each of them a separate C call (a slice copy, a memoryview item store or load) the compiler
cannot reorder across.
Elsewhere (weaker ordering, e.g. ARM) the sink keeps sending datagrams.

Layout: ``magic:8s layout:u32 capacity:u32`` (little-endian) | ``head:u64`` (writer) | ``tail:u64
consumed:u64`` (reader; native byte order, the same machine) | padding to 64 | data. A record is
``size:u32`` then its bytes (wrapping around the end), padded to 4 bytes: the size never straddles the
end.
"""

from __future__ import annotations

import mmap
import os
import platform
import socket
import struct
import sys

MAGIC = b"otelring"
LAYOUT = 1
CAPACITY = 2 << 20  # bytes of records in flight per pair: room for many steps' records while a reader is busy elsewhere
META = struct.Struct("<8sII")  # at 0: magic, layout, capacity (written once, before the announcement)
ANNOUNCE = struct.Struct("<8sIIQ")  # the datagram that carries the descriptor: magic, layout, capacity, writer pid
# byte offsets in the mapping (the C accelerator is configured with these, step_wire.accelerator): the data,
# and the 8-byte words head (writer), tail and consumed (reader)
DATA_AT, HEAD_AT, TAIL_AT, CONSUMED_AT = 64, 16, 24, 32
_DATA = DATA_AT
_HEAD, _TAIL, _CONSUMED = HEAD_AT // 8, TAIL_AT // 8, CONSUMED_AT // 8  # as indices of the header's 8-byte words

AVAILABLE = (sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
             and hasattr(os, "memfd_create") and hasattr(socket, "send_fds"))
FDS_SPACE = socket.CMSG_SPACE(4) if hasattr(socket, "CMSG_SPACE") else 0  # one descriptor


def _views(mm: mmap.mmap) -> tuple[memoryview, memoryview, memoryview]:
    """The header's 8-byte words, the data bytes, the data as 4-byte words (record sizes). Native
    memoryview items: an aligned 8-byte position is stored and loaded with one instruction (a struct
    "<Q" would write it byte by byte: a reader could see half of it), and they cost less than
    ``pack_into``. (Native byte order: both ends are the same machine.)"""
    whole = memoryview(mm)
    return whole[:_DATA].cast("Q"), whole[_DATA:], whole[_DATA:].cast("I")


def _release(*views: memoryview) -> None:
    for v in views:
        v.release()  # the mmap cannot close while a view of it exists
    # (the sliced parents are temporaries, released when collected)


class RingError(ValueError):
    """A ring (or its announcement) that is not of this layout, or whose positions make no sense."""


class RingWriter:
    """The writing side of one pair (the EngineCore's, a frontend's to its agent). ``write`` copies a record
    in, or returns False when it does not fit. ``name``: the memory file's, as ``/proc/PID/fd`` shows it."""

    __slots__ = ("mm", "cap", "head", "written", "_fd", "_words", "_data", "_sizes")

    def __init__(self, capacity: int = CAPACITY, name: str = "otel-llm-steps") -> None:
        if capacity % 4 or capacity < 64:
            raise ValueError(f"ring capacity {capacity}: a multiple of 4, at least 64")
        self._fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, _DATA + capacity)
            self.mm = mmap.mmap(self._fd, _DATA + capacity)
        except OSError:
            os.close(self._fd)
            raise
        META.pack_into(self.mm, 0, MAGIC, LAYOUT, capacity)
        self.cap = capacity
        self.head = 0
        self.written = 0
        self._words, self._data, self._sizes = _views(self.mm)
        self._data[:] = bytes(capacity)  # every page touched now: no page faults on the first lap of steps

    def announcement(self) -> bytes:
        """What a reader is made from, with the memory file's descriptor (``RingReader``)."""
        return ANNOUNCE.pack(MAGIC, LAYOUT, self.cap, os.getpid())

    def announce(self, sock: socket.socket, message: bytes | None = None) -> None:
        """Hand the ring to the process at the other end of ``sock`` (OSError if it is gone): ``message`` (by
        default the announcement itself) with the memory file's descriptor, in one datagram."""
        try:
            socket.send_fds(sock, [self.announcement() if message is None else message], [self._fd])
        finally:
            os.close(self._fd)  # the mapping stays; the reader holds its own descriptor or none
            self._fd = -1

    def write(self, data: bytes) -> bool:
        # once a step in the EngineCore's loop, vLLM's critical path: kept to the fewest interpreter steps
        size = len(data)
        head = self.head
        end = head + ((size + 7) & ~3)  # the size word, then the record padded to 4 bytes
        words = self._words
        # The reader's tail is untrusted, read once: written only where end - cap <= tail <= head. That bounds
        # the record by the free space (hence by the capacity) whatever tail says; a tail beyond head, which
        # no reader publishes, refuses too.
        if not end - self.cap <= words[_TAIL] <= head:
            return False  # the frontend has not read enough yet (or the record is larger than the ring)
        p = head % self.cap
        self._sizes[p >> 2] = size
        p += 4
        if p + size <= self.cap:
            self._data[p:p + size] = data
        else:  # wraps around the end
            first = self.cap - p
            self._data[p:] = data[:first]
            self._data[:size - first] = data[first:]
        self.head = words[_HEAD] = end  # published after the bytes (see the module's note on ordering)
        self.written += 1
        return True

    def unread(self) -> int:
        """Records written that the frontend has not read (lost, once it is known to be gone): bounded by
        those written, whatever the reader's (untrusted) count says."""
        return min(max(self.written - self._words[_CONSUMED], 0), self.written)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        _release(self._words, self._data, self._sizes)
        self.mm.close()


class RingReader:
    """The reading side of one pair, from the announcement and the descriptor that came with it."""

    __slots__ = ("mm", "cap", "writer_pid", "tail", "consumed", "ids", "_words", "_data", "_sizes")

    def __init__(self, announcement: bytes, fd: int) -> None:
        try:
            magic, layout, cap, pid = ANNOUNCE.unpack(announcement)
        except struct.error:
            raise RingError(f"ring announcement of {len(announcement)} bytes, not {ANNOUNCE.size}") from None
        if magic != MAGIC or layout != LAYOUT:
            raise RingError(f"ring of layout {layout}, this otel-llm reads layout {LAYOUT}")
        if cap % 4 or cap < 64 or os.fstat(fd).st_size != _DATA + cap:
            raise RingError(f"ring of capacity {cap} in a memory file of {os.fstat(fd).st_size} bytes")
        self.mm = mmap.mmap(fd, _DATA + cap)
        if META.unpack_from(self.mm, 0) != (MAGIC, LAYOUT, cap):
            self.mm.close()
            raise RingError("ring whose header disagrees with its announcement")
        self.cap, self.writer_pid = cap, pid
        self._words, self._data, self._sizes = _views(self.mm)
        self.tail, self.consumed = self._words[_TAIL], self._words[_CONSUMED]
        self.ids: list = [None, None, None]  # step_wire.reader_cache(): decode's cache for this ring's records (one sender)

    def read(self) -> list[bytes]:
        """The records written since the last read, oldest first. ``RingError`` when the positions or a
        record's size make no sense: everything written up to now is skipped (the ring stays usable).

        The shared memory is untrusted: the writer's head and each record's size are read once, into locals,
        and bounded before use (the C reader, step_wire.ring_read, takes and refuses exactly the same)."""
        words = self._words
        head = words[_HEAD]
        tail = self.tail
        if head == tail:
            return []
        cap, data, sizes = self.cap, self._data, self._sizes
        out = []
        error = None
        if head < tail or head - tail > cap or head % 4 or tail % 4:  # (tail started as the ring's word)
            error = f"ring positions head {head}, tail {tail} for a capacity of {cap}"
        while error is None and tail < head:
            p = tail % cap
            size = sizes[p >> 2]
            step = 4 + ((size + 3) & ~3)
            if size > cap - 4 or step > head - tail:  # (the second bounds the first: head - tail <= cap)
                error = f"ring record of {size} bytes with {head - tail - 4} written"
                break
            q = p + 4
            if q + size <= cap:
                out.append(data[q:q + size].tobytes())
            else:
                out.append(data[q:cap].tobytes() + data[:size - (cap - q)].tobytes())
            tail += step
        self.consumed += len(out)
        self.tail = head if error else tail
        words[_CONSUMED] = self.consumed
        words[_TAIL] = self.tail  # after the copies: from now on the writer may reuse the space
        if error:
            raise RingError(error, out)
        return out

    def close(self) -> None:
        _release(self._words, self._data, self._sizes)
        self.mm.close()
