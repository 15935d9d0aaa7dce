"""Engine steps shipped from the EngineCore process to the frontends that own their requests.

The scheduler lives in the EngineCore process (its own process by default, or the caller's with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``); its hooks (step_hooks.py) make each step one small record:

* in-process, handed straight to the frontend's ``Pipeline``;
* across processes, one datagram (step_wire.py: a fixed struct layout) per frontend on Unix
  sockets in a directory that the
  first frontend created and named in ``OTEL_LLM_STEP_DIR`` before the engine was spawned.
  Every frontend process that builds an engine client binds ``<dir>/<pid>.sock`` there:
  with ``vllm serve --api-server-count N`` the N API server processes share one EngineCore
  and each gets every step (each keeps the shares of its own requests). Sends never block while
  the engine works: a Unix datagram socket queues at most ``net.unix.max_dgram_qlen`` datagrams
  (10 by default) however small, fewer than a tiny model's steps between two reads of a busy agent,
  so records a socket refuses wait in a small bounded backlog that goes, with the next record, as
  one batch datagram (agent/records.batch); it is sent again at each step, and when the engine goes
  idle the sink waits a bounded moment for the reader (no next step would send it). What still
  cannot go is dropped and counted.

The datagram is sent before the step's outputs leave the EngineCore, so the frontend
always holds a step's record before it sees the step's tokens.
"""

from __future__ import annotations

import array
import errno
import os
import select
import socket
import struct
import tempfile
import threading
import time
from typing import Any, Callable, NamedTuple

from ...guard import Guard
from ...core.timeline import StepRecord
from ... import shm_ring
from ...agent import records
from . import engine_errors, step_wire
from .process_roles import in_api_server_process

STEP_DIR_ENV = "OTEL_LLM_STEP_DIR"
# Test only (a fault injected on the real engine, read once when the sink is made; unset: nothing changes and
# nothing is checked per record): "K" sends the first K request starts and drops every later one, as a full
# socket would, counted in ``requests_dropped`` (tests/vllm/test_vllm_rust_frontend.py).
DROP_STARTS_AFTER_ENV = "OTEL_LLM_TEST_DROP_STARTS_AFTER"
_START = step_wire.START
_BATCH = bytes((records.BATCH,))
_TAG = bytes((records.TAG,))


class SocketSink:
    """EngineCore side: each step's record to every frontend socket in ``directory``.

    One socket per frontend, connected once (at the rescan that found it). Where the platform allows
    (shm_ring.AVAILABLE), the socket only hands the frontend a shared-memory ring, into which every
    record is then copied with no syscall (the EngineCore's request records too, in order with the steps);
    the socket is probed once per rescan to notice a frontend that died. Elsewhere one non-blocking
    datagram a step (a ``send`` on a connected socket skips the path lookup a ``sendto`` makes in the
    kernel every step)."""

    RESCAN_S = 1.0  # API servers start after the engine: look for new frontends this often
    MAX_BATCH = 64  # request records a datagram at most
    # records (steps and requests) held for a frontend whose socket is full, and their bytes: a batch
    # datagram stays well within what the reader takes (records.MAX_BATCH)
    MAX_BACKLOG = 128
    MAX_BACKLOG_BYTES = records.MAX_BATCH // 2
    # when the engine goes idle with a backlog: how long it waits for the frontend to read (an agent reads
    # at least every agent.process.IDLE_S); what is still held then is dropped, counted
    IDLE_WAIT_S = 0.25
    RING = shm_ring.AVAILABLE
    RING_CAPACITY = shm_ring.CAPACITY

    def __init__(self, directory: str, guard: Guard | None = None) -> None:
        self.directory = directory
        self.guard = guard if guard is not None else Guard()  # the plugin's EngineSide's
        self.dropped = 0
        self.requests_dropped = 0  # request records a frontend's socket refused (send_request)
        self._requests: list[bytes] = []  # request records queued for the next datagram (flush_requests)
        self._requests_size = 0
        # a frontend's socket path -> [records its socket refused, their bytes]: sent, in order, before
        # anything newer to that frontend (_put)
        self._backlogs: dict[str, list] = {}
        # the last step's request ids, their encoding, and the step id of the last record that every
        # frontend got (step_wire.encode: the next record leaves the ids out when they are the same):
        # None after anything that may have kept a record from a frontend
        self._ids = step_wire.sender_cache()
        # whether records may leave repeated ids out: only while every frontend reads a ring of its own (a
        # datagram socket may hear several EngineCores, interleaved, through one reader's cache)
        self._same_ids = False
        self._targets: list[tuple[str, socket.socket, shm_ring.RingWriter | None]] = []
        self._writes: tuple | None = ()  # each target's RingWriter.write, when every target has a ring (else None)
        self._rings: tuple = ()  # the same targets' RingWriters (for step_wire.encode_into_rings)
        # step_wire's choice: the C accelerator (encode and ring writes in one call) or the pure-Python path
        self._encode, self._into_rings = step_wire.encode, step_wire.encode_into_rings
        self._scanned = float("-inf")
        # engine_errors.ErrorReporter.changed, where this sink carries the EngineCore's error counts too
        self.on_rescan: Callable[[], None] | None = None
        self._reported = (0, 0)  # (dropped, requests_dropped) as the last SinkCounts record said them
        self._pid = os.getpid()
        drop_after = os.environ.get(DROP_STARTS_AFTER_ENV)
        if drop_after is not None:
            self.send_request = _dropping_starts(self.send_request, int(drop_after), self)  # type: ignore[method-assign]

    def send_control(self, data: bytes) -> None:
        """A control record (engine_errors.py) to every frontend, on its socket (never a ring)."""
        for _, sock, _ in self._targets:
            try:
                sock.send(data)
            except OSError:
                self.dropped += 1

    def send_request(self, data: bytes, now: float | None = None) -> None:
        """A request's record (otel_llm/agent/records.py), queued: the records of one moment go to every
        frontend as one datagram (``flush_requests``), at the next step's record (before it: a start before
        any step that serves its request), when the engine goes idle, or once a batch is full. One datagram a
        record lost most of a burst: a datagram socket queues 10 of them by default (net.unix.max_dgram_qlen)."""
        self._requests.append(data)
        self._requests_size += len(data)
        if len(self._requests) >= self.MAX_BATCH or self._requests_size >= records.MAX_BATCH // 4:
            self.flush_requests(now)

    def flush_requests(self, now: float | None = None) -> None:
        """The queued request records to every frontend: into its ring where it has one, in order with the
        step records (its socket queues ``max_dgram_qlen`` datagrams: a start held back there while the ring
        carried its request's first steps would reach the agent after them), else on its socket. Sent from
        the EngineCore's thread, as the steps are; a request may arrive before any step has looked for the
        frontends, so this looks too when the last look is stale."""
        queued = self._requests
        if not queued:
            if self._backlogs:
                self._retry()
            return
        self._requests, self._requests_size = [], 0
        now = time.monotonic() if now is None else now
        if now - self._scanned > self.RESCAN_S:
            self._rescan(now)
        dropped = self.requests_dropped
        in_ring: bytes | None = None
        for path, sock, ring in self._targets:
            if ring is None:
                self._put(path, sock, queued)  # after what that frontend's backlog holds, in one datagram
                continue
            if in_ring is None:
                in_ring = queued[0] if len(queued) == 1 else records.batch(queued)
            if not ring.write(in_ring):
                self.requests_dropped += len(queued)  # that frontend lags: its ring is full
        if self.requests_dropped == dropped and self._reported[1] != dropped:
            self.report_counts()  # this one got through: so may the count of those that did not

    def idle(self) -> None:
        """The engine went idle (step_hooks: its scheduler holds no request after a step): what is queued or
        held goes now, since no next step will send it. For a frontend whose socket is still full this waits
        up to ``IDLE_WAIT_S`` for it to read (the engine has nothing to do meanwhile), then drops what it
        still holds, counted: records that late would reach it after the finishes they precede."""
        self.flush_requests()
        if not self._backlogs:
            return
        deadline = time.monotonic() + self.IDLE_WAIT_S
        for path, sock, _ in list(self._targets):
            if path not in self._backlogs:
                continue
            try:
                waiter = select.poll()
                waiter.register(sock.fileno(), select.POLLOUT)
                # writable once the frontend read: a connected datagram socket polls its peer's queue
                waiter.poll(max(0, int((deadline - time.monotonic()) * 1000)))
            except (OSError, ValueError):
                pass
            self._put(path, sock, ())
        for path in list(self._backlogs):
            self._drop_backlog(path)

    def _put(self, path: str, sock: socket.socket, items: Any) -> None:
        """``items`` (encoded records, steps or requests, in order) to one frontend's socket, after what is
        held for it: one datagram (a batch where several go). A full socket (EAGAIN) keeps them, within the
        backlog's bounds (what does not fit is dropped, counted); any other refusal drops everything held
        for it, counted, and a frontend that is gone is forgotten. O(backlog) at most: bounded."""
        backlog = self._backlogs.get(path)
        if backlog is None:
            queue = items
        elif not items:
            queue = backlog[0]
        elif backlog[1] + sum(len(x) for x in items) > self.MAX_BACKLOG_BYTES + records.MAX_BATCH // 4:
            self._put(path, sock, ())  # too much for one datagram the reader takes: what is held first
            if path in self._backlogs:
                self._hold(self._backlogs[path], items)
                return
            backlog, queue = None, items
        else:
            queue = backlog[0] + list(items)
        if not queue:
            return
        data = queue[0] if len(queue) == 1 else records.batch(list(queue))
        try:
            sock.send(data)
        except BlockingIOError:  # the frontend lags: its socket holds max_dgram_qlen datagrams already
            if backlog is None:
                backlog = [[], 0]
                self._hold(backlog, items)
                if backlog[0]:
                    self._backlogs[path] = backlog
            else:
                self._hold(backlog, items)
            return
        except OSError as exc:
            for item in items:
                self._count_dropped(item)
            self._drop_backlog(path)
            if exc.errno in _GONE:  # that frontend is gone: forget it (and its stale socket file)
                self._forget(path)
            return
        if backlog is not None:
            del self._backlogs[path]

    def _hold(self, backlog: list, items: Any) -> None:
        held, size = backlog
        for item in items:
            if len(held) >= self.MAX_BACKLOG or size + len(item) > self.MAX_BACKLOG_BYTES:
                self._count_dropped(item)  # the newest goes: what is held keeps its order
            else:
                held.append(item)
                size += len(item)
        backlog[1] = size

    def _retry(self) -> None:
        """Every backlog sent again, each as one datagram."""
        for path, sock, _ in list(self._targets):
            if path in self._backlogs:
                self._put(path, sock, ())

    def _count_dropped(self, item: bytes) -> None:
        if item[:1] == _TAG:
            self.requests_dropped += 1
        else:
            self.dropped += 1

    def _drop_backlog(self, path: str) -> None:
        backlog = self._backlogs.pop(path, None)
        if backlog is not None:
            for item in backlog[0]:
                self._count_dropped(item)

    @property
    def held(self) -> int:
        """Records held in backlogs now, over all frontends."""
        return sum(len(b[0]) for b in self._backlogs.values())

    def report_counts(self) -> None:
        """What this sink could not deliver (a ``SinkCounts`` record, cumulative) to every frontend, on its
        socket, when it changed since the last one sent."""
        counts = (self.dropped, self.requests_dropped)
        if counts == self._reported or not self._targets:
            return
        data = records.encode(records.SinkCounts(pid=self._pid, steps_dropped=counts[0], requests_dropped=counts[1]))
        sent = False
        for _, sock, _ in self._targets:
            try:
                sock.send(data)
                sent = True
            except OSError:
                pass  # cumulative: the next one says it
        if sent:
            self._reported = counts

    def __call__(self, payload: step_wire.StepPayload) -> None:
        # the step's start is the hooks' clock, time.monotonic: no clock read of our own
        start = payload[_START]
        if self._requests:  # the request records of this moment first: the agent reads them before the steps
            self.flush_requests(start)
        if start - self._scanned > self.RESCAN_S:
            self._rescan(start)
        into_rings = self._into_rings
        if into_rings is not None and self._writes is not None:
            # the C accelerator (step_wire picks it): encode and RingWriter.write in one call, same bytes
            try:
                full = into_rings(payload, self._ids, self._rings)
            except Exception:
                self._resync()  # not sent: the next record lists its ids
                raise
            if full:
                self.dropped += full  # those frontends lag: their rings are full
                self._resync()  # they missed this record: the next one lists its ids
            return
        try:
            data = self._encode(payload, self._ids, self._same_ids)
        except Exception:
            self._resync()  # not sent: the next record lists its ids
            raise
        writes = self._writes
        if writes is not None:  # every frontend reads a ring (the rule where rings are available)
            for write in writes:
                if not write(data):
                    self.dropped += 1  # that frontend lags: its ring is full
                    self._resync()  # it missed this record: the next one lists its ids
            return
        backlogs = self._backlogs
        for path, sock, ring in self._targets:
            if ring is not None:
                if not ring.write(data):
                    self.dropped += 1  # that frontend lags: its ring is full
                    self._resync()  # it missed this record: the next one lists its ids
                continue
            if backlogs:
                self._put(path, sock, (data,))  # after what is held for it, in one datagram
                continue
            try:
                sock.send(data)
            except BlockingIOError:  # that frontend lags: held, and sent with the next record (_put)
                self._put(path, sock, (data,))
            except OSError as exc:
                self.dropped += 1  # unreachable: telemetry is what we lose
                if exc.errno in _GONE:  # that frontend is gone: forget it (and its stale socket file)
                    self._forget(path)

    def _rescan(self, now: float) -> None:
        self._scanned = now
        if self.on_rescan is not None:
            self.on_rescan()  # error counts held back by its interval
        for path, sock, ring in self._targets:
            if ring is not None:
                try:
                    sock.send(b"")  # alive? (an empty datagram, skipped by the frontend)
                except OSError as exc:
                    if exc.errno in _GONE:
                        self._forget(path)
        try:
            paths = [os.path.join(self.directory, f) for f in sorted(os.listdir(self.directory))
                     if f.endswith(".sock")]
        except OSError:
            paths = []
        known = {path: (sock, ring) for path, sock, ring in self._targets}
        targets = []
        for path in paths:
            target = known.pop(path, None)
            if target is None:
                target = self._connect(path)
                if target is None:
                    continue
            targets.append((path, *target))
        for path, (sock, ring) in known.items():  # their files are gone (the frontend closed)
            if ring is not None:
                self.dropped += ring.unread()
            self._drop_backlog(path)
            self._close(sock, ring)
        self._targets = targets
        self._resync()  # a new frontend has read nothing yet (once a second: one record with its ids)
        self.report_counts()

    def _connect(self, path: str, forget_stale: bool = True) -> tuple | None:
        """A socket connected to the frontend at ``path``, and the ring handed to it (None: datagrams)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            if forget_stale:
                self.dropped += 1  # a stale socket file of a frontend that is gone
            _unlink(path)
            return None
        except OSError:
            sock.close()
            return None
        ring = None
        if self.RING:
            try:
                ring = shm_ring.RingWriter(self.RING_CAPACITY)
            except OSError as exc:
                self.guard.failed("step ring", exc)
            else:
                try:
                    ring.announce(sock)
                except OSError:  # refused now (gone) or the buffer is full: datagrams for this one
                    ring.close()
                    ring = None
        return sock, ring

    def _forget(self, path: str) -> None:
        """A frontend whose socket refused: gone, unless another process bound the path since (a pid
        reused): then the path is connected again. Records left unread in its ring are counted."""
        targets = []
        for p, sock, ring in self._targets:
            if p != path:
                targets.append((p, sock, ring))
                continue
            if ring is not None:
                self.dropped += ring.unread()
            self._drop_backlog(path)
            self._close(sock, ring)
            target = self._connect(path, forget_stale=False)
            if target is not None:
                targets.append((path, *target))
        self._targets = targets
        self._resync()

    def _resync(self) -> None:
        """The next record lists its request ids (step_wire: SAME_IDS), after anything that may have kept
        a record from a frontend. The records after it leave them out while they repeat, but only where
        every frontend reads a ring of its own: a datagram socket may hear several EngineCores,
        interleaved, through one reader's cache."""
        self._ids[step_wire.CACHE_LAST_STEP] = None
        rings = all(ring is not None for _, _, ring in self._targets)
        self._same_ids = rings
        self._writes = tuple(ring.write for _, _, ring in self._targets) if rings else None
        self._rings = tuple(ring for _, _, ring in self._targets) if rings else ()

    @staticmethod
    def _close(sock: socket.socket, ring: shm_ring.RingWriter | None) -> None:
        sock.close()
        if ring is not None:
            ring.close()

    def close(self) -> None:
        for path, sock, ring in self._targets:
            self._drop_backlog(path)
            self._close(sock, ring)
        self._targets = []
        self._writes = ()
        self._rings = ()


def _dropping_starts(send: Callable[..., None], keep: int, sink: SocketSink) -> Callable[..., None]:
    """``send_request`` that sends the first ``keep`` request starts and drops the later ones (counted), as a
    full socket would: the test-only fault of ``DROP_STARTS_AFTER_ENV``."""
    left = [keep]

    def send_request(data: bytes, now: float | None = None) -> None:
        if len(data) > 1 and data[0] == records.TAG and data[1] == records.START:
            if left[0] <= 0:
                sink.requests_dropped += 1
                return
            left[0] -= 1
        send(data, now)

    return send_request


# a connected peer that closed: ECONNREFUSED once, ENOTCONN after (Linux); its file removed: ENOENT
_GONE = frozenset((errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOENT))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class StepReceiver:
    """Frontend side: this process's socket in the step directory and the rings EngineCores handed
    over it, drained before each batch of outputs is processed."""

    MAX_RINGS = 16
    MAX_DATAGRAM = 1 << 20  # the largest record read off the socket (a longer one arrives truncated: malformed)

    def __init__(self, directory: str, guard: Guard | None = None) -> None:
        # the instrumentor's: a bad record is counted there, and the EngineCores' relayed errors are added to it
        self.guard = guard = guard if guard is not None else Guard()
        self.path = os.path.join(directory, f"{os.getpid()}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            pass
        try:
            os.unlink(self.path)  # a stale one of a dead process that had our pid
        except OSError:
            pass
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.malformed = 0  # datagrams refused: another wire version or size (step_wire.WireError), bad rings
        self.failed = 0  # records decoded but not taken (a bug of ours downstream)
        # whether the EngineCores' request records (agent/records.py) are delivered with the steps: the agent's
        # receiver only (a Python frontend's requests come from its own hooks)
        self.take_requests = False
        self.rings: dict[int, shm_ring.RingReader] = {}  # EngineCore pid -> its ring (shm_ring)
        self._lock = threading.Lock()
        self.engine_errors = engine_errors.ErrorRelay(guard)  # the EngineCores' error counts (control records)
        self._ids = step_wire.reader_cache()  # the socket's last record's ids (step_wire.decode's; rings keep their own)
        # One receive buffer for the life of the receiver: ``recvmsg(1 << 20)`` allocated (and, above
        # malloc's mmap threshold, mapped and unmapped) a megabyte on every drain, empty socket included.
        self._view = memoryview(bytearray(self.MAX_DATAGRAM))
        self._into = [self._view]
        # Whether anything waits on the socket, asked before reading it: once a ring is attached the socket
        # is empty at nearly every drain, and an empty ``recvmsg_into`` raises BlockingIOError (the
        # exception's errno and message built each time); ``poll(0)`` answers with an empty list. On the
        # real engine the output thread runs cache-cold after each wait, where that raise was a large part
        # of an empty drain. A plain poll object: no kernel state, nothing to close, and it works the same
        # after a fork.
        self._poll = select.poll()
        self._poll.register(self.sock.fileno(), select.POLLIN)

    def drain(self, deliver: Callable[[StepRecord], None]) -> None:
        """Every record that arrived: the socket's datagrams (and ring announcements), then the rings.
        One drain at a time (a ring has one reader: two threads would read a record twice)."""
        with self._lock:
            self._drain(deliver)

    def _drain(self, deliver: Callable[[StepRecord], None]) -> None:
        if self._poll.poll(0):  # readable, or an error / hang-up to find out about: read until it would block
            self._receive(deliver)
        fast = step_wire.ring_read  # the C accelerator's read (None: none; it answers None: Python decides)
        for ring in self.rings.values():
            try:
                records = fast(ring) if fast is not None else None
                if records is None:
                    records = ring.read()
            except shm_ring.RingError as exc:
                self.malformed += 1
                self.guard.failed("step ring", exc)
                records = exc.args[1]
            ids = ring.ids
            for data in records:
                if data[:1] == _TAG:  # an EngineCore's request records, in order with its steps
                    if data[1:2] == _BATCH:
                        self._batch(data, deliver)
                    else:
                        self._request(data, deliver)
                else:
                    self._take(data, deliver, ids)

    def _receive(self, deliver: Callable[[StepRecord], None]) -> None:
        """The socket's datagrams: records (where no ring is), ring announcements, the sink's empty probes."""
        recvmsg_into, take, into, view = self.sock.recvmsg_into, self._take, self._into, self._view
        while True:
            try:
                n, ancillary, _, _ = recvmsg_into(into, shm_ring.FDS_SPACE)
            except (BlockingIOError, OSError):
                break
            data = view[:n].tobytes()
            if ancillary:
                self._add_ring(data, ancillary)
            elif data:  # empty: the sink's probe
                if data[0] == engine_errors.CONTROL:
                    self._control(data)
                elif data[0] == records.TAG:
                    if data[1:2] == _BATCH:
                        self._batch(data, deliver)
                    else:
                        self._request(data, deliver)
                else:
                    take(data, deliver)

    def _batch(self, data: bytes, deliver: Callable[[Any], None]) -> None:
        """A batch datagram (records.unbatch: bounded): request records, and step records a full socket held
        back (SocketSink._put), each taken in the order sent. Anything else in it (a batch, a control record)
        is refused, counted."""
        try:
            items = records.unbatch(data)
        except records.RecordError as exc:
            self.malformed += 1
            self.guard.failed("request record", exc)
            return
        for item in items:
            head = item[:1]
            if head == _TAG:
                if item[1:2] == _BATCH:
                    self.malformed += 1
                    self.guard.failed("request record", records.RecordError("a batch inside a batch"))
                else:
                    self._request(item, deliver)
            elif not item or item[0] == engine_errors.CONTROL:
                self.malformed += 1
                self.guard.failed("step record wire", step_wire.WireError("an empty or control record in a batch"))
            else:
                self._take(item, deliver)

    def _request(self, data: bytes, deliver: Callable[[Any], None]) -> None:
        """An EngineCore's request record (those of a batch come through ``_batch``): delivered where this
        receiver takes them (the agent's, whose EngineCores are their requests' source), else skipped."""
        if not self.take_requests:
            return
        try:
            got = [records.decode(data)]
        except records.RecordError as exc:
            self.malformed += 1
            self.guard.failed("request record", exc)
            return
        for record in got:
            try:
                deliver(record)
            except Exception as exc:
                self.failed += 1
                self.guard.failed("request record", exc)

    def _control(self, data: bytes) -> None:
        try:
            self.engine_errors.take(data)
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            self.malformed += 1
            self.guard.failed("step control record", exc)

    def _take(self, data: bytes, deliver: Callable[[StepRecord], None], ids: list | None = None) -> None:
        """One record decoded (with the cache of the ring it came from, else the socket's) and delivered."""
        try:
            step = step_wire.decode(data, self._ids if ids is None else ids)
        except (step_wire.WireError, struct.error, UnicodeDecodeError) as exc:
            self.malformed += 1
            self.guard.failed("step record wire", exc)
            return
        try:
            deliver(step)
        except Exception as exc:
            self.failed += 1
            self.guard.failed("step record", exc)

    def _add_ring(self, data: bytes, ancillary: list) -> None:
        """An EngineCore's ring (shm_ring): mapped, its descriptor closed. A newer one of the same
        EngineCore process (it reconnected) replaces the older; at most MAX_RINGS are kept."""
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
        try:
            if len(fds) != 1:
                raise shm_ring.RingError(f"ring announcement with {len(fds)} descriptors")
            ring = shm_ring.RingReader(data, fds[0])
        except (shm_ring.RingError, OSError, ValueError) as exc:
            self.malformed += 1
            self.guard.failed("step ring", exc)
            return
        finally:
            for fd in fds:
                os.close(fd)
        old = self.rings.pop(ring.writer_pid, None)
        if old is not None:
            old.close()
        while len(self.rings) >= self.MAX_RINGS:  # EngineCores that came and went: the oldest goes
            self.rings.pop(next(iter(self.rings))).close()
        self.rings[ring.writer_pid] = ring

    def close(self) -> None:
        try:
            self._poll.unregister(self.sock.fileno())  # its number may be reused once closed
        except (KeyError, ValueError, OSError):
            pass  # closed already
        self.sock.close()
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class StepDir(NamedTuple):
    """This process's step directory, and whether it made it (then it removes it at exit, when empty)."""

    path: str
    made: bool


def open_step_dir() -> StepDir:
    """This process's step directory, named in ``OTEL_LLM_STEP_DIR`` for the EngineCores it spawns. Its
    owner (the instrumentor) opens it once and keeps it.

    An API server process vLLM spawned (``ApiServer_<n>``) joins the directory of the process that
    spawned it, and with it that process's EngineCore; any other process makes its own (an inherited
    variable there names some parent's, e.g. the test process that started a server)."""
    inherited = os.environ.get(STEP_DIR_ENV)
    if inherited and in_api_server_process() and os.path.isdir(inherited):
        return StepDir(inherited, made=False)
    made = tempfile.mkdtemp(prefix="otel-llm-steps-")
    os.environ[STEP_DIR_ENV] = made
    return StepDir(made, made=True)


def remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # sockets of other frontends still in it: the last one out removes it, or the OS's tmp cleanup

