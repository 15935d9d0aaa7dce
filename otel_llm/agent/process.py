"""The agent: joins a frontend's requests with its engine's steps, and does everything else.

Started by the frontend (``link.AgentLink``) with one end of a ``SOCK_SEQPACKET`` pair, as the engine
adapter's ``python -m`` module (vLLM's: ``otel_llm.instrumentation.vllm.agent_process``), which hands it
its reader of the engine's step records: for vLLM, the frontend's step socket in the step directory,
bound here instead (the EngineCore's sink hands it the shared-memory ring). It runs the engine-agnostic
``Pipeline`` as the frontend would (tail decision, verdict, metrics, spans) and exports through
providers rebuilt from the ``OTEL_*`` variables (destinations.py).

Order, where the frontend is its requests' source (an engine off the one path; its messages are declared
records, agent/protocol.py): a step that served a request was written after the request's ``START`` was sent
(the frontend sends it before vLLM hands the request to the EngineCore), and a request's finish (``FACTS``
or ``FINISH``) after its last step was written. So each turn reads the frontend's messages (from its
shared-memory ring, or the socket where it has none: starts go in at once, finishes wait), then reads the
engine (its step socket, then its step ring), then hands the pipeline the steps read at the *previous* turn
(every request they served had started by now, so its ``START`` is in), then settles the finishes of the
previous turn (their steps were written before they were sent, so read by then). Written is not sent where
the steps come as datagrams: the EngineCore's sink holds those a full socket refused, so a finish also waits
until the step that produced its request's last output has been added (``STEP_WAIT_TURNS``; at a flush
``FLUSH_STEP_WAIT_S``).

Where the EngineCore is its requests' source (vLLM's Rust frontend, headless engines: agent/records.py,
engine_requests.py), its request records come with the steps: a start is applied at once (before the
previous turn's steps: it was sent before any step that served its request was written, but the socket is
read before the ring), a finish two reads later (it may be sent just before its request's last step is
written). Where a Python frontend serves them, it sends each request's ``RequestEnrichment`` on this
link (a declared record among its messages), and the engine's finish waits for it (engine_requests.py).

It exits when the frontend's end closes (the frontend exited or died: the kernel closes it), or when its
parent is no longer the frontend (it died while a process it forked still holds its end), after sending
what it holds. (Not ``PR_SET_PDEATHSIG``: that signals the death of the parent *thread*, and an agent
restarted from a thread of the frontend would be killed when that thread ends.)
"""

from __future__ import annotations

import gc
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import Any, Callable

from .. import shm_ring
from ..core.diagnosis.anatomy import EngineFacts
from ..core.finish_facts import FinishFacts, settle
from ..core import self_metrics
from ..core.pipeline import Pipeline
from ..guard import Guard, total
from ..semconv import SCHEMA_URL
from ..version import __version__
from . import control, destinations, protocol, records
from .engine_requests import EngineRequests
from .link import CLIENT_ENV

_DOORBELL = protocol.DOORBELL[0]
Finish = FinishFacts | control.FinishRecord  # the frontend's finish: the engine's numbers, or its summary
_REQUEST_RECORDS = (records.RequestStart, records.RequestFinish, records.SinkCounts)
MAX_SINKS = 16  # engine processes whose sink counts are kept (EngineCores that came and went: the oldest goes)

IDLE_S = 0.1  # the tick with nothing going on: the ring is read at least this often (it holds seconds of steps)
FIRST_S = 60.0  # the frontend's first message (RING) follows READY at once: a bound for a frontend that hung
BUSY_S = 0.02  # the tick within a second of the last message (a flush is answered within it)...
# ... once traffic began after a pause; traffic that went on for a second without one ticks at SUSTAINED_S: a
# tick costs CPU whatever it finds, and 50 a second were most of what the agent spent under steady load
# besides its requests (benchmarks/frontend_cpu.py; a flush then waits for at most this)
SUSTAINED_S = 0.1
SUSTAINED_AFTER_S = 1.0
# A frontend's finish whose last output came from a step not read yet waits for that step: where the steps
# come as datagrams, the EngineCore's sink holds those a full socket refused and sends them with its next
# step (instrumentation/vllm/step_transport.SocketSink), after that step's outputs reached the frontend. It
# waits at most this many turns (then settles: the step was dropped, counted; its token times unplaced) ...
STEP_WAIT_TURNS = 50
# ... and, at a flush, this long: a sink whose engine went idle waits up to SocketSink.IDLE_WAIT_S for the
# reader before it drops what it holds
FLUSH_STEP_WAIT_S = 0.5
FLUSH_STEP_POLL_S = 0.01


# The agent frees what it reads (records, steps, timelines) by reference count; what the cyclic collector
# scans is mostly what it holds on purpose (the held steps, the exporters' queues, the modules). At the
# default pace (a young collection every 700 objects allocated more than freed, a full one every 100 young
# ones) that scanning was a measurable part of the agent's CPU (docs/costs.md). A larger young generation,
# and what start-up made frozen (``gc.freeze``: never scanned), leave it little to do; a cycle waits longer
# to be freed.
GC_THRESHOLD = (10_000, 10, 10)


def tune_gc() -> None:
    """The agent process's collector: what exists now frozen, the young generation ``GC_THRESHOLD``."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class Agent:
    """``open_steps(guard)``: the engine adapter's reader of its engine's step records (an object whose
    ``drain(deliver)`` hands each waiting record to ``deliver``, and ``close()``), opened once; None: none."""

    def __init__(self, sock: socket.socket, open_steps: Callable[[Guard], Any] | None = None) -> None:
        self.sock = sock
        self._open_steps = open_steps
        self.frontend = os.getppid()
        self.guard = Guard()
        self.pipeline: Pipeline | None = None
        self.providers: tuple[Any, Any] | None = None
        self.receiver: Any = None
        self.starts = protocol.Starts()
        self.pending_steps: list[Any] = []  # read at the last turn, handed to the pipeline at the next
        self.arrived: list[Finish] = []  # the frontend's finishes received since the last turn
        self.due: list[Finish] = []  # finishes received before the last turn's ring read: settled this turn
        self.behind: list[tuple[Finish, int]] = []  # due finishes waiting for their last output's step, turns left
        self.clock, self.sleep = time.monotonic, time.sleep  # (a flush's wait for steps; tests inject both)
        self.engines: list[EngineFacts] = []
        self.malformed = 0
        # one receive buffer for the agent's life: ``recv(MAX_PACKET)`` allocated (and, above malloc's mmap
        # threshold, mapped and unmapped) a megabyte for every message
        self._view = memoryview(bytearray(protocol.MAX_PACKET))
        self.orphans = 0  # finishes whose start never arrived (dropped by a full socket, or a restart)
        self.ring: shm_ring.RingReader | None = None  # the frontend's messages, where it sends them so (RING)
        # the engine's own request records, where it is its requests' source (engine_requests.py)
        self.engine_requests = EngineRequests()
        self.engine_arrived: list[records.RequestFinish] = []  # finishes read at this turn's engine read
        self.engine_due: list[records.RequestFinish] = []  # ... at the previous one: settled next turn
        self.sinks: dict[int, records.SinkCounts] = {}  # engine pid -> what its sink last said it dropped
        # the API server this agent serves (link.CLIENT_ENV): the enriched request records of the others are
        # theirs (each API server's agent reads every record of the engines they share)
        self.client_index = _client_index(os.environ.get(CLIENT_ENV))
        self.others = 0  # request records of another API server's requests, skipped

    def open_ring(self, data: bytes, fds: list[int]) -> None:
        """The frontend's first message (``RingRecord``): the ring it writes every later message into, or None
        (every message a packet)."""
        try:
            first = control.decode(data)
            if type(first) is not control.RingRecord:
                raise records.RecordError(f"the frontend's first message is a {type(first).__name__}, not RING")
            if first.announcement is not None:
                if len(fds) != 1:
                    raise shm_ring.RingError(f"ring announcement with {len(fds)} descriptors")
                self.ring = shm_ring.RingReader(first.announcement, fds[0])
        except Exception as exc:  # no ring: nothing the frontend sends reaches the pipeline; counted
            self.malformed += 1
            self.guard.failed("agent ring", exc)
        finally:
            for fd in fds:
                os.close(fd)  # the mapping stays

    # -- configuration -----------------------------------------------------------------------------

    def configure(self, setup: protocol.AgentConfig) -> None:
        """A new instrumentation: a new pipeline (and providers), after the old one sent what it held."""
        self.close_pipeline()
        from ..otlp.routes import Router

        tp, mp = destinations.build(setup.destinations)
        self.providers = (tp, mp)
        tracer = tp.get_tracer("otel_llm.vllm", __version__, schema_url=SCHEMA_URL)
        meter = mp.get_meter("otel_llm.vllm", __version__, schema_url=SCHEMA_URL)
        self.pipeline = Pipeline(setup.config, tracer, meter, engine="vllm", router=Router, guard=self.guard)
        self_metrics.register_agent(meter, "vllm", self.lost)
        for facts in self.engines:
            self.apply_engine(facts)

    def open_receiver(self) -> None:
        if self._open_steps is not None and self.receiver is None:
            try:
                self.receiver = self._open_steps(self.guard)
                if self.receiver is not None and hasattr(self.receiver, "take_requests"):
                    self.receiver.take_requests = True  # its engines' request records, where they send them
            except Exception as exc:  # no steps: the requests' verdicts say unknown, their metrics still count
                self.guard.failed("agent step receiver", exc)

    def apply_engine(self, facts: EngineFacts) -> None:
        p = self.pipeline
        if p is None:
            return
        try:
            p.engine_built(facts)
        except Exception as exc:
            self.guard.failed("agent step diagnosis set-up", exc)

    def close_pipeline(self) -> None:
        if self.pipeline is not None:
            self.turn(final=True)
            for r, e in self.engine_requests.enrichments.ready((), force=True):  # what waits for an enrichment
                self.engine_finish(self.pipeline, r, e)
            self.pipeline.close(5.0)
            self.pipeline = None
        if self.providers is not None:
            for provider in self.providers:
                try:
                    provider.shutdown()
                except Exception as exc:
                    self.guard.failed("agent provider shutdown", exc)
            self.providers = None

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        # A tick, not a wait for each message: a waiting reader is woken by every packet, and on a busy host
        # the kernel then often runs it at once in place of the sender, vLLM's output thread (whose send then
        # waits for the reader's time slice, where with nobody to wake it returns at once). At a tick the
        # socket, or the ring, holds what came meanwhile (SEND_BUFFER: thousands of requests' messages).
        # Where both the frontend's messages and the engine's steps come through rings, the socket carries
        # only a DOORBELL after a control message: the tick is a wait on it, SUSTAINED_S long from the start
        # (a flush is answered when it rings, not at the next tick). Elsewhere the first second of traffic
        # ticks at BUSY_S: a flush waits for a tick, and a datagram socket queues 10 steps.
        sleep, clock, parent = time.sleep, time.monotonic, os.getppid
        bell = select.poll()
        bell.register(self.sock.fileno(), select.POLLIN)
        frontend = self.frontend
        busy_until = busy_since = 0.0
        while True:
            now = clock()
            if self.ring is not None and self._ring_fed():
                bell.poll((IDLE_S if now >= busy_until else SUSTAINED_S) * 1e3)
            else:
                sleep(IDLE_S if now >= busy_until else BUSY_S if now - busy_since < SUSTAINED_AFTER_S
                      or not self._ring_fed() else SUSTAINED_S)
            got = self.receive()
            if got is None or parent() != frontend:
                break  # the frontend is gone (its end closed; or it died while a child it forked holds its end)
            if got or self.pending_steps or self.due or self.behind or self.engine_arrived or self.engine_due:
                now = clock()
                if now >= busy_until:  # traffic again after a pause
                    busy_since = now
                busy_until = now + 1.0
            self.turn()
        self.close_pipeline()

    def _ring_fed(self) -> bool:
        """Whether every engine's steps come through a ring (the non-x86 channels' datagrams do not)."""
        receiver = self.receiver
        return receiver is not None and bool(getattr(receiver, "rings", None))

    def receive(self) -> int | None:
        """Every message waiting (how many); None when the frontend's end closed."""
        n = 0
        closed = False
        view, recv_into = self._view, self.sock.recv_into
        while True:  # the socket: the frontend's messages where it has no ring; its end-of-file in any case
            try:
                size = recv_into(view, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                closed = True
                break
            if not size:
                closed = True
                break
            if size == 1 and view[0] == _DOORBELL:  # what it rang for is in the ring
                continue
            n += 1
            self.take(view[:size])
        # the ring after the socket, and after its end-of-file too: what the frontend wrote before it closed
        # its end is there (a socket's packets came before its end-of-file of themselves)
        ring = self.ring
        if ring is not None:
            try:
                records = ring.read()
            except shm_ring.RingError as exc:  # positions that make no sense: what was written is skipped
                self.malformed += 1
                self.guard.failed("agent ring", exc)
                records = exc.args[1] if len(exc.args) > 1 else []
            for data in records:
                self.take(data)
            n += len(records)
        return None if closed else n

    def take(self, data: Any) -> None:
        """One message from the frontend: a declared record of the agent link (control.py) or its enrichment
        (records.py); anything else (another record, a positional tuple) is refused, counted malformed."""
        try:
            if data[0] == records.TAG:  # a request record (agent/records.py): the frontend's enrichment
                record = records.decode(data)
                if type(record) is not records.RequestEnrichment:
                    raise records.RecordError(f"{type(record).__name__} from the frontend")
                self.engine_requests.enrichments.add(record)
                return
            self.handle(control.decode(data))
        except Exception as exc:  # a message we cannot read costs that message
            self.malformed += 1
            self.guard.failed("agent message", exc)

    def handle(self, r: control.Record) -> None:
        kind = type(r)
        p = self.pipeline
        if kind is control.StartRecord:
            if p is not None:
                p.start(self.starts.timeline(r))  # type: ignore[arg-type]
        elif kind is control.FactsRecord:
            self.arrived.append(protocol.facts_of(r))  # type: ignore[arg-type]
        elif kind is control.FinishRecord:
            self.arrived.append(protocol.checked(r))  # type: ignore[arg-type]
        elif kind is control.ConfigRecord:
            config, found = control.setup_of(r)  # type: ignore[arg-type]
            self.configure(protocol.AgentConfig(config, found))
        elif kind is control.ReleaseRecord:  # the instrumentation ended
            self.close_pipeline()
        elif kind is control.EngineRecord:
            facts = control.engine_of(r)  # type: ignore[arg-type]
            if facts not in self.engines:
                self.engines.append(facts)
            self.apply_engine(facts)
        elif kind is control.FlushRecord:
            timeout = r.timeout  # type: ignore[union-attr]
            if not 0.0 <= timeout <= control.MAX_FLUSH_S:  # (a NaN too: no flush waits without end)
                raise records.RecordError(f"FlushRecord.timeout: {timeout}")
            self.turn(final=True)
            ok = True
            if p is not None:
                ok = p.flush(timeout)
            if self.providers is not None:
                tp, mp = self.providers
                ok = tp.force_flush(int(timeout * 1e3)) and ok
                ok = mp.force_flush(int(timeout * 1e3)) and ok
            self.reply(control.ReplyRecord(r.token, ok=bool(ok)))  # type: ignore[union-attr]
        elif kind is control.StatsRecord:
            self.reply(control.ReplyRecord(r.token, stats=self.stats()))  # type: ignore[union-attr]
        else:  # a record the agent sends (READY, REPLY), or RING after the first message
            raise records.RecordError(f"{kind.__name__} from the frontend")

    def turn(self, final: bool = False) -> None:
        """This turn's read of the engine, then its starts, last turn's steps, last turn's finishes (see the
        module's docstring). ``final``: everything now (a flush; the frontend has sent all it will for now)."""
        p = self.pipeline
        steps, self.pending_steps = self.pending_steps, []
        finishes, self.due, self.arrived = self.due, self.arrived, []
        # the engine's own request records (agent/records.py: where the EngineCore is its requests' source),
        # read with the steps: starts at once, finishes two reads later (a finish may be sent just before its
        # request's last step is written, and the socket is read before the ring)
        read = self.read_steps()
        engine_starts, engine_finishes = self._split(read)
        engine_due, self.engine_due = self.engine_due, self.engine_arrived
        self.engine_arrived = engine_finishes
        if final:
            steps += read
            finishes += self.due
            self.due = []
            engine_due += self.engine_due + self.engine_arrived
            self.engine_due, self.engine_arrived = [], []
        else:
            self.pending_steps = read
        if p is not None:
            for r in engine_starts:
                p.start(self.engine_requests.timeline(r))
            add = p.add_step
            for step in steps:
                add(step)
            if final and self.receiver is not None:
                engine_due += self._catch_up(p, finishes, engine_due)
            for f in self._caught_up(p, finishes, final):
                self.finish(p, f)
            for r, e in self.engine_requests.enrichments.ready(engine_due):
                self.engine_finish(p, r, e)
            self.starts.forget_complete()

    def _caught_up(self, p: Pipeline, finishes: list[Finish], final: bool) -> list[Finish]:
        """The finishes to settle now, in order: those whose last output's step the pipeline has (or that have
        none, or waited ``STEP_WAIT_TURNS``); the others wait in ``behind``. All of them at a final turn."""
        behind = self.behind
        if not behind and not finishes:
            return finishes
        latest = p.latest_step_end()
        ready: list[Finish] = []
        waiting: list[tuple[Finish, int]] = []
        for f, left in behind + [(f, STEP_WAIT_TURNS) for f in finishes]:
            if final or left <= 0 or not _ahead(f, latest):
                ready.append(f)
            else:
                waiting.append((f, left - 1))
        self.behind = waiting
        return ready

    def _catch_up(self, p: Pipeline, finishes: list[Finish],
                  engine_due: list[records.RequestFinish]) -> list[records.RequestFinish]:
        """A flush: reads the engine for up to ``FLUSH_STEP_WAIT_S`` more while a finish's last output came from
        a step not read yet (the sink of an engine gone idle sends what it held once the reader made room), or
        an enrichment that came since the last flush waits for its engine finish (a stop string: the frontend
        let the request go, then aborted it in the engine; the abort's finish follows), adding the steps to
        the pipeline; the engine's own finishes read meanwhile are returned. After the last awaited finish one
        more read: a finish is sent just before its step is written."""
        waiting = [f for f, _ in self.behind] + finishes
        enrichments = self.engine_requests.enrichments
        expected = enrichments.unfinished(engine_due)
        enrichments.flushed()
        engine_finishes: list[records.RequestFinish] = []
        deadline = self.clock() + FLUSH_STEP_WAIT_S
        once_more = False
        while expected or once_more or any(_ahead(f, p.latest_step_end()) for f in waiting):
            left = deadline - self.clock()
            if left <= 0:
                break
            self.sleep(min(FLUSH_STEP_POLL_S, left))
            read = self.read_steps()
            starts, ends = self._split(read)
            for r in starts:
                p.start(self.engine_requests.timeline(r))
            engine_finishes += ends
            for step in read:
                p.add_step(step)
            once_more = False
            if ends and expected:
                expected.difference_update(r.request_id for r in ends)
                once_more = not expected
        return engine_finishes

    def _split(self, read: list[Any]) -> tuple[list[records.RequestStart], list[records.RequestFinish]]:
        """Takes the request records out of ``read`` (in place), keeping the steps."""
        if not any(type(x) in _REQUEST_RECORDS for x in read):
            return [], []
        mine = self.client_index
        starts = [x for x in read if type(x) is records.RequestStart and (x.client_index == mine or not x.enriched)]
        finishes = [x for x in read if type(x) is records.RequestFinish and (x.client_index == mine or not x.enriched)]
        self.others += sum(type(x) in (records.RequestStart, records.RequestFinish) for x in read) \
            - len(starts) - len(finishes)
        for x in read:
            if type(x) is records.SinkCounts:
                self.sink_counts(x)
        read[:] = [x for x in read if type(x) not in _REQUEST_RECORDS]
        return starts, finishes

    def sink_counts(self, counts: records.SinkCounts) -> None:
        sinks = self.sinks
        if counts.pid not in sinks:
            while len(sinks) >= MAX_SINKS:
                sinks.pop(next(iter(sinks)))
        sinks[counts.pid] = counts

    def read_steps(self) -> list[Any]:
        out: list[Any] = []
        if self.receiver is not None:
            try:
                self.receiver.drain(out.append)
            except Exception as exc:
                self.guard.failed("agent step receiver", exc)
        return out

    def engine_finish(self, p: Pipeline, r: records.RequestFinish, e: records.RequestEnrichment | None) -> None:
        try:
            t = p.requests.get(r.request_id)
            if t is None:
                self.orphans += 1
            steps = p.steps_of(t) if t is not None else []
            p.finish(r.request_id, self.engine_requests.settle(t, r, steps, e))
        except Exception as exc:
            self.guard.failed("agent engine finish", exc)

    def finish(self, p: Pipeline, f: Finish) -> None:
        """The frontend's finish (its facts, or its summary), settled."""
        try:
            t = p.requests.get(f.request_id)
            if t is None:
                self.orphans += 1
            if type(f) is FinishFacts:
                rid, summary = f.request_id, settle(t, f)
            else:
                rid, summary = protocol.finish_into(t, f)  # type: ignore[arg-type]
            p.finish(rid, summary)
        except Exception as exc:
            self.guard.failed("agent finish", exc)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.pipeline.stats()) if self.pipeline is not None else {}
        out["agent_malformed"] = self.malformed
        out["agent_orphans"] = self.orphans
        out["agent_engine_starts"] = self.engine_requests.starts
        out["agent_engine_finishes"] = self.engine_requests.finishes
        out["agent_engine_others"] = self.others  # (several API servers: their requests, skipped here)
        lost = self.lost()
        out["engine_steps_dropped"] = lost["engine_steps_dropped"]
        out["engine_requests_dropped"] = lost["engine_requests_dropped"]
        joins = self.engine_requests.enrichments
        out["agent_enriched"] = joins.joined
        out["agent_enrichments_missing"] = joins.missing + joins.dropped
        out["agent_rss_bytes"] = _rss_bytes()
        out["agent_gc_frozen"] = gc.get_freeze_count()  # (tune_gc: what start-up made, never scanned)
        out["agent_errors"] = total([self.guard])
        return out

    def lost(self) -> dict[str, int]:
        """What did not reach the pipeline whole: the engines' sinks' drops (their SinkCounts records), and the
        finishes whose start never arrived (the ``otel_llm.agent.lost`` counter's states)."""
        sinks = list(self.sinks.values())
        return {"engine_steps_dropped": sum(max(0, c.steps_dropped) for c in sinks),
                "engine_requests_dropped": sum(max(0, c.requests_dropped) for c in sinks),
                "orphans": self.orphans}

    def reply(self, answer: control.ReplyRecord) -> None:
        try:
            self.sock.settimeout(5.0)
            self.sock.send(control.encode(answer))
        except OSError:
            pass  # the frontend gave up waiting, or is gone
        finally:
            self.sock.settimeout(None)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def _ahead(f: Finish, latest: float | None) -> bool:
    """Whether finish ``f``'s last output came after the latest step added (``latest``; None: no step yet,
    nothing to wait for)."""
    last = protocol.last_output_stamp(f)
    return latest is not None and last is not None and last > latest


def _client_index(value: str | None) -> int:
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def main(argv: list[str], open_steps: Callable[[Guard], Any] | None = None) -> int:
    """The agent process's entry (an engine adapter's ``python -m`` module calls it with its step reader)."""
    tune_gc()
    fd = int(argv[1])
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # finally: close the pipeline, send what is held
    agent = Agent(sock, open_steps)
    try:
        # the step socket first: bound before the frontend builds its engine, so its EngineCore's sink finds
        # it at its first scan
        agent.open_receiver()
        sock.send(control.encode(control.ReadyRecord(os.getpid())))
        sock.settimeout(FIRST_S)
        try:
            data, fds, _, _ = socket.recv_fds(sock, protocol.MAX_PACKET, 1)
        except OSError:
            return 0  # the frontend gave up on this agent, or is gone
        sock.settimeout(None)
        if not data:
            return 0
        agent.open_ring(data, fds)
        agent.run()
    finally:
        try:
            agent.close_pipeline()
        finally:
            if agent.receiver is not None:
                agent.receiver.close()
            if agent.ring is not None:
                agent.ring.close()
    return 0


