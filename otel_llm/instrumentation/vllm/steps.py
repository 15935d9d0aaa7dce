"""Engine steps as vLLM's scheduler sees them, shipped to the frontend that owns the requests.

The scheduler lives in the EngineCore process (its own process by default, or the
caller's with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Our ``vllm.general_plugins`` entry
point installs two hooks there: ``Scheduler.schedule`` (batch composition, captured
at schedule time, as vLLM's maintainers advise for async scheduling) and
``Scheduler.update_from_output`` (the step's end: the same stamp vLLM gives its
outputs). Each step becomes one small record:

* in-process, handed straight to the frontend's ``Pipeline``;
* across processes, one datagram (step_wire.py: a fixed struct layout) per frontend on Unix
  sockets in a directory that the
  first frontend created and named in ``OTEL_LLM_STEP_DIR`` before the engine was spawned.
  Every frontend process that builds an engine client binds ``<dir>/<pid>.sock`` there:
  with ``vllm serve --api-server-count N`` the N API server processes share one EngineCore
  and each gets every step (each keeps the shares of its own requests). Sends never block:
  if a frontend lags and its socket buffer is full, the record is dropped and counted.

The datagram is sent before the step's outputs leave the EngineCore, so the frontend
always holds a step's record before it sees the step's tokens.
"""

from __future__ import annotations

import array
import atexit
import errno
import itertools
import multiprocessing
import logging
import os
import select
import socket
import struct
import tempfile
import threading
import time
from typing import Any, Callable

from ...core.guard import GUARD
from ...core.spec_decode import SpecStep
from ...core.timeline import (BLOCKED_KV_CACHE, BLOCKED_MAX_SEQS, BLOCKED_NONE, BLOCKED_OTHER,
                               BLOCKED_TOKEN_BUDGET, StepRecord)
from ..wraps import Target, WrapTable
from . import step_ring, step_wire
from .step_extras import active_loras, share_positions, spec_counts
from .step_wire import Extras

_NO_SPEC = ((), (), ())

STEP_DIR_ENV = "OTEL_LLM_STEP_DIR"
logger = logging.getLogger("otel_llm")



class SocketSink:
    """EngineCore side: each step's record to every frontend socket in ``directory``.

    One socket per frontend, connected once (at the rescan that found it). Where the platform allows
    (step_ring.AVAILABLE), the socket only hands the frontend a shared-memory ring, into which every
    record is then copied with no syscall; the socket is probed once per rescan to notice a frontend
    that died. Elsewhere one non-blocking datagram a step (a ``send`` on a connected socket skips the
    path lookup a ``sendto`` makes in the kernel every step)."""

    RESCAN_S = 1.0  # API servers start after the engine: look for new frontends this often
    RING = step_ring.AVAILABLE
    RING_CAPACITY = step_ring.CAPACITY

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.dropped = 0
        # the last step's request ids, their encoding, and the step id of the last record that every
        # frontend got (step_wire.encode: the next record leaves the ids out when they are the same):
        # None after anything that may have kept a record from a frontend, and while any frontend takes
        # datagrams (one socket may hear several EngineCores: its reader keeps one cache for all)
        self._ids: list = [None, b"", None]
        self._targets: list[tuple[str, socket.socket, step_ring.RingWriter | None]] = []
        self._writes: tuple | None = ()  # each target's RingWriter.write, when every target has a ring (else None)
        self._rings: tuple = ()  # the same targets' RingWriters (for step_wire.encode_into_rings)
        # step_wire's choice: the C accelerator (encode and ring writes in one call) or the pure-Python path
        self._encode, self._into_rings = step_wire.encode, step_wire.encode_into_rings
        self._scanned = float("-inf")

    def __call__(self, payload: tuple) -> None:
        # the step's start (payload[1]) is the hooks' clock, time.monotonic: no clock read of our own
        if payload[1] - self._scanned > self.RESCAN_S:
            self._rescan(payload[1])
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
            data = self._encode(payload, self._ids)
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
        for path, sock, ring in self._targets:
            if ring is not None:
                if not ring.write(data):
                    self.dropped += 1  # that frontend lags: its ring is full
                    self._resync()  # it missed this record: the next one lists its ids
                continue
            try:
                sock.send(data)
            except OSError as exc:
                self.dropped += 1  # lagging (buffer full) or unreachable: telemetry is what we lose
                if exc.errno in _GONE:  # that frontend is gone: forget it (and its stale socket file)
                    self._forget(path)

    def _rescan(self, now: float) -> None:
        self._scanned = now
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
        for sock, ring in known.values():  # their files are gone (the frontend closed)
            if ring is not None:
                self.dropped += ring.unread()
            self._close(sock, ring)
        self._targets = targets
        self._resync()  # a new frontend has read nothing yet (once a second: one record with its ids)

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
                ring = step_ring.RingWriter(self.RING_CAPACITY)
            except OSError as exc:
                GUARD.failed("step ring", exc)
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
            self._close(sock, ring)
            target = self._connect(path, forget_stale=False)
            if target is not None:
                targets.append((path, *target))
        self._targets = targets
        self._resync()

    def _resync(self) -> None:
        """The next record lists its request ids (step_wire: SAME_IDS), after anything that may have kept
        a record from a frontend. The records after it leave them out while they repeat, but only where
        every frontend reads a ring of its own (the cache's third item): a datagram socket may hear several
        EngineCores, interleaved, through one reader's cache."""
        ids, joined = self._ids[0], self._ids[1]
        rings = all(ring is not None for _, _, ring in self._targets)
        self._ids = [ids, joined, None] if rings else [ids, joined]
        self._writes = tuple(ring.write for _, _, ring in self._targets) if rings else None
        self._rings = tuple(ring for _, _, ring in self._targets) if rings else ()

    @staticmethod
    def _close(sock: socket.socket, ring: step_ring.RingWriter | None) -> None:
        sock.close()
        if ring is not None:
            ring.close()

    def close(self) -> None:
        for _, sock, ring in self._targets:
            self._close(sock, ring)
        self._targets = []
        self._writes = ()
        self._rings = ()


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

    def __init__(self, directory: str) -> None:
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
        self.rings: dict[int, step_ring.RingReader] = {}  # EngineCore pid -> its ring (step_ring)
        self._lock = threading.Lock()
        self._ids: list = [None, None, None]  # the socket's last record's ids (step_wire.decode's cache; rings keep their own)
        # One receive buffer for the life of the receiver: ``recvmsg(1 << 20)`` allocated (and, above
        # malloc's mmap threshold, mapped and unmapped) a megabyte on every drain, empty socket included.
        self._view = memoryview(bytearray(self.MAX_DATAGRAM))
        self._into = [self._view]
        # Whether anything waits on the socket, asked before reading it: once a ring is attached the socket
        # is empty at nearly every drain, and an empty ``recvmsg_into`` raises BlockingIOError (the
        # exception's errno and message built each time); ``poll(0)`` answers with an empty list.
        # (benchmarks/drain_probe.py: on the real engine, whose output thread runs cache-cold after each
        # wait, the raising receive was ~35 µs of a ~110 µs drain.) A plain poll object: no kernel state,
        # nothing to close, and it works the same after a fork.
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
            except step_ring.RingError as exc:
                self.malformed += 1
                GUARD.failed("step ring", exc)
                records = exc.args[1]
            ids = ring.ids
            for data in records:
                self._take(data, deliver, ids)

    def _receive(self, deliver: Callable[[StepRecord], None]) -> None:
        """The socket's datagrams: records (where no ring is), ring announcements, the sink's empty probes."""
        recvmsg_into, take, into, view = self.sock.recvmsg_into, self._take, self._into, self._view
        while True:
            try:
                n, ancillary, _, _ = recvmsg_into(into, step_ring.FDS_SPACE)
            except (BlockingIOError, OSError):
                break
            data = view[:n].tobytes()
            if ancillary:
                self._add_ring(data, ancillary)
            elif data:  # empty: the sink's probe
                take(data, deliver)

    def _take(self, data: bytes, deliver: Callable[[StepRecord], None], ids: list | None = None) -> None:
        """One record decoded (with the cache of the ring it came from, else the socket's) and delivered."""
        try:
            step = step_wire.decode(data, self._ids if ids is None else ids)
        except (step_wire.WireError, struct.error, UnicodeDecodeError) as exc:
            self.malformed += 1
            GUARD.failed("step record wire", exc)
            return
        try:
            deliver(step)
        except Exception as exc:
            self.failed += 1
            GUARD.failed("step record", exc)

    def _add_ring(self, data: bytes, ancillary: list) -> None:
        """An EngineCore's ring (step_ring): mapped, its descriptor closed. A newer one of the same
        EngineCore process (it reconnected) replaces the older; at most MAX_RINGS are kept."""
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
        try:
            if len(fds) != 1:
                raise step_ring.RingError(f"ring announcement with {len(fds)} descriptors")
            ring = step_ring.RingReader(data, fds[0])
        except (step_ring.RingError, OSError, ValueError) as exc:
            self.malformed += 1
            GUARD.failed("step ring", exc)
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


def decode(payload: tuple) -> StepRecord:
    """A step record from the hook's tuple (in-process; across processes see step_wire). The first eight
    fields are the original layout (an EngineCore of an older otel-llm still decodes: 3-field shares); then
    why waiting requests stayed waiting (``queue_blocked``), then the anatomy. The shares are a list of
    (id, tokens, prefill[, context]) tuples in the older layouts, vLLM's own lists (``step_wire.Shares``) in
    this one: prefill flags and contexts derived as the wire's decoder derives them."""
    step_id, start, end, running, waiting, preempted, kv, shares = payload[:8]
    blocked = payload[8] if len(payload) > 8 else 0
    if len(payload) < 14:
        return StepRecord(step_id, start, end, shares, running, waiting, preempted, kv, queue_blocked=blocked)
    if shares.__class__ is tuple:  # vLLM's lists, kept as lists (StepRecord.of_lists: no tuple per share)
        ids, tokens, computed, no_output_at, prompt_at, prompt_len, outputs = shares
        contexts = list(computed)
        step = StepRecord.of_lists(step_id, start, end, list(ids), list(tokens) if tokens is not None else None,
                                   step_wire.derive_prefill(len(ids), contexts, no_output_at, prompt_at,
                                                            prompt_len, outputs),
                                   running, waiting, preempted, kv, queue_blocked=blocked)
    else:
        step = StepRecord(step_id, start, end, [s[:3] for s in shares], running, waiting, preempted, kv,
                          queue_blocked=blocked)
        contexts = [s[3] for s in shares]
    step.contexts = contexts
    step.schedule_s, step.execute_s, step.output_s, step.idle_s, step.model_s = payload[9:14]
    if len(payload) > 14:  # the extras (step_wire.Extras): speculative drafts, LoRA adapters
        spec_at, drafted, accepted, loras = payload[14]
        if spec_at:
            step.spec = SpecStep(list(spec_at), list(drafted), list(accepted))
        step.loras = tuple(loras) if loras else None
    return step


_dir: str | None = None


def step_dir() -> str:
    """This process's step directory, named in ``OTEL_LLM_STEP_DIR`` for the EngineCores it spawns.

    An API server process vLLM spawned (``ApiServer_<n>``) joins the directory of the process that
    spawned it, and with it that process's EngineCore; any other process makes its own (an inherited
    variable there names some parent's, e.g. the test process that started a server)."""
    global _dir
    if _dir is None:
        inherited = os.environ.get(STEP_DIR_ENV)
        if inherited and in_api_server_process() and os.path.isdir(inherited):
            _dir = inherited
        else:
            _dir = tempfile.mkdtemp(prefix="otel-llm-steps-")
            os.environ[STEP_DIR_ENV] = _dir
            atexit.register(_remove_if_empty, _dir)
    return _dir


def open_receiver() -> StepReceiver:
    """This process's socket in the step directory (``<pid>.sock``), closed at exit. The caller keeps
    it for as long as an EngineCore may send to it: see ``VLLMInstrumentor.step_receiver``."""
    receiver = StepReceiver(step_dir())
    atexit.register(receiver.close)
    return receiver


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # sockets of other frontends still in it: the last one out removes it, or the OS's tmp cleanup


# -- the scheduler hooks (whichever process the scheduler runs in) ---------------------------
#
# Step anatomy from four stamps the EngineCore thread takes anyway: scheduler entered (t0) and left
# (t1), update_from_output entered (u0), the outputs' own timestamp (end, else u1 = left). Then
#   schedule = t1 - t0, execute = u0 - t1, output = end - u0: they sum to end - t0, the step.
#   idle gap = t0 - the previous step's u1, when no other step was in flight (else 0: with vLLM's
#   batch queue the next batch is scheduled while one runs, and the device was not starved).
# model_s: forward + sampling timed around the model runner where it runs (below); CUDA events on
# a GPU, wall time on CPU.
#
# The model runner runs in the EngineCore process (UniProcExecutor) or in worker processes
# (MultiprocExecutor: vLLM's default on CPU, and with tensor parallelism). Either way the time of a
# step's forward + sampling is attached to the ModelRunnerOutput it returns, as one attribute: the
# object is pickled to the EngineCore (its __dict__ travels with it) and handed to
# update_from_output, where the step record picks it up. An asynchronous output (vLLM's async
# scheduling) is resolved later: in-process its time waits in ``model`` under the step's key.

_MODEL_TIME_ATTR = "_otel_llm_model_s"
_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
_NONE: tuple = ()  # no share without output / with a prompt entry (a steady decode batch): nothing allocated
_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"  # the CPU model runner inherits both methods


class StepHooks:
    """The scheduler and model-runner hooks of one owner, with the state they keep between calls.

    The owner arms them: ``VLLMInstrumentor`` for an engine in its own process (the sink hands the
    record to its pipeline), ``plugin()`` in a spawned EngineCore (a ``SocketSink``) or in a
    multiprocess executor's worker (model timing only). The bound methods are the wrapt wrappers:
    the hot path reads this object's attributes, nothing module-wide."""

    __slots__ = ("sink", "timing", "pending", "model", "counter", "prefix", "last_end", "current_model_step",
                 "cuda_events", "event_pool", "clock", "recompute", "_table")

    def __init__(self) -> None:
        self.sink: Callable[[tuple], None] | None = None
        self.timing = False  # model runner hooks on: in the EngineCore (with a sink) or in a worker (plugin)
        self.pending: dict[int, tuple] = {}  # id(scheduler_output) -> what schedule() saw
        self.model: dict[int, Any] = {}  # id(scheduler_output) -> seconds (CPU) or [(start, end) CUDA events]
        self.counter = itertools.count(1)
        self.prefix = 0
        self.last_end: float | None = None  # u1 of the last step that carried work
        self.current_model_step = 0  # id of the scheduler output whose forward ran last (sample_tokens follows)
        self.cuda_events: Any = None  # torch.cuda.Event once a CUDA model runner was seen; False: CPU
        self.event_pool: list[Any] = []  # read CUDA events, reused (creating them costs more than recording)
        self.clock: Callable[[], float] = time.monotonic
        self.recompute: dict[str, int] = {}  # request id -> prompt length, while it recomputes after a preemption
        self._table = WrapTable([
            # plain: called on every step in the EngineCore's loop, wrapt's call costs more (wraps.Target)
            Target(_SCHEDULER_MODULE, "Scheduler.schedule", self.schedule, plain=True),
            Target(_SCHEDULER_MODULE, "Scheduler.update_from_output", self.update_from_output, plain=True),
            Target(_RUNNER_MODULE, "GPUModelRunner.execute_model", self.execute_model, plain=True),
            Target(_RUNNER_MODULE, "GPUModelRunner.sample_tokens", self.sample_tokens, plain=True),
        ])

    def arm(self, sink: Callable[[tuple], None]) -> None:
        """Report every step to ``sink`` (and time the model runner, where it runs in this process)."""
        self.sink = sink
        self.timing = True
        self.cuda_events = None  # decided again at the next model runner's first call (a new engine may differ)
        self.prefix = os.getpid() << 32  # step ids stay unique when several engines report to one frontend
        self.last_end = None
        self._table.wrap()

    def enable_model_timing(self) -> None:
        """Time the model runner in this process (a vLLM worker process; the EngineCore does it with arm)."""
        self.timing = True
        self._table.wrap()

    def disarm(self) -> None:
        self.sink = None
        self.timing = False
        self._table.unwrap()
        self.pending.clear()
        self.model.clear()
        self.recompute.clear()

    def schedule(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if self.sink is None:
            return wrapped(*args, **kwargs)
        clock = self.clock
        start = clock()
        out = wrapped(*args, **kwargs)
        left = clock()
        try:
            shares = self._shares(instance, out)
            preempted = getattr(out, "preempted_req_ids", None)
            kv = instance.kv_cache_manager.usage
            pending = self.pending
            if len(pending) > 64:  # update_from_output never came (engine error): don't grow
                pending.clear()
                self.model.clear()
            running, waiting, n_preempted = len(instance.running), len(instance.waiting), len(preempted) if preempted else 0
            last_end = self.last_end
            # idle only when nothing was in flight: under the batch queue a batch runs meanwhile
            idle = None if last_end is None else (start - last_end if not pending else 0.0)
            pending[id(out)] = (start, left, idle, running, waiting, n_preempted, float(kv), shares,
                                _queue_blocked(instance, out, running, waiting, n_preempted) if waiting else BLOCKED_NONE,
                                active_loras(instance, shares[0]) if instance.lora_config is not None else None)
        except Exception as exc:
            GUARD.failed("scheduler.schedule hook", exc)
        return out

    def _shares(self, scheduler: Any, out: Any) -> tuple:
        """The step's shares as vLLM's scheduler output lists them (step_wire.Shares), with no Python
        loop over the batch: the frontend derives each share's prefill flag and context from them
        (step_wire.derive_prefill). Python loops run only over this step's new requests, the requests
        recomputing after a preemption and, in a step with a prefill chunk, the output counts: none of
        them in a steady decode batch."""
        cached = out.scheduled_cached_reqs
        ids, computed, outputs = cached.req_ids, cached.num_computed_tokens, cached.num_output_tokens
        recompute = self.recompute
        resumed = cached.resumed_req_ids
        new = out.scheduled_new_reqs
        # no output yet (placeholders count): a prefill chunk. all(): a C-level truth test per count, a
        # third of count(0)'s rich comparisons (~0.4 vs ~1.1 µs at 64); the loop only when there are some
        no_output_at = _NONE if all(outputs) else [i for i, o in enumerate(outputs) if not o]
        if not (resumed or recompute or new):  # no share has a prompt entry (a steady batch): nothing allocated
            if out.total_num_scheduled_tokens == len(ids):
                return ids, None, computed, no_output_at, _NONE, _NONE, _NONE  # one token each
            return ids, self._tokens(out.num_scheduled_tokens, ids), computed, no_output_at, _NONE, _NONE, _NONE
        scheduled = out.num_scheduled_tokens
        prompt_at: list[int] = []
        prompt_len: list[int] = []
        prompt_outputs: list[int] = []
        if resumed:  # back from a preemption: recomputes (a prefill) until all but its last token are computed
            requests = scheduler.requests
            for rid in resumed:
                recompute[rid] = requests[rid].num_prompt_tokens
        if recompute:
            for rid in out.finished_req_ids:
                recompute.pop(rid, None)
            for rid, p in list(recompute.items()):
                try:
                    i = ids.index(rid)
                except ValueError:
                    continue  # not scheduled in this step
                o = outputs[i]
                prompt_at.append(i)
                prompt_len.append(p)
                prompt_outputs.append(o)
                if computed[i] + scheduled[rid] >= p + o - 1:
                    del recompute[rid]  # from the next step on it decodes
            if len(recompute) > 4096:  # bounded (requests that vanished unseen): these shares read as decodes
                recompute.clear()
        if new:
            ids, computed = list(ids), list(computed)
            for r in new:
                i = len(ids)
                ids.append(r.req_id)
                computed.append(r.num_computed_tokens)
                p = r.prompt_len
                total = r.prefill_token_ids  # vLLM's v2 model runner: every token, a resumed request's outputs too
                o = len(total) - p if total is not None else 0
                prompt_at.append(i)
                prompt_len.append(p)
                prompt_outputs.append(o)
                if o:
                    recompute[r.req_id] = p
        # one token each (every scheduled request has at least one): a plain decode batch
        tokens = None if out.total_num_scheduled_tokens == len(ids) else self._tokens(scheduled, ids)
        return ids, tokens, computed, no_output_at, prompt_at, prompt_len, prompt_outputs

    @staticmethod
    def _tokens(scheduled: dict, ids: list) -> list[int]:
        if list(scheduled) == ids:  # vLLM's dict in the lists' order (no new or resumed request in between)
            return list(scheduled.values())
        return list(map(scheduled.__getitem__, ids))

    def update_from_output(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        sink = self.sink
        if sink is None:
            return wrapped(*args, **kwargs)
        clock = self.clock
        spec = None
        try:
            if len(args) == 2:  # as vLLM's EngineCore calls it
                scheduler_output, model_output = args
            else:
                scheduler_output = kwargs.get("scheduler_output", args[0] if args else None)
                model_output = kwargs.get("model_runner_output", args[1] if len(args) > 1 else None)
            # speculative drafts (a dict that is empty unless the step verified some), counted before vLLM
            # trims a stopped request's sampled tokens in place (its own counts are taken before that too)
            if scheduler_output.scheduled_spec_decode_tokens:
                spec = spec_counts(instance, scheduler_output, model_output, scheduler_output.num_scheduled_tokens)
        except Exception as exc:
            GUARD.failed("scheduler.update_from_output hook (drafts)", exc)
        entered = clock()
        result = wrapped(*args, **kwargs)
        left = clock()
        try:
            key = id(scheduler_output)
            pending = self.pending.pop(key, None)
            model = getattr(model_output, _MODEL_TIME_ATTR, None)
            if model is None and self.model:
                model = self.model.pop(key, None)
            if pending is not None and pending[7][0]:
                start, scheduled, idle, running, waiting, preempted, kv, shares, blocked, loras = pending
                end = None
                for o in result.values() if result else ():  # the outputs' stamp: any client's, the same
                    end = o.timestamp
                    break
                if not end or end < entered:
                    end = left
                self.last_end = left
                if model is not None and model.__class__ is not float:
                    model = self.cuda_seconds(model)
                payload = (self.prefix | next(self.counter), start, end, running, waiting, preempted, kv, shares,
                           blocked, scheduled - start, entered - scheduled, end - entered, idle, model)
                # speculative drafts and LoRA adapters: a 15th field only in steps that have them
                # (step_wire.Extras; the C encoder takes the rest)
                if spec is not None:
                    spec = share_positions(spec, shares[0])
                if spec is not None or loras is not None:
                    payload += (Extras(*(spec or _NO_SPEC), loras or ()),)
                sink(payload)
        except Exception as exc:
            GUARD.failed("scheduler.update_from_output hook", exc)
        return result

    # -- model execution, timed where it runs ---------------------------------------------------

    def execute_model(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return self._time_model(False, wrapped, instance, args, kwargs)

    def sample_tokens(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return self._time_model(True, wrapped, instance, args, kwargs)

    def _time_model(self, sample: bool, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if not self.timing:
            return wrapped(*args, **kwargs)
        if self.cuda_events is None:
            self._pick_timer(instance)
            if not self.timing:
                return wrapped(*args, **kwargs)
        model = self.model
        if sample:
            key = self.current_model_step
        else:
            key = self.current_model_step = id(args[0] if args else kwargs.get("scheduler_output"))
            if len(model) > 64:  # outputs that never reached update_from_output (errors): don't grow
                model.clear()
        if self.cuda_events:
            out = self._time_cuda(key, wrapped, args, kwargs)
        else:
            clock = self.clock
            t = clock()
            try:
                out = wrapped(*args, **kwargs)
            finally:
                spent = clock() - t
                model[key] = model.get(key, 0.0) + spent
        if out is None:
            return out
        try:
            if getattr(out, "req_ids", None) and hasattr(out, "__dict__"):
                spent = model.pop(key, None)  # a ModelRunnerOutput with requests: this step's, done
                if spent is not None and spent.__class__ is not float:
                    spent = self.cuda_seconds(spent)
                if spent is not None:
                    setattr(out, _MODEL_TIME_ATTR, spent)
        except Exception as exc:
            GUARD.failed("model runner timer", exc)
        return out

    def _pick_timer(self, runner: Any) -> None:
        """CUDA events where the runner's device is a CUDA device, wall time otherwise; decided once.
        A CPU model runner in the EngineCore's own thread (UniProcExecutor) is not timed: the step's
        execute time is the same wall time there, and the EngineCore's loop is spared the timers."""
        try:
            device = getattr(runner, "device", None)
            if getattr(device, "type", None) == "cuda":
                import torch
                self.cuda_events = torch.cuda.Event
            else:
                self.cuda_events = False
                if self.sink is not None:
                    self.timing = False
        except Exception as exc:
            self.cuda_events = False
            GUARD.failed("model timer", exc)

    def _time_cuda(self, key: int, wrapped: Any, args: tuple, kwargs: dict) -> Any:
        """Events on the current stream around the call: the device's time for it. They are read once
        the step's sampled tokens reached the host (a synchronising copy), so reading never waits."""
        pool, make = self.event_pool, self.cuda_events
        begin = pool.pop() if pool else make(enable_timing=True)
        begin.record()
        try:
            return wrapped(*args, **kwargs)
        finally:
            finish = pool.pop() if pool else make(enable_timing=True)
            finish.record()
            events = self.model.get(key)
            if events is None or events.__class__ is float:
                self.model[key] = events = []
            events.append((begin, finish))

    def cuda_seconds(self, events: list) -> float | None:
        total = 0.0
        for begin, finish in events:
            if not finish.query():  # not done yet: report nothing rather than wait (and drop these events)
                return None
            total += begin.elapsed_time(finish) / 1e3
        if len(self.event_pool) < 64:  # read: reusable
            for pair in events:
                self.event_pool.extend(pair)
        return total


def _queue_blocked(scheduler: Any, out: Any, running: int, waiting: int, preempted: int) -> int:
    """Why requests stayed waiting after this ``schedule()``: the first limit its admission loop hits
    (vLLM 0.32 ``Scheduler.schedule``), read from the scheduler's state right after it ran."""
    if preempted:
        return BLOCKED_KV_CACHE  # a step that preempts admits nobody: the running requests outgrew the KV cache
    if running >= getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs):
        return BLOCKED_MAX_SEQS
    if out.total_num_scheduled_tokens >= scheduler.max_num_scheduled_tokens:
        return BLOCKED_TOKEN_BUDGET
    try:
        head = scheduler.waiting.peek_request()
        # admission needs the head's whole remaining sequence in free blocks (scheduler_reserve_full_isl)
        need = -(-(head.num_tokens - head.num_computed_tokens) // scheduler.block_size)
        if need > scheduler.kv_cache_manager.block_pool.get_num_free_blocks():
            return BLOCKED_KV_CACHE
    except (AttributeError, IndexError):  # another vLLM's internals: the step record is worth more than this
        pass
    return BLOCKED_OTHER  # a limit we do not model (LoRA slots, remote KV, grammar, encoder budget)


def in_api_server_process() -> bool:
    """Whether this is one of the API server processes of ``vllm serve --api-server-count N``."""
    return multiprocessing.current_process().name.startswith("ApiServer")


def in_engine_process() -> bool:
    """Whether this is an EngineCore process vLLM spawned (``EngineCore``, ``EngineCore_DP<n>``)."""
    return multiprocessing.current_process().name.startswith("EngineCore")


def in_worker_process() -> bool:
    """Whether this is a worker process of vLLM's multiprocess executor (``VllmWorker-<rank>``)."""
    return multiprocessing.current_process().name.startswith("VllmWorker")


def plugin() -> None:
    """``vllm.general_plugins`` entry point: runs in every vLLM process, first thing in EngineCore.

    Only a spawned EngineCore reports, to the frontends of the directory it inherited. A
    frontend, and an engine running inside it, is fed by ``instrument()`` directly.
    """
    global _plugin_hooks
    directory = os.environ.get(STEP_DIR_ENV)
    if not directory or _plugin_hooks is not None:
        return
    try:
        if in_engine_process():
            _plugin_hooks = StepHooks()
            # the bound method: calling it skips the instance-call slot lookup, once a step
            _plugin_hooks.arm(SocketSink(directory).__call__)
        elif in_worker_process():  # the model runs here (multiprocess executor): time it
            _plugin_hooks = StepHooks()
            _plugin_hooks.enable_model_timing()
    except Exception as exc:
        GUARD.failed("vllm plugin", exc)


# The plugin's hooks: armed once in a spawned EngineCore or worker, for the life of that process
# (vLLM calls the plugin once per process; there is no instrumentor there to own them).
_plugin_hooks: StepHooks | None = None
