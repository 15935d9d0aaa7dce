"""Engine-step records from one EngineCore to every frontend socket in the step directory."""

from __future__ import annotations

import os
import socket
import struct
import tempfile
from types import SimpleNamespace

import pytest

from otel_llm.guard import Guard
from otel_llm import shm_ring
from otel_llm.agent import records
from otel_llm.instrumentation.vllm import engine_errors, step_hooks, step_transport, step_wire


def record(step_id: int) -> step_wire.StepPayload:
    """A step as the scheduler hooks hand it to the sink (step_hooks.py: 14 fields, the shares as vLLM's lists:
    a new request of a 16-token prompt, then a decoding one with 3 outputs)."""
    shares = step_wire.Shares(["req-a", "req-b"], [16, 1], [0, 40], [], [0], [16], [0])
    return step_wire.StepPayload(step_id, 1.0, 2.0, 3, 0, 0, 0.25, shares, 0, 0.001, 0.008, 0.001, None, 0.006)


def drained(receiver: step_transport.StepReceiver) -> list:
    got: list = []
    receiver.drain(got.append)
    return got


@pytest.fixture(params=["ring", "datagram"])
def transport(request):
    """Both ways a sink carries records: shared-memory rings (shm_ring, where available) and datagrams.
    (Its own patch: the tests undo their ``monkeypatch`` midway.)"""
    if request.param == "ring" and not shm_ring.AVAILABLE:
        pytest.skip("no step rings on this platform")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_transport.SocketSink, "RING", request.param == "ring")
        yield request.param


def test_every_frontend_gets_every_step_and_late_or_dead_ones_are_handled(monkeypatch, transport):
    with tempfile.TemporaryDirectory() as d:
        a = step_transport.StepReceiver(d)
        monkeypatch.setattr(os, "getpid", lambda: 999_001)  # a second frontend process
        b = step_transport.StepReceiver(d)
        monkeypatch.undo()
        sink = step_transport.SocketSink(d)
        sink(record(1))
        (r,) = drained(a)
        assert [x.step_id for x in drained(b)] == [1]
        assert (r.step_id, r.requests, r.kv_cache_usage) == (1, [("req-a", 16, True), ("req-b", 1, False)], 0.25)
        assert [ring is not None for _, _, ring in sink._targets] == [transport == "ring"] * 2
        assert len(a.rings) == len(b.rings) == (transport == "ring")

        # a frontend that binds after the engine started is found on the next rescan
        monkeypatch.setattr(os, "getpid", lambda: 999_002)
        c = step_transport.StepReceiver(d)
        monkeypatch.undo()
        sink._scanned = float("-inf")  # as if RESCAN_S had passed
        sink(record(2))
        assert [x.step_id for x in drained(c)] == [2] and [x.step_id for x in drained(a)] == [2]
        assert [x.step_id for x in drained(b)] == [2]

        # a frontend that died: its lost record counted once (datagrams: the refused send; rings: the
        # record left unread, when the next rescan's probe is refused), its stale socket removed
        b.sock.close()
        sink(record(3))
        sink._scanned = float("-inf")
        sink(record(4))
        assert sink.dropped == 1 and not os.path.exists(b.path)
        sink(record(5))
        assert sink.dropped == 1
        assert [x.step_id for x in drained(a)] == [3, 4, 5] and [x.step_id for x in drained(c)] == [3, 4, 5]
        a.close()
        c.close()
        assert os.listdir(d) == []


def test_a_frontend_reborn_under_the_same_pid_is_reconnected_not_unlinked(monkeypatch, transport):
    """The sink sends on a socket connected once per frontend path: when that frontend died and a new
    process with the same pid bound the path since, the refused send is counted and the path
    connected again (its file left alone), so the new frontend gets the next steps."""
    with tempfile.TemporaryDirectory() as d:
        monkeypatch.setattr(os, "getpid", lambda: 999_003)
        old = step_transport.StepReceiver(d)
        sink = step_transport.SocketSink(d)
        sink(record(1))
        assert [x.step_id for x in drained(old)] == [1]
        old.sock.close()  # dies without removing its file; its pid comes back
        reborn = step_transport.StepReceiver(d)
        monkeypatch.undo()
        sink(record(2))  # to the dead one: refused (datagram) or left unread in its ring: counted
        sink._scanned = float("-inf")  # rings: the rescan's probe is refused, the path connected again
        sink(record(3))
        assert sink.dropped == 1 and os.path.exists(reborn.path)
        assert [x.step_id for x in drained(reborn)] == [3]
        assert len(reborn.rings) == (transport == "ring")
        reborn.close()
        sink.close()


def test_api_server_processes_join_the_inherited_directory_others_make_their_own(monkeypatch):
    import multiprocessing

    with tempfile.TemporaryDirectory() as inherited:
        monkeypatch.setenv(step_transport.STEP_DIR_ENV, inherited)
        monkeypatch.setattr(multiprocessing.current_process(), "name", "ApiServer_1")
        assert step_transport.open_step_dir() == (inherited, False)  # not ours to remove

        monkeypatch.setattr(multiprocessing.current_process(), "name", "MainProcess")
        own, made = step_transport.open_step_dir()  # e.g. a server started by an instrumented test process
        assert made and own != inherited and os.environ[step_transport.STEP_DIR_ENV] == own
        step_transport.remove_if_empty(own)
        assert not os.path.exists(own)


def test_wire_round_trip_keeps_every_field():
    ids = [f"{i}_cmpl-ü{i}" for i in range(64)]  # non-ASCII ids too
    tokens = [1 + i % 3 for i in range(64)]
    computed = [100 + i for i in range(64)]
    no_output_at = [i for i in range(64) if i % 7 == 0]  # no output yet: a prefill chunk
    prompt_at = [i for i in range(64) if i % 5 == 0]  # new or recomputing: their prompt length comes along
    prompt_len = [120 + i % 10 for i in prompt_at]
    outputs = [0 if i % 7 == 0 else 4 for i in prompt_at]  # with 4 outputs: prefill while computed < prompt + 3
    shares = step_wire.Shares(ids, tokens, computed, no_output_at, prompt_at, prompt_len, outputs)
    payload = step_wire.StepPayload((7 << 32) | 9, 10.5, 10.51, 64, 3, 1, 0.75, shares, 2, 0.001, 0.008, 0.0015, 0.25,
                                    0.0061)
    prompts = {i: (p, o) for i, p, o in zip(prompt_at, prompt_len, outputs)}
    prefill = [computed[i] < (prompts[i][0] + prompts[i][1] - 1 if prompts[i][1] else prompts[i][0]) if i in prompts
               else i in no_output_at for i in range(64)]
    assert 0 < sum(prefill) < 64 and any(prefill[i] for i in prompt_at if i % 7)  # both kinds, a recompute too
    wire = step_wire.decode(step_wire.encode(payload))
    inproc = step_hooks.decode(payload)  # what an in-process engine hands over, without a wire
    for got in (wire, inproc):
        assert got.requests == list(zip(ids, tokens, prefill)) and got.contexts == computed
        assert (got.step_id, got.start, got.end, got.running, got.waiting, got.preempted, got.kv_cache_usage,
                got.queue_blocked) == payload[:7] + (2,)
        assert (got.schedule_s, got.execute_s, got.output_s, got.idle_s, got.model_s) == payload[9:]
    none = step_wire.decode(step_wire.encode(payload[:12] + (None, None)))
    assert (none.idle_s, none.model_s) == (None, None)
    empty = step_wire.decode(step_wire.encode(payload[:7] + (([], [], [], [], [], [], []),) + payload[8:]))
    assert empty.requests == [] and empty.contexts == []
    # a plain decode batch: one token each, not listed; a sender's cache reuses the encoded ids
    ones = payload._replace(shares=shares._replace(tokens=None))
    cache = step_wire.sender_cache()
    first = step_wire.encode(ones, cache)
    again = step_wire.encode(ones[:7] + ((list(ids), None) + shares[2:],) + ones[8:], cache)
    assert first == again == step_wire.encode(ones) and len(first) == len(step_wire.encode(payload)) - 4 * 64
    for got in (step_wire.decode(first), step_hooks.decode(ones)):
        assert got.requests == list(zip(ids, [1] * 64, prefill)) and got.contexts == computed
    other = step_wire.decode(step_wire.encode(payload[:7] + ((ids[::-1], None, computed, [], [], [], []),)
                                              + payload[8:], cache))
    assert [r[0] for r in other.requests] == ids[::-1]  # another batch: encoded afresh


def test_a_plain_decode_batch_encodes_the_same_bytes_on_the_array_fast_path(monkeypatch):
    """One token each, no share without output or with a prompt entry: the context counts go through
    array("I") (step_wire._NATIVE_U32), byte for byte what struct's "<I" makes."""
    ids = [f"cmpl-{i:032x}-0" for i in range(64)]
    computed = [(1 << 32) - 1, 0] + [100 + 7 * i for i in range(62)]  # the u32 range's ends too
    payload = (5, 1.0, 1.5, 64, 0, 0, 0.5, (ids, None, computed, [], [], [], []), 0, 0.1, 0.2, 0.3, None, None)
    fast = step_wire.encode_py(payload)  # (the C accelerator writes the same bytes: test_step_fast.py)
    monkeypatch.setattr(step_wire, "_NATIVE_U32", False)
    assert fast == step_wire.encode_py(payload) == step_wire.encode(payload)
    got = step_wire.decode(fast)
    assert got.contexts == computed and got.requests == [(i, 1, False) for i in ids]
    monkeypatch.undo()
    with pytest.raises((OverflowError, struct.error)):  # out of the wire's range: refused at the sender
        step_wire.encode(payload[:7] + ((ids[:1], None, [1 << 32], [], [], [], []),) + payload[8:])


def test_prefill_and_context_derive_as_the_scheduler_hook_once_did():
    """step_wire.derive_prefill against the per-request rule the EngineCore hook applied before wire
    version 2 (num_computed_tokens had advanced by the step's tokens; prefill until the prompt is
    computed, or when recomputing after a preemption, until all but the last sampled token are)."""
    def old_rule(prompt: int, outputs: int, computed_after: int, n: int) -> tuple[bool, int]:
        num_tokens = prompt + outputs
        before = computed_after - n
        return before < (num_tokens - 1 if outputs else num_tokens), before

    cases = [  # (prompt, outputs, computed before the step, tokens, flagged with its prompt length)
        (100, 0, 0, 64, True),  # new request, first chunk
        (100, 0, 64, 36, False),  # its last chunk: no output yet, still prefill
        (100, 5, 104, 1, False),  # decoding
        (100, 5, 0, 64, True),  # resumed after a preemption: recomputes
        (100, 5, 64, 40, True),  # the recompute's last chunk (samples the next token)
        (100, 5, 104, 1, True),  # recomputing, everything but the last token cached already: a decode
        (100, 5, 103, 1, True),  # the recompute's chunk stopped one short: still prefill
    ]
    shares = (
        [f"r{i}" for i in range(len(cases))], [c[3] for c in cases], [c[2] for c in cases],
        [i for i, c in enumerate(cases) if not c[1]],  # no output yet
        [i for i, c in enumerate(cases) if c[4]], [c[0] for c in cases if c[4]], [c[1] for c in cases if c[4]])
    expected = [old_rule(p, o, before + n, n) for p, o, before, n, _ in cases]
    assert step_wire.derive_prefill(len(cases), *shares[2:]) == [i for i, e in enumerate(expected) if e[0]]
    payload = (1, 0.0, 0.0, 0, 0, 0, 0.0, shares, 0, 0.0, 0.0, 0.0, None, None)
    step = step_wire.decode(step_wire.encode(payload))  # and as the frontend reads it off the wire
    assert [r[2] for r in step.requests] == [e[0] for e in expected]
    assert step.contexts == [e[1] for e in expected]
    assert [r[2] for r in step.requests] == [True, True, False, True, True, False, True]


@pytest.mark.parametrize("mangle, why", [
    (lambda b: bytes([step_wire.VERSION + 1]) + b[1:], "wire version"),
    (lambda b: b[:step_wire.HEADER.size - 1], "shorter than"),
    (lambda b: b[:-len("req-b") - 1], "1 request ids for its 2"),  # the last id cut off
    (lambda b: b + b"\0x", "3 request ids for its 2"),
    (lambda b: b[:step_wire.HEADER.size + 3], "too short for its"),
    (lambda b: b[:step_wire.HEADER.size - 12] + bytes(4) + b[step_wire.HEADER.size - 8:], "no shares"),  # n = 0
    (lambda b: b[:step_wire.HEADER.size - 4] + struct.pack("<I", 3) + b[step_wire.HEADER.size:],
     "3 prompt lengths for its 2"),
    (lambda b: b[:step_wire.HEADER.size + 16] + struct.pack("<I", 2) + b[step_wire.HEADER.size + 20:],
     "share index beyond its 2"),  # prompt_at out of range (after 2 tokens, 2 computed)
    (lambda b: bytes([1]) + b[1:], "wire version 1"),  # the layout before vLLM's lists were shipped raw
])
def test_a_record_of_another_version_or_size_is_refused_and_counted_not_misread(mangle, why):
    good = step_wire.encode(record(5))
    with pytest.raises(step_wire.WireError, match=why):
        step_wire.decode(mangle(good))
    with tempfile.TemporaryDirectory() as d:
        guard = Guard()  # its owner's
        receiver = step_transport.StepReceiver(d, guard)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for data in (mangle(good), good):  # the bad one is dropped, the next one still arrives
            sender.sendto(data, receiver.path)
        got = drained(receiver)
        assert [x.step_id for x in got] == [5]
        assert receiver.malformed == 1 and guard.errors == {"step record wire": 1}
        sender.close()
        receiver.close()


def test_pickle_is_not_accepted():
    import pickle

    with pytest.raises(step_wire.WireError):  # the old wire: a frontend never unpickles what arrives
        step_wire.decode(pickle.dumps(record(1), protocol=pickle.HIGHEST_PROTOCOL))
    assert struct.calcsize("<BBqddIIIdBdddddIII") == step_wire.HEADER.size


def test_an_id_with_nul_is_refused_at_the_sender():
    bad = record(1)[:7] + ((["a\0b"], [1], [0], [], [], [], []),) + record(1)[8:]
    with pytest.raises(step_wire.WireError, match="NUL"):
        step_wire.encode(bad)


def steady(step_id: int, ids: list[str], computed: list[int]) -> step_wire.StepPayload:
    """A plain decode batch as the hooks hand it over: one token each, no prompt entries."""
    return step_wire.StepPayload(step_id, 1.0, 1.5, len(ids), 0, 0, 0.5,
                                 step_wire.Shares(list(ids), None, computed, (), (), (), ()), 0, 0.1, 0.2, 0.3, 0.01,
                                 None)


def fields(step) -> tuple:
    return (step.step_id, step.start, step.end, step.ids, step.tokens, list(step.prefill_at), step.contexts,
            step.running, step.waiting, step.preempted, step.kv_cache_usage, step.queue_blocked, step.schedule_s,
            step.execute_s, step.output_s, step.idle_s, step.model_s)


def test_a_steady_batch_leaves_its_ids_out_and_decodes_to_the_same_records():
    """With a three-item cache on both sides, a record whose ids are those of the record before
    (step_id - 1) carries no id bytes (SAME_IDS) and decodes to exactly the record a full one gives."""
    ids = [f"cmpl-{i:032x}-0" for i in range(64)]
    other = ids[:-1] + ["cmpl-new-0"]
    sender, receiver = step_wire.sender_cache(), step_wire.reader_cache()
    batches = [ids, ids, ids, other, other, ids]
    sizes, flags = [], []
    for step_id, batch in enumerate(batches, start=10):
        payload = steady(step_id, batch, [100 + step_id + i for i in range(len(batch))])
        data = step_wire.encode(payload, sender, True)
        full = step_wire.encode(payload)  # no cache: always every id
        sizes.append((len(data), len(full)))
        flags.append(bool(data[1] & step_wire._SAME_IDS))
        assert fields(step_wire.decode(data, receiver)) == fields(step_wire.decode(full)) == fields(step_hooks.decode(payload))
    assert flags == [False, True, True, False, True, False]  # a new batch lists its ids once
    joined = [len("\0".join(batch).encode()) for batch in batches]
    assert [s for s, _ in sizes] == [f - (j if same else 0) for (_, f), same, j in zip(sizes, flags, joined)]
    # without same_ids (a frontend reads datagrams) the ids are always listed, and the cache's last step kept
    listed = step_wire.sender_cache()
    assert [step_wire.encode(steady(i, ids, [1] * 64), listed)[1] & step_wire._SAME_IDS for i in (1, 2, 3)] == [0] * 3
    assert listed[step_wire.CACHE_LAST_STEP] is None
    for bad in ([None, b""], (None, b"", None)):  # a cache is a list of three: anything else is refused by name
        with pytest.raises(ValueError, match="list of three"):
            step_wire.encode(steady(1, ids, [1] * 64), bad, True)
        with pytest.raises(ValueError, match="list of three"):
            step_wire.decode(step_wire.encode(steady(1, ids, [1] * 64)), bad)


def test_a_record_reusing_ids_is_refused_unless_its_reader_read_the_record_before():
    """A reader that missed the record before (lost, refused, or it came later) refuses a SAME_IDS
    record, never reuses older ids; a refused full record lends its ids to nobody."""
    ids = [f"r{i}" for i in range(8)]
    sender = step_wire.sender_cache()
    records = [step_wire.encode(steady(i, ids, list(range(8))), sender, True) for i in range(1, 6)]
    assert [bool(r[1] & step_wire._SAME_IDS) for r in records] == [False, True, True, True, True]
    for cache in (None, step_wire.reader_cache()):  # no cache, one that read nothing
        with pytest.raises(step_wire.WireError, match="lost"):
            step_wire.decode(records[1], cache)
    reader: list = [None, None, None]
    assert step_wire.decode(records[0], reader).ids == ids
    with pytest.raises(step_wire.WireError, match="lost"):  # record 2 missed: 3 is refused
        step_wire.decode(records[2], reader)
    with pytest.raises(step_wire.WireError, match="ids where none should be"):
        step_wire.decode(records[1] + b"x", reader)
    assert step_wire.decode(records[1], reader).ids == ids  # the record after the one it read: fine
    # a full record refused after its ids were read (a share index out of range) lends them to nobody
    mangled = step_wire.encode(steady(100, ["x", "y"], [1, 2]))
    mangled = bytearray(mangled)
    mangled[step_wire.HEADER.size - 8:step_wire.HEADER.size - 4] = struct.pack("<I", 1)  # z = 1 ...
    bad = bytes(mangled[:step_wire.HEADER.size + 8]) + struct.pack("<I", 5) + bytes(mangled[step_wire.HEADER.size + 8:])
    with pytest.raises(step_wire.WireError, match="beyond"):  # ... at index 5 of 2
        step_wire.decode(bad, reader)
    same_after = step_wire.encode(steady(101, ["x", "y"], [1, 2]), [["x", "y"], b"x\0y", 100], True)
    assert same_after[1] & step_wire._SAME_IDS
    with pytest.raises(step_wire.WireError, match="lost"):
        step_wire.decode(same_after, reader)
    assert reader[1] == ids and reader[2] == 2


def test_an_encoding_failure_or_datagram_frontends_make_every_record_list_its_ids(monkeypatch, transport):
    """The sink leaves ids out only while every frontend reads a ring of its own; after a record it
    could not encode (its ids already compared), the next one lists them again. Every record reaches the frontend, none refused."""
    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        raw: list = []
        take = receiver._take
        monkeypatch.setattr(receiver, "_take", lambda data, deliver, ids=None: (raw.append(data), take(data, deliver, ids)))
        sink = step_transport.SocketSink(d)
        ids = [f"cmpl-{i}" for i in range(16)]
        for step_id in range(1, 5):
            sink(steady(step_id, ids, [7] * 16))
        with pytest.raises((OverflowError, struct.error)):  # a count out of the wire's range: after the ids
            sink(steady(5, ids, [1 << 32] * 16))
        for step_id in range(6, 9):
            sink(steady(step_id, ids, [7] * 16))
        got = drained(receiver)
        assert [s.step_id for s in got] == [1, 2, 3, 4, 6, 7, 8] and all(s.ids == ids for s in got)
        same = [bool(data[1] & step_wire._SAME_IDS) for data in raw]
        assert same == ([False, True, True, True, False, True, True] if transport == "ring" else [False] * 7)
        assert receiver.malformed == 0 and sink.dropped == 0
        receiver.close()
        sink.close()


def _qlen() -> int:
    """The datagrams a Unix socket queues (net.unix.max_dgram_qlen; 10 by default)."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 10


@pytest.fixture
def datagrams(monkeypatch):
    """A frontend's receiver and an EngineCore's sink on datagrams (no ring): the non-x86 channel."""
    monkeypatch.setattr(step_transport.SocketSink, "RING", False)
    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        sink = step_transport.SocketSink(d)
        try:
            yield receiver, sink
        finally:
            sink.close()
            receiver.close()


def test_a_burst_beyond_the_datagram_queue_is_held_and_goes_as_one_batch_in_order(datagrams):
    """A datagram socket queues max_dgram_qlen datagrams however small: a tiny model's steps outrun an agent
    that reads every 20 ms. What the socket refuses is held and goes with the next record, as one datagram."""
    receiver, sink = datagrams
    burst = _qlen() + 20
    for step_id in range(1, burst + 1):  # nobody reads
        sink(record(step_id))
    assert sink.dropped == 0 and burst - _qlen() - 1 <= sink.held < burst  # Linux queues one past its limit
    queued = burst - sink.held
    got = drained(receiver)
    assert [s.step_id for s in got] == list(range(1, queued + 1))  # what the socket queued
    sink(record(burst + 1))  # room again: what was held, and this one, in one datagram
    assert sink.held == 0
    raw: list = []
    take = receiver._take
    receiver._take = lambda data, deliver, ids=None: (raw.append(data), take(data, deliver, ids))
    got += drained(receiver)  # one read gets them all, in order
    assert [s.step_id for s in got] == list(range(1, burst + 2)) and len(raw) == burst + 1 - queued
    assert sink.dropped == 0 and receiver.malformed == receiver.failed == 0


def test_the_backlog_is_bounded_and_what_does_not_fit_is_counted(datagrams, monkeypatch):
    receiver, sink = datagrams
    monkeypatch.setattr(sink, "MAX_BACKLOG", 5)
    burst = _qlen() + 20
    for step_id in range(1, burst + 1):
        sink(record(step_id))
    assert sink.held == 5
    queued = burst - 5 - sink.dropped
    assert sink.dropped == burst - queued - 5 > 0
    got = drained(receiver)
    sink(record(burst + 1))
    got += drained(receiver)
    # the newest of the burst went: what was held kept its order, before the next record
    assert [s.step_id for s in got] == list(range(1, queued + 6)) + [burst + 1]
    monkeypatch.setattr(sink, "MAX_BACKLOG_BYTES", 10)  # no record fits: a refused one is dropped, counted
    before = sink.dropped
    for step_id in range(burst + 2, 2 * burst + 2):
        sink(record(step_id))
    # every record the socket refused is counted: none held, none lost uncounted
    assert sink.held == 0 and sink.dropped - before == burst - len(drained(receiver)) > 0


def test_requests_sent_while_steps_are_held_keep_their_place(datagrams):
    """The agent's order rule: a request's finish follows the steps that served it. A request record sent while
    steps are held goes after them, in the same batch."""
    receiver, sink = datagrams
    receiver.take_requests = True
    for step_id in range(1, _qlen() + 3):
        sink(record(step_id))
    held = sink.held
    assert held >= 1
    finish = records.encode(records.RequestFinish(request_id="req-a", reason="stop", arrival=1.0, queued=1.0, end=2.5,
                                                  end_wall=2.5, prompt_tokens=16, output_tokens=3))
    sink.send_request(finish)
    sink.flush_requests()  # still full: held after the steps
    assert sink.held == held + 1 and sink.requests_dropped == sink.dropped == 0
    got = drained(receiver)
    sink.flush_requests()  # read: the steps, then the finish
    got += drained(receiver)
    kinds = [type(x).__name__ for x in got]
    assert kinds == ["StepRecord"] * (_qlen() + 2) + ["RequestFinish"]
    assert [s.step_id for s in got[:-1]] == list(range(1, _qlen() + 3))


def test_an_idle_engine_waits_a_bounded_moment_then_counts_what_it_still_holds(datagrams, monkeypatch):
    receiver, sink = datagrams
    hooks = step_hooks.StepHooks()
    hooks.sink, hooks.on_idle = sink, sink.idle
    for step_id in range(1, _qlen() + 6):
        sink(record(step_id))
    held = sink.held
    assert held >= 1
    monkeypatch.setattr(sink, "IDLE_WAIT_S", 0.0)  # nobody reads: nothing to wait for in a test
    waited = []
    monkeypatch.setattr(step_transport.select, "poll", lambda: SimpleNamespace(
        register=lambda fd, ev: None, poll=lambda ms: waited.append(ms) or []))
    busy = SimpleNamespace(requests={"r": object()})
    hooks.update_from_output(lambda *a: {}, busy, (None, None), {})  # a next step is coming: no idle
    assert sink.held == held and waited == []
    idle = SimpleNamespace(requests={})
    hooks.update_from_output(lambda *a: {}, idle, (None, None), {})  # idle: it goes, or is counted
    assert waited == [0] and sink.held == 0 and sink.dropped == held
    monkeypatch.undo()
    got = drained(receiver)
    assert [s.step_id for s in got] == list(range(1, _qlen() + 6 - held))
    # read in time: an idle engine sends what it holds
    for step_id in range(100, 100 + _qlen() + 3):
        sink(record(step_id))
    assert sink.held
    drained(receiver)
    sink.idle()
    assert sink.held == 0 and [s.step_id for s in drained(receiver)][-1] == 100 + _qlen() + 2


def test_a_batch_holding_anything_but_records_is_refused_and_counted(datagrams):
    """Every byte of a batch is untrusted: records.unbatch bounds it, and each item is a step or a request
    record; an empty item, a batch inside it, a control record, a step of another wire are each counted."""
    receiver, _ = datagrams
    for items in ([b""], [records.batch([b"x"])], [bytes((engine_errors.CONTROL,)) * 8], [b"\x7f" * 8]):
        before = receiver.malformed
        receiver._batch(records.batch(items), lambda x: None)
        assert receiver.malformed == before + 1
    receiver._batch(bytes((records.TAG, records.BATCH)) + b"\xff" * 10, lambda x: None)  # not a batch's shape
    assert receiver.malformed == 5 and receiver.failed == 0


def test_request_records_go_into_the_ring_in_order_with_the_steps(monkeypatch):
    """Where a frontend reads a ring, an EngineCore's request records go into it too: its socket queues
    max_dgram_qlen datagrams, and a start held back there while the ring carried its request's first steps
    would reach the agent after them (its steps then served no request it knew)."""
    if not shm_ring.AVAILABLE:
        pytest.skip("no step rings on this platform")
    monkeypatch.setattr(step_transport.SocketSink, "RING", True)
    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)
        receiver.take_requests = True
        sink = step_transport.SocketSink(d)
        try:
            n = _qlen() + 5  # more moments than the socket would queue, nobody reading
            for i in range(1, n + 1):
                start = records.encode(records.RequestStart(request_id=f"req-{i}", arrival=1.0, queued=1.0,
                                                            prompt_tokens=16))
                sink.send_request(start)
                if i % 2:  # two records of one moment go as one batch
                    sink.send_request(start)
                sink(record(i))
            got = drained(receiver)
        finally:
            sink.close()
            receiver.close()
    order = [(type(x).__name__, getattr(x, "request_id", getattr(x, "step_id", None))) for x in got]
    expected = []
    for i in range(1, n + 1):
        expected += [("RequestStart", f"req-{i}")] * (2 if i % 2 else 1) + [("StepRecord", i)]
    assert order == expected
    assert sink.requests_dropped == sink.dropped == sink.held == 0
    assert receiver.malformed == receiver.failed == 0


def test_a_frontend_that_takes_no_request_records_skips_them_in_its_ring(monkeypatch):
    if not shm_ring.AVAILABLE:
        pytest.skip("no step rings on this platform")
    monkeypatch.setattr(step_transport.SocketSink, "RING", True)
    with tempfile.TemporaryDirectory() as d:
        receiver = step_transport.StepReceiver(d)  # a Python frontend's own receiver: take_requests False
        sink = step_transport.SocketSink(d)
        try:
            for i in range(1, 4):
                finish = records.encode(records.RequestFinish(request_id=f"req-{i}", reason="stop", arrival=1.0,
                                                              queued=1.0, end=2.5, end_wall=2.5, prompt_tokens=16,
                                                              output_tokens=3))
                sink.send_request(finish)
                sink.send_request(finish)
                sink(record(i))
            got = drained(receiver)
        finally:
            sink.close()
            receiver.close()
    assert [x.step_id for x in got] == [1, 2, 3]
    assert receiver.malformed == receiver.failed == 0
