"""Durable logs on disk (the ``file_storage`` extension): an exporter's sending queue and the batches the tail
sampler holds undecided.

A ``DurableLog`` is a directory of append-only segment files plus a cursor. A record is
``length (u32) | crc32 (u32) | payload``; ``append`` writes it with one ``write`` (and ``fsync`` when the
extension says so) before the caller acknowledges anything; ``ack(position)`` says every record up to
``position`` is done, persists the cursor (16 bytes rewritten in place, with its own crc) and deletes the
segments wholly before it. ``replay`` yields the records after the cursor, in order, at start.

What a crash leaves:

- a record written up to the crash but not acknowledged is replayed: at least once, so a record done but not
  yet acknowledged in the cursor is done twice (counted as ``replayed``: the bound on duplicates);
- a torn last record (a crash mid-write) is skipped, counted as ``torn`` and cut off the file, so appends
  after it are clean; a record whose crc fails before the end of a segment (the disk or someone else
  changed it) ends that segment's replay, counted as ``corrupt``;
- a torn cursor (crc fails) replays from the oldest segment (more duplicates, nothing lost).

``fsync: false`` (the upstream default) survives a killed process (SIGKILL, the OOM killer): the kernel holds
what was written. ``fsync: true`` also survives a power loss or kernel crash, at one ``fsync`` per append
and per acknowledgement (benchmarks/collector_throughput.py measures it).

The disk budget (``max_size``) counts the segments' bytes: an append past it raises ``StorageFull`` and writes
nothing; what it meant to keep is then refused or dropped by the caller, counted (see docs/collector-limits.md).
One process uses a directory at a time (an exclusive ``flock``).
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import threading
import zlib
from typing import Callable, Iterator, NamedTuple

SEGMENT_BYTES = 8 << 20  # a segment is closed past this size; the oldest is deleted once wholly acknowledged
_HEADER = struct.Struct("<II")  # payload length, crc32 of the payload
_CURSOR = struct.Struct("<IQI")  # segment, offset, crc32 of the first 12 bytes
_MAX_RECORD = 1 << 30
_SEGMENT = re.compile(r"^(\d{10})\.log$")

# outcomes counted in ``storage_records{storage, outcome}``
WRITTEN, REPLAYED, TORN, CORRUPT, FULL = "written", "replayed", "torn", "corrupt", "full"

Count = Callable[[str, int], None]  # (outcome, records)


class StorageFull(Exception):
    """An append would take the log past its disk budget: nothing was written."""


class StorageBusy(Exception):
    """Another process holds the log's directory."""


class Position(NamedTuple):
    segment: int
    offset: int  # the end of a record in its segment


class DurableLog:
    def __init__(self, directory: str, fsync: bool = False, max_bytes: int = 1 << 30,
                 count: Count | None = None, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory, self.fsync, self.max_bytes = directory, fsync, max_bytes
        self.segment_bytes = segment_bytes
        self._count = count or (lambda outcome, n: None)
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise StorageBusy(f"{directory} is in use by another process") from None
        self._sizes: dict[int, int] = {}  # segment -> bytes, oldest first
        for name in sorted(os.listdir(directory)):
            m = _SEGMENT.match(name)
            if m:
                self._sizes[int(m.group(1))] = os.path.getsize(os.path.join(directory, name))
        self._cursor_fd = os.open(os.path.join(directory, "cursor"), os.O_RDWR | os.O_CREAT, 0o600)
        self.cursor = self._read_cursor()
        self._fd: int | None = None  # the segment being appended to: always a new one after a start
        self._segment = max(self._sizes, default=0)
        # one producer appends (the pipeline) while one consumer acknowledges (an exporter's worker)
        self._lock = threading.Lock()
        self._closed = False

    # -- start ---------------------------------------------------------------------------------

    def _read_cursor(self) -> Position:
        raw = os.pread(self._cursor_fd, _CURSOR.size, 0)
        if len(raw) == _CURSOR.size:
            segment, offset, crc = _CURSOR.unpack(raw)
            if crc == zlib.crc32(raw[:12]):
                return Position(segment, offset)
            self._count(TORN, 1)  # replay from the oldest segment: duplicates, nothing lost
        return Position(0, 0)

    def replay(self) -> Iterator[tuple[Position, bytes]]:
        """The records after the cursor, oldest first (each counted as ``replayed``)."""
        segments = [s for s in self._sizes if s >= self.cursor.segment]
        for i, segment in enumerate(segments):
            start = self.cursor.offset if segment == self.cursor.segment else 0
            last = i == len(segments) - 1
            path = self._path(segment)
            with open(path, "rb") as f:
                f.seek(start)
                offset = start
                while True:
                    header = f.read(_HEADER.size)
                    if not header:
                        break
                    size = self._sizes[segment]
                    short = len(header) < _HEADER.size  # the record does not fit in what the file holds
                    payload, crc_ok = b"", False
                    if not short:
                        length, crc = _HEADER.unpack(header)
                        short = length > _MAX_RECORD or offset + _HEADER.size + length > size
                        if not short:
                            payload = f.read(length)
                            short = len(payload) < length
                            crc_ok = not short and zlib.crc32(payload) == crc
                    if short or not crc_ok:
                        at_end = short or offset + _HEADER.size + len(payload) >= size
                        if last and at_end:
                            self._count(TORN, 1)  # a crash mid-write: cut it off, appends stay clean
                            os.truncate(path, offset)
                            self._sizes[segment] = offset
                        else:
                            self._count(CORRUPT, 1)
                        break
                    offset += _HEADER.size + len(payload)
                    self._count(REPLAYED, 1)
                    yield Position(segment, offset), payload

    # -- running -------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of the segments on disk (what the budget counts)."""
        with self._lock:
            return sum(self._sizes.values())

    def append(self, payload: bytes) -> Position:
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            return self._append(record)

    def _append(self, record: bytes) -> Position:
        if self._closed:
            raise StorageFull(f"{self.directory}: the log is closed")
        if sum(self._sizes.values()) + len(record) > self.max_bytes:
            self._count(FULL, 1)
            raise StorageFull(f"{self.directory}: the disk budget of {self.max_bytes} bytes is spent")
        if self._fd is None or self._sizes[self._segment] >= self.segment_bytes:
            self._open_segment()
        assert self._fd is not None
        os.write(self._fd, record)
        if self.fsync:
            os.fsync(self._fd)
        self._sizes[self._segment] += len(record)
        self._count(WRITTEN, 1)
        return Position(self._segment, self._sizes[self._segment])

    def _open_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._segment += 1
        self._fd = os.open(self._path(self._segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        self._sizes[self._segment] = 0
        if self.fsync:  # the new file's name is durable too
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def ack(self, position: Position) -> None:
        """Every record up to ``position`` is done: persist the cursor, delete the segments wholly before it."""
        with self._lock:
            self._ack(position)

    def _ack(self, position: Position) -> None:
        if self._closed or position <= self.cursor:  # closed: the next start replays it (at least once)
            return
        self.cursor = position
        head = struct.pack("<IQ", *position)
        os.pwrite(self._cursor_fd, head + struct.pack("<I", zlib.crc32(head)), 0)
        if self.fsync:
            os.fsync(self._cursor_fd)
        for segment in [s for s in self._sizes if s < position.segment]:
            try:
                os.unlink(self._path(segment))
            except FileNotFoundError:
                pass
            del self._sizes[segment]

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._closed:  # a file descriptor number is reused: never close one twice
            return
        self._closed = True
        for fd in (self._fd, self._cursor_fd, self._lock_fd):  # the lock goes last, with its descriptor
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = None

    def _path(self, segment: int) -> str:
        return os.path.join(self.directory, f"{segment:010d}.log")


def log_directory(root: str, name: str) -> str:
    """A log's directory under the extension's: ``exporter_otlp_tempo`` for ``otlp/tempo``."""
    return os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]", "_", name))
