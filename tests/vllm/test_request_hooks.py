"""The EngineCore's request records (request_hooks.py) from vLLM's ``Request`` fields, through the step sink's
socket to a receiver that takes them (the agent's), and not to one that does not (a Python frontend's)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from types import SimpleNamespace
from typing import Iterator

from otel_llm.agent.records import RequestFinish, RequestStart, SinkCounts
from otel_llm.instrumentation.vllm import request_hooks
from otel_llm.instrumentation.vllm.request_hooks import RequestHooks
from otel_llm.instrumentation.vllm.step_transport import DROP_STARTS_AFTER_ENV, SocketSink, StepReceiver


class Params:
    max_tokens, temperature, top_p, seed, top_k = 8, 0.0, None, None, 0
    frequency_penalty = presence_penalty = 0.0
    stop, n = None, 1


def _request(rid: str = "cmpl-x-0-abcdefgh", output: int = 0, reason: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, arrival_time=1700000000.25, num_prompt_tokens=12, sampling_params=Params(),
                           lora_request=None, trace_headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
                           client_index=0, num_output_tokens=output, num_preemptions=1,
                           get_finished_reason=lambda: reason)


def test_start_and_finish_records_carry_the_engines_facts(monkeypatch):
    monkeypatch.setenv(request_hooks.ENGINE_MODEL_ENV, "tiny")
    sent = []
    clock = iter([10.0, 10.5, 11.5])  # the continuation reads it too
    hooks = RequestHooks(sent.append, clock=lambda: next(clock), wall=lambda: 1700000002.0)
    engine_request = SimpleNamespace(request_id="cmpl-x-0-abcdefgh", external_req_id="cmpl-x-0")
    hooks.preprocess(lambda request: ("req", 0), None, (engine_request,), {})
    scheduler = SimpleNamespace(requests={})
    hooks.add_request(lambda request: scheduler.requests.__setitem__(request.request_id, request), scheduler,
                      (_request(),), {})
    hooks.add_request(lambda request: None, scheduler, (_request(),), {})  # a streaming continuation: no record
    hooks.free_request(lambda request: None, scheduler, (_request(output=8, reason="length"),), {})
    from otel_llm.agent.records import decode
    start, finish = map(decode, sent)
    assert start == RequestStart(request_id="cmpl-x-0-abcdefgh", arrival=1700000000.25, queued=10.0, prompt_tokens=12,
                                 external_id="cmpl-x-0", model="tiny",
                                 trace_headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
                                 sampling={"gen_ai.request.max_tokens": 8, "gen_ai.request.temperature": 0.0})
    assert finish == RequestFinish(request_id="cmpl-x-0-abcdefgh", reason="length", arrival=1700000000.25,
                                   queued=10.0, end=11.5, end_wall=1700000002.0, prompt_tokens=12, output_tokens=8,
                                   preemptions=1, external_id="cmpl-x-0", model="tiny")
    assert not hooks.live and not hooks.external


def test_a_hook_error_reaches_the_guard_never_the_engine():
    def broken(data: bytes) -> None:
        raise OSError("gone")
    hooks = RequestHooks(broken)
    scheduler = SimpleNamespace(requests={})
    assert hooks.free_request(lambda request: "freed", scheduler, (_request(reason="abort"),), {}) == "freed"
    assert any("request finish" in site for site in hooks.guard.errors)


def test_records_reach_the_receiver_that_takes_them_on_the_step_socket():
    with tempfile.TemporaryDirectory() as directory:
        receiver = StepReceiver(directory)
        sink = SocketSink(directory)
        sink.RING = False  # the socket either way: request records never take the ring
        try:
            hooks = RequestHooks(sink.send_request)
            scheduler = SimpleNamespace(requests={})
            hooks.add_request(lambda request: None, scheduler, (_request(),), {})  # first: the sink looks now
            got: list = []
            receiver.drain(got.append)
            assert got == []  # a Python frontend's receiver skips them
            receiver.take_requests = True
            hooks.free_request(lambda request: None, scheduler, (_request(output=3, reason="stop"),), {})
            receiver.drain(got.append)
            assert [type(x) for x in got] == [RequestFinish] and got[0].reason == "stop"
            receiver.sock.close()
            os.unlink(receiver.path)
            hooks.free_request(lambda request: None, scheduler, (_request(output=3, reason="stop"),), {})
            assert sink.requests_dropped == 1  # the frontend is gone: counted, forgotten
            assert sink._targets == []
        finally:
            sink.close()


@contextlib.contextmanager
def _agents_channel() -> Iterator[tuple[StepReceiver, SocketSink, RequestHooks, SimpleNamespace]]:
    """A receiver that takes request records (the agent's), a sink on sockets, hooks sending through it."""
    with tempfile.TemporaryDirectory() as directory:
        receiver = StepReceiver(directory)
        receiver.take_requests = True
        sink = SocketSink(directory)
        sink.RING = False
        try:
            yield receiver, sink, RequestHooks(sink.send_request), SimpleNamespace(requests={})
        finally:
            sink.close()
            receiver.close()


def test_a_receiver_that_stopped_reading_costs_counted_records_never_a_wait():
    with _agents_channel() as (receiver, sink, hooks, scheduler):
        sent = 0
        while sink.requests_dropped == 0 and sent < 200_000:  # nobody reads: the socket's buffer fills
            hooks.free_request(lambda request: None, scheduler, (_request(f"r{sent}", 3, "stop"),), {})
            sent += 1
        assert sink.requests_dropped == 1 and sent > 1
        assert sink._targets  # a full socket is a lagging reader, not a gone one
        got: list = []
        receiver.drain(got.append)
        assert len(got) == sent - 1 and all(isinstance(x, RequestFinish) for x in got)


def test_the_sinks_drop_counts_follow_the_next_record_that_gets_through(monkeypatch):
    """The test-only fault (``DROP_STARTS_AFTER_ENV``, read when the sink is made) drops the starts after the
    first, counted; the next record that got through is followed by the sink's counts (``SinkCounts``), and a
    rescan sends them when the step drops changed, never when nothing did."""
    monkeypatch.setenv(DROP_STARTS_AFTER_ENV, "1")
    with _agents_channel() as (receiver, sink, hooks, scheduler):
        for rid in ("a", "b", "c"):
            hooks.add_request(lambda request: None, scheduler, (_request(rid),), {})
        hooks.free_request(lambda request: None, scheduler, (_request("b", 3, "stop"),), {})
        got: list = []
        receiver.drain(got.append)
        assert [type(x) for x in got] == [RequestStart, RequestFinish, SinkCounts]
        assert got[0].request_id == "a" and got[1].request_id == "b"
        assert got[2] == SinkCounts(pid=os.getpid(), steps_dropped=0, requests_dropped=2)
        hooks.free_request(lambda request: None, scheduler, (_request("c", 3, "stop"),), {})
        sink._rescan(1e9)  # nothing changed: no counts
        got.clear()
        receiver.drain(got.append)
        assert [type(x) for x in got] == [RequestFinish]
        sink.dropped += 5  # steps a full ring refused
        sink._rescan(2e9)
        got.clear()
        receiver.drain(got.append)
        assert got == [SinkCounts(pid=os.getpid(), steps_dropped=5, requests_dropped=2)]


def test_without_the_fault_the_sink_sends_every_start(monkeypatch):
    monkeypatch.delenv(DROP_STARTS_AFTER_ENV, raising=False)
    with tempfile.TemporaryDirectory() as directory:
        sink = SocketSink(directory)
        try:
            assert "send_request" not in vars(sink)  # the class's method: nothing checked per record
        finally:
            sink.close()


def _launch(building: int, local_client: bool, rust: str, monkeypatch) -> list:
    """``VLLMWrappers.launching_engines`` on a stand-in: whether it made this launch's EngineCores the source."""
    from otel_llm.guard import Guard
    from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers
    from otel_llm.instrumentation.wraps import Binders

    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", rust)
    became: list = []
    w = SimpleNamespace(bind=Binders(), building=building, guard=Guard(), _become_source=became.append)

    def __init__(local_engine_count, start_index, local_start_index, vllm_config, local_client,
                 handshake_address, executor_class, log_stats):
        return "launched"
    assert VLLMWrappers.launching_engines(w, __init__, None, (1, 0, 0, "config", local_client, "addr", None, True),
                                          {}) == "launched"
    return became


def test_only_engines_no_python_client_will_hold_become_their_requests_source(monkeypatch):
    assert _launch(0, True, "1", monkeypatch) == ["config"]  # the Rust frontend's supervisor
    assert _launch(0, False, "0", monkeypatch) == ["config"]  # --headless
    assert _launch(0, True, "0", monkeypatch) == []  # several Python API servers: each its own source
    assert _launch(1, True, "1", monkeypatch) == []  # an AsyncLLM / LLM being built here: its hooks are the source
