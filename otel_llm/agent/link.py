"""The frontend's side of its agent: start it, send it a request's start and finish, ask it to flush.

What the frontend pays a request with the agent: framing two small records (agent/protocol.py) and copying
each into a shared-memory ring the agent reads at a tick (otel_llm/shm_ring.py): no system call, and the GIL
is never let go, so vLLM's other threads are not switched in. (A ``send`` on the ``SOCK_SEQPACKET`` socket,
which the platforms without the ring still use, is a system call on vLLM's output thread that lets the GIL
go: benchmarks/engine_step_hooks.py measures the two channels.) Nothing per token, nothing per step: the
agent reads the engine's step ring itself.

Never hurts the host:

* a full ring or socket (the agent is slow or stopped) refuses the message whole: counted
  (``agent_dropped``), the frontend goes on; a finish whose start was refused is settled as an untracked
  request there (metrics only), and one whose finish was refused is lost, counted here;
* a dead agent (killed, crashed) is noticed by a write at most ``CHECK_S`` after the last check (a ring
  write cannot tell: the check asks the kernel) or when the ring is full, at the next send (``EPIPE``)
  without a ring, or at a ``flush``: counted (``agent_lost``, with what it left unread in its ring), and
  a new one started (on a thread of its own), at most once per ``RESTART_S``; it binds the step socket
  again and the EngineCore's sink finds it at its next rescan (once a second);
* an agent that does not answer a ``flush`` or ``stats`` within the timeout costs that answer only.

The agent is started with ``sys.executable -m <the adapter's agent module>``, with ``OTEL_LLM_AGENT=off`` and
without ``opentelemetry-instrument``'s ``sitecustomize`` on its path: it never instruments itself
and never starts an agent of its own. It dies with its parent (the socket's end-of-file, or its parent
changing: process.py).
"""

from __future__ import annotations

import errno
import itertools
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .. import shm_ring
from ..guard import Guard
from . import control, protocol

if TYPE_CHECKING:
    from ..core.diagnosis.anatomy import EngineFacts

RESTART_S = 5.0
CONTROL_S = 5.0  # the longest wait for room for a control message (never on the hot path)
_GONE = frozenset((errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF))  # a send that says: no agent
READY_S = 60.0  # an agent's start on a loaded machine: the interpreter, the SDK and the exporters' imports
SEND_BUFFER = 4 << 20
AGENT_ENV = "OTEL_LLM_AGENT"
# the engine client (vLLM's ``client_index``: one per API server) this agent serves, set by the frontend before it
# starts its agent: where several API servers share the engines, every engine record reaches every agent, and
# each keeps the enriched requests of its own (agent/process.py)
CLIENT_ENV = "OTEL_LLM_AGENT_CLIENT"
_KERNEL_PACKET_SLACK = 64  # af_unix refuses a packet longer than the send buffer less 32 bytes: a margin on it
USE_RING = shm_ring.AVAILABLE  # messages through a shared-memory ring (its capacity: SEND_BUFFER), else packets
CHECK_S = 1.0  # the longest a ring's writes go on without asking whether the agent lives
_ROOM_S = 0.01  # how often a control message waiting for room in a full ring tries again


class AgentLink:
    """``module``: the engine adapter's agent entry (``python -m module FD``), which gives the agent its
    reader of the engine's step records."""

    def __init__(self, guard: Guard, module: str) -> None:
        self.guard = guard
        self.module = module
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.dropped = 0  # messages the socket refused (full)
        self.lost = 0  # messages a dead agent did not get
        self.restarts = 0
        self.oversized = 0
        # the longest message this socket takes: MAX_PACKET, or less where net.core.wmem_max caps the send
        # buffer (the kernel refuses a packet over the buffer whole; Linux's default caps it at ~416 KiB)
        self.max_packet = protocol.MAX_PACKET
        self._last_start = 0.0
        self._restarting = False
        self._last_stats: tuple[float, Any] = (float("-inf"), None)  # (when, the agent's last STATS answer)
        self._replies = threading.Lock()  # one request/reply exchange at a time
        self._tokens = itertools.count(1)
        self._config: bytes | None = None  # re-sent to a restarted agent
        self._engines: list[EngineFacts] = []  # (each re-sent to a restarted agent)
        # the agent's ring (USE_RING), written under the lock: the hot path's thread, and control messages
        # from any thread (a ring has one writer at a time)
        self.ring: shm_ring.RingWriter | None = None
        self._writing = threading.Lock()
        self._checked = 0.0  # when a ring's write last asked whether the agent lives
        self._watching: threading.Event | None = None  # set to stop the watch thread (watch())

    # -- life --------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Start an agent and wait until it is up; False (and counted) if it did not come up."""
        self._last_start = time.monotonic()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            parent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        except OSError:
            pass
        try:  # the kernel's check (af_unix): a packet over the buffer less 32 bytes is EMSGSIZE
            self.max_packet = min(protocol.MAX_PACKET,
                                  parent.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - _KERNEL_PACKET_SLACK)
        except OSError:
            pass
        env = dict(os.environ)
        env[AGENT_ENV] = "off"
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not p.rstrip("/").endswith(
            "auto_instrumentation")]
        env["PYTHONPATH"] = os.pathsep.join(path)
        try:
            proc = subprocess.Popen([sys.executable, "-m", self.module, str(child.fileno())],
                                    pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                    close_fds=True)
        except OSError as exc:
            parent.close()
            child.close()
            self.guard.failed("agent start", exc)
            return False
        child.close()
        parent.settimeout(READY_S)
        try:
            ready = control.decode(parent.recv(protocol.MAX_PACKET))
            if type(ready) is not control.ReadyRecord:
                raise ValueError(f"agent said {type(ready).__name__} first")
        except Exception as exc:
            return self._abandon(parent, proc, None, exc)
        ring = None
        try:  # the channel every later message takes: a ring, or the socket itself (RING None)
            if USE_RING:
                ring = shm_ring.RingWriter(SEND_BUFFER, name="otel-llm-agent")
                ring.announce(parent, control.encode(control.RingRecord(ring.announcement())))
            else:
                parent.send(control.encode(control.RingRecord(None)))
        except OSError as exc:
            return self._abandon(parent, proc, ring, exc)
        if ring is not None:  # a message must fit the ring with room for others (the agent reads at a tick)
            self.max_packet = min(protocol.MAX_PACKET, ring.cap // 4)
        parent.setblocking(False)
        try:  # its options before any request (a restarted agent's too): what comes first is not discarded
            engines = [control.engine_message(facts) for facts in self._engines]
            for data in ([self._config] if self._config is not None else []) + engines:
                self._put(parent, ring, data, time.monotonic() + CONTROL_S)
        except OSError as exc:
            return self._abandon(parent, proc, ring, exc)
        self._checked = time.monotonic()
        self.ring = ring  # before the socket: whoever sees the socket sees the ring
        self.sock, self.proc, self.pid = parent, proc, proc.pid
        return True

    def _abandon(self, sock: socket.socket, proc: subprocess.Popen, ring: shm_ring.RingWriter | None,
                 exc: BaseException) -> bool:
        """An agent that did not come up: stopped, its channel closed, counted; False (``start``'s answer)."""
        if ring is not None:
            ring.close()
        sock.close()
        _stop(proc)
        self.guard.failed("agent start", exc)
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def watch(self, interval: float = RESTART_S) -> None:
        """Look after the agent from a thread of its own: where nothing is sent per request (the supervisor
        of engines that are their requests' source: docs/design/enginecore-source.md), no write would notice
        its death. Every ``interval`` a dead agent is counted and started again (``_lose``). Until ``close``."""
        if self._watching is not None:
            return
        stop = self._watching = threading.Event()

        def run() -> None:
            while not stop.wait(interval):
                if not self.alive() and not self._restarting:
                    self._lose()
        threading.Thread(target=run, name="otel-llm-agent-watch", daemon=True).start()

    def close(self, timeout: float = 5.0) -> None:
        """The agent sends what it holds and exits (the socket's end-of-file)."""
        if self._watching is not None:
            self._watching.set()
        sock, proc = self.sock, self.proc
        self.sock = self.proc = None
        self._drop_ring()
        if sock is not None:
            sock.close()
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _stop(proc)

    def _drop_ring(self) -> int:
        """Stop writing to the agent's ring: the records it had not read (lost, if it is gone)."""
        with self._writing:
            ring, self.ring = self.ring, None
            if ring is None:
                return 0
            unread = ring.unread()
            ring.close()
            return unread

    # -- messages ----------------------------------------------------------------------------------

    def configure(self, config: protocol.AgentConfig) -> None:
        self._config = control.config_message(config.config, config.destinations)
        self._send(self._config)

    def release(self) -> None:
        """The instrumentation ended: the agent sends what it holds and drops its pipeline (and providers); it
        keeps reading the engine's steps, discarding them, until the next ``configure``."""
        self._config = None
        self._send(control.release_message())

    def engine(self, facts: EngineFacts) -> None:
        """An engine built in the frontend, for the agent's step diagnosis (kept: a restarted agent gets it too)."""
        if facts not in self._engines:  # instrumenting again re-sends the last engine's
            self._engines.append(facts)
        self._send(control.engine_message(facts))

    def send(self, data: bytes) -> None:
        """One message, never blocking (the hot path's: a start, a finish)."""
        ring = self.ring
        if ring is not None:
            now = time.monotonic()
            if now - self._checked >= CHECK_S:  # (a ring write cannot tell a dead agent: the kernel is asked)
                self._checked = now
                if not self.alive():
                    self._lose()
                    return
            with self._writing:
                written = ring is self.ring and ring.write(data)
            if not written:
                if self.alive():
                    self.dropped += 1  # full: the agent is slow or stopped
                else:
                    self._lose()
            return
        sock = self.sock
        if sock is None:
            self._lose()
            return
        try:
            sock.send(data)
        except BlockingIOError:
            self.dropped += 1
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                self.oversized += 1
            elif exc.errno in _GONE:
                self._lose()
            else:  # ENOBUFS and the like: the kernel short of memory, the agent alive
                self.dropped += 1

    def _send(self, data: bytes) -> None:
        """A message the agent must not miss (its options, an engine's facts): waits up to CONTROL_S for
        room; a dead agent gets it again when it is restarted (start re-sends them)."""
        sock = self.sock
        if sock is None:
            return
        try:
            self._put(sock, self.ring, data, time.monotonic() + CONTROL_S)
        except BlockingIOError:
            self.dropped += 1
            self.guard.warn_once("agent control dropped", "otel-llm: the agent process did not take its options "
                                 "within %.0f s; its telemetry may be off until it is restarted", CONTROL_S)
        except OSError as exc:
            if exc.errno in _GONE:
                self._lose()
            else:
                self.dropped += 1

    def _lose(self) -> None:
        """The agent is gone: count the message (and what it left unread in its ring), start another (not more
        often than RESTART_S)."""
        self.lost += 1 + self._drop_ring()
        if self._restarting or time.monotonic() - self._last_start < RESTART_S:
            return
        self._restarting = True
        self._last_start = time.monotonic()
        sock, proc = self.sock, self.proc
        self.sock = self.proc = None
        if sock is not None:
            sock.close()
        # the new agent's start (an interpreter's, ~1 s) on a thread of its own: never on the caller's, which
        # is vLLM's output thread; what is sent meanwhile is counted lost
        threading.Thread(target=self._restart, args=(proc,), name="otel-llm-agent-restart", daemon=True).start()

    def _restart(self, old: subprocess.Popen | None) -> None:
        try:
            if old is not None:
                _stop(old)
            self.restarts += 1
            self.start()
        finally:
            self._restarting = False

    def ask(self, question: Callable[[int], control.FlushRecord | control.StatsRecord],
            timeout: float) -> control.ReplyRecord | None:
        """A request the agent answers (``question(token)``: a flush, stats); None if it did not answer within
        ``timeout``."""
        with self._replies:
            sock = self.sock
            if sock is None or not self.alive():
                if self.sock is not None or self.proc is not None:
                    self._lose()
                return None
            token = next(self._tokens)
            deadline = time.monotonic() + timeout
            # the socket stays non-blocking (the hot path's sends must never wait): the answer is polled for
            poll = select.poll()
            poll.register(sock.fileno(), select.POLLIN)
            try:
                self._put(sock, self.ring, control.encode(question(token)), deadline)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or not poll.poll(left * 1e3):
                        return None
                    data = sock.recv(protocol.MAX_PACKET)
                    if not data:
                        return None
                    reply = control.decode(data)
                    if type(reply) is control.ReplyRecord and reply.token == token:
                        return reply
                    # an answer to an earlier request that timed out: skip it
            except (OSError, ValueError, EOFError):  # (RecordError is a ValueError)
                return None

    def _put(self, sock: socket.socket, ring: shm_ring.RingWriter | None, data: bytes, deadline: float) -> None:
        """A control message through the agent's channel (its ``ring``, then a ``DOORBELL`` on ``sock``; else
        ``sock``), waiting until ``deadline`` for room (raises ``BlockingIOError`` if there was none in time)."""
        if ring is None:
            self._send_by(sock, data, deadline)
            return
        while True:
            with self._writing:
                if ring.mm.closed:  # dropped meanwhile: the agent is gone
                    raise BrokenPipeError(errno.EPIPE, "the agent's ring was dropped")
                if ring.write(data):
                    break
            if time.monotonic() >= deadline:
                raise BlockingIOError(errno.EAGAIN, "the agent's ring stayed full")
            time.sleep(_ROOM_S)
        try:  # the agent waits on its socket between ticks: woken, it answers now (a full socket wakes it too)
            sock.send(protocol.DOORBELL)
        except OSError:
            pass

    @staticmethod
    def _send_by(sock: socket.socket, data: bytes, deadline: float) -> None:
        """Send, waiting until ``deadline`` for room: a socket filled by a burst of finishes is a busy agent,
        which answers once it has read them (raises ``BlockingIOError`` if it did not make room in time)."""
        room = select.poll()
        room.register(sock.fileno(), select.POLLOUT)
        while True:
            try:
                sock.send(data)
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                room.poll(min(left, 0.05) * 1e3)  # re-tried at least every 50 ms: a missed wake-up costs no more

    def flush(self, timeout: float) -> bool:
        bound = max(0.0, min(float(timeout), control.MAX_FLUSH_S))
        reply = self.ask(lambda token: control.FlushRecord(token, bound), timeout)
        return reply is not None and reply.ok

    # -- the pipeline's remote (core/pipeline.Remote) ----------------------------------------------------

    def request_started(self, t: Any) -> None:
        data = protocol.start_message(t)
        if len(data) > self.max_packet:  # a captured prompt too long for one packet: the request still counts
            self.oversized += 1
            data = protocol.start_message(t, content=False)
        self.send(data)

    def request_finished(self, request_id: str, t: Any, s: Any) -> None:
        data = protocol.finish_message(request_id, t, s)
        if len(data) > self.max_packet:  # captured content too long for one packet: metrics still count
            self.oversized += 1
            data = protocol.finish_message(request_id, t, s, content=False)
        self.send(data)

    def request_settled(self, facts: Any) -> None:
        data = protocol.facts_message(facts)
        if len(data) > self.max_packet:  # captured content too long for one packet: metrics still count
            self.oversized += 1
            data = protocol.facts_message(facts, content=False)
        self.send(data)

    def stats(self, counts: Any, timeout: float = 2.0) -> dict[str, Any]:
        """The agent's pipeline's counts (what users read), the frontend's own requests, and the link's."""
        remote = self._stats(timeout)
        self._last_stats = (time.monotonic(), remote)
        out: dict[str, Any] = dict(remote) if isinstance(remote, dict) else dict(vars(counts))
        out.pop("agent_errors", None)
        # the frontend's counts of what it handed over: the agent's miss those a full socket refused
        out["requests_started"], out["requests_finished"] = counts.requests_started, counts.requests_finished
        out["requests_untracked"] = counts.requests_untracked
        out["agent_unreachable"] = int(remote is None)
        out.update(self.counts())
        return out

    def agent_errors(self, timeout: float = 2.0) -> dict[str, int]:
        """The errors the agent caught, by site (``otel_llm.stats()["errors"]`` adds them): from the answer
        ``stats`` just got (``otel_llm.stats()`` asks for both), else asked for."""
        at, remote = self._last_stats
        if time.monotonic() - at > 1.0:
            remote = self._stats(timeout)
        return dict(remote.get("agent_errors") or {}) if isinstance(remote, dict) else {}

    def _stats(self, timeout: float) -> dict[str, Any] | None:
        reply = self.ask(control.StatsRecord, timeout)
        return reply.stats if reply is not None else None

    def counts(self) -> dict[str, int]:
        return {"agent_pid": self.pid if self.alive() else 0, "agent_dropped": self.dropped,
                "agent_lost": self.lost, "agent_restarts": self.restarts, "agent_oversized": self.oversized,
                "agent_cpu_ns": _cpu_ns(self.pid) if self.alive() else 0}


def _stop(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
        proc.wait(5)
    except Exception:
        pass


def _cpu_ns(pid: int) -> int:
    """The agent's CPU so far (every thread's, as the scheduler accounts it)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        pass
    return total
