"""Engine-step records from one EngineCore to every frontend socket in the step directory."""

from __future__ import annotations

import os
import tempfile

from otel_llm.instrumentation.vllm import steps


def record(step_id: int) -> tuple:
    return (step_id, 1.0, 2.0, 3, 0, 0, 0.25, [("req-a", 16, True), ("req-b", 1, False)], 0)


def drained(receiver: steps.StepReceiver) -> list:
    got: list = []
    receiver.drain(got.append)
    return got


def test_every_frontend_gets_every_step_and_late_or_dead_ones_are_handled(monkeypatch):
    with tempfile.TemporaryDirectory() as d:
        a = steps.StepReceiver(d)
        monkeypatch.setattr(os, "getpid", lambda: 999_001)  # a second frontend process
        b = steps.StepReceiver(d)
        monkeypatch.undo()
        sink = steps.SocketSink(d)
        sink(record(1))
        (r,) = drained(a)
        assert [x.step_id for x in drained(b)] == [1]
        assert (r.step_id, r.requests, r.kv_cache_usage) == (1, [("req-a", 16, True), ("req-b", 1, False)], 0.25)

        # a frontend that binds after the engine started is found on the next rescan
        monkeypatch.setattr(os, "getpid", lambda: 999_002)
        c = steps.StepReceiver(d)
        monkeypatch.undo()
        sink._scanned = float("-inf")  # as if RESCAN_S had passed
        sink(record(2))
        assert [x.step_id for x in drained(c)] == [2] and [x.step_id for x in drained(a)] == [2]

        # a frontend that died: counted once, its stale socket removed, the others unaffected
        b.sock.close()
        sink(record(3))
        assert sink.dropped == 1 and not os.path.exists(b.path)
        sink(record(4))
        assert sink.dropped == 1
        assert [x.step_id for x in drained(a)] == [3, 4] and [x.step_id for x in drained(c)] == [3, 4]
        a.close()
        c.close()
        assert os.listdir(d) == []


def test_api_server_processes_join_the_inherited_directory_others_make_their_own(monkeypatch):
    import multiprocessing

    with tempfile.TemporaryDirectory() as inherited:
        monkeypatch.setenv(steps.STEP_DIR_ENV, inherited)
        monkeypatch.setattr(steps, "_dir", None)
        monkeypatch.setattr(multiprocessing.current_process(), "name", "ApiServer_1")
        assert steps.step_dir() == inherited

        monkeypatch.setattr(steps, "_dir", None)
        monkeypatch.setattr(multiprocessing.current_process(), "name", "MainProcess")
        own = steps.step_dir()  # e.g. a server started by an instrumented test process
        assert own != inherited and os.environ[steps.STEP_DIR_ENV] == own
        os.rmdir(own)
