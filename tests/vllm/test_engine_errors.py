"""Errors caught in a spawned EngineCore reach the frontend's stats(): the control record on the step socket
(engine_errors.py), over real Unix sockets, and the step hooks reporting an error of a step that sends no record."""

from __future__ import annotations

import json
import time

import pytest

from otel_llm.guard import Guard
from otel_llm.instrumentation.vllm import engine_errors
from otel_llm.instrumentation.vllm.engine_errors import ErrorReporter
from otel_llm.instrumentation.vllm.step_hooks import StepHooks
from otel_llm.instrumentation.vllm.step_transport import SocketSink, StepReceiver

SITE = "scheduler.schedule hook"


@pytest.fixture
def guard():
    """The frontend's guard (its instrumentor's): where the EngineCores' and workers' counts are added."""
    return Guard()


@pytest.fixture
def engine():
    """The EngineCore's guard (the plugin's EngineSide's), in a process of its own."""
    return Guard()


@pytest.fixture
def wire(tmp_path, guard, engine):
    receiver = StepReceiver(str(tmp_path), guard)
    sink = SocketSink(str(tmp_path), engine)
    sink._rescan(time.monotonic())  # connects to the receiver's socket
    yield sink, receiver
    sink.close()
    receiver.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_frontend_counts_the_engine_cores_errors_once_each(guard, engine, wire):
    sink, receiver = wire
    clock = _Clock()
    reporter = ErrorReporter(sink.send_control, clock, guard=engine)
    engine.errors[SITE] += 3
    reporter.changed()
    receiver.drain(lambda step: None)
    assert guard.errors == {engine_errors.PREFIX + SITE: 3}
    engine.errors[SITE] += 2
    clock.now += 0.1
    reporter.changed()  # within the interval: held back
    receiver.drain(lambda step: None)
    assert guard.errors[engine_errors.PREFIX + SITE] == 3
    clock.now += 1.0
    reporter.changed()  # the sink's rescan or the next error sends it
    receiver.drain(lambda step: None)
    assert guard.errors[engine_errors.PREFIX + SITE] == 5  # increases only, never the cumulative count twice
    # a site relayed to this guard is not the engine's own (a process that is both): never sent on
    engine.errors[engine_errors.PREFIX + "elsewhere"] += 1
    clock.now += 1.0
    reporter.changed()
    receiver.drain(lambda step: None)
    assert guard.errors == {engine_errors.PREFIX + SITE: 5}


def test_the_contract_warnings_are_not_relayed_and_a_bad_record_is_counted(guard, engine, wire):
    sink, receiver = wire
    engine.errors["vllm contract: NewRequestData.req_id"] += 1  # the frontend checks that itself
    assert b"vllm contract" not in engine_errors.encode(1, dict(engine.errors))
    before = receiver.malformed
    sink.send_control(bytes((engine_errors.CONTROL,)) + b"not json")
    receiver.drain(lambda step: None)
    assert receiver.malformed == before + 1
    assert guard.errors == {"step control record": 1}  # in the receiver's owner's guard


def test_a_failing_schedule_hook_reports_though_its_step_sends_nothing(engine):
    hooks = StepHooks(guard=engine)
    told = []
    sent = []
    hooks.sink = sent.append
    hooks.on_error = lambda: told.append(dict(engine.errors))

    class Broken:  # a scheduler output without what the hook reads
        pass

    out = Broken()
    assert hooks.schedule(lambda: out, object(), (), {}) is out  # the host's result, untouched
    assert told and told[0].get(SITE) == 1 and not sent


@pytest.fixture
def worker(guard, engine, tmp_path):
    """A worker's channel (engine_errors.WorkerErrors) and a frontend's receiver, on real Unix sockets in one
    step directory; the worker's reporter listening to the worker's guard (``engine``: its EngineSide's) as
    ``worker_errors`` sets it up, with its held-back sends captured instead of timed."""
    receiver = StepReceiver(str(tmp_path), guard)
    channel = engine_errors.WorkerErrors(str(tmp_path), engine)
    clock = _Clock()
    later: list = []
    channel.reporter.clock = clock
    channel.reporter.later = lambda delay, call: later.append((delay, call))
    engine.listeners.append(channel.reporter.changed)
    yield channel, receiver, clock, later
    channel.close()
    receiver.close()


def test_a_workers_errors_reach_the_frontend_on_its_own_channel(worker, guard, engine, caplog):
    channel, receiver, clock, later = worker
    site = "model runner timer"
    with caplog.at_level("WARNING", "otel_llm"):
        engine.failed(site, TypeError("a bug of ours"))  # in the worker: told to the reporter at once
        receiver.drain(lambda step: None)
    assert guard.errors[engine_errors.WORKER_PREFIX + site] == 1
    said = [r.getMessage() for r in caplog.records if "vLLM worker process" in r.getMessage()]
    assert len(said) == 1 and site in said[0]
    engine.failed(site, TypeError("again"))
    engine.failed(site, TypeError("and again"))
    receiver.drain(lambda step: None)
    assert guard.errors[engine_errors.WORKER_PREFIX + site] == 1  # within the interval: held back, one send pending
    assert len(later) == 1 and 0 < later[0][0] <= engine_errors.ErrorReporter.MIN_INTERVAL_S
    clock.now += 1.0
    caplog.clear()
    with caplog.at_level("WARNING", "otel_llm"):
        later[0][1]()  # the one-shot timer fires
        receiver.drain(lambda step: None)
    assert guard.errors[engine_errors.WORKER_PREFIX + site] == 3
    assert engine.errors == {site: 3}  # the worker's own, unprefixed
    assert not [r for r in caplog.records if "vLLM worker process" in r.getMessage()]  # said once per site


def test_a_workers_contract_sites_are_relayed_and_an_engine_cores_are_not():
    errors = {"vllm contract: GPUModelRunner.sample_tokens": 1, "kv connector (worker)": 2}
    worker = json.loads(engine_errors.encode(7, errors, engine_errors.WORKER, contract=True)[1:])
    engine = json.loads(engine_errors.encode(8, errors)[1:])
    assert worker == {"pid": 7, "errors": errors, "role": "worker"}
    assert engine == {"pid": 8, "errors": {"kv connector (worker)": 2}}


def test_a_worker_with_no_frontend_loses_its_counts_quietly(engine, tmp_path):
    channel = engine_errors.WorkerErrors(str(tmp_path / "gone"), engine)
    channel.send(b"\xc0{}")  # no directory: nothing raises
    (tmp_path / "stale.sock").write_text("")  # not a socket: the send fails and is counted
    channel.directory = str(tmp_path)
    channel.send(b"\xc0{}")
    assert channel.dropped == 1
    channel.close()
