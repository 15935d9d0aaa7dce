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
            hooks = RequestHooks(sink.send_request, flush=sink.flush_requests)
            scheduler = SimpleNamespace(requests={})
            hooks.add_request(lambda request: None, scheduler, (_request(),), {})  # queued until a step or idle
            hooks.free_request(lambda request: None, scheduler, (_request(output=3, reason="stop"),), {})
            got: list = []
            receiver.drain(got.append)
            assert got == []  # a Python frontend's receiver skips them
            receiver.take_requests = True
            hooks.add_request(lambda request: None, scheduler, (_request(),), {})
            hooks.free_request(lambda request: None, scheduler, (_request(output=3, reason="stop"),), {})  # idle
            receiver.drain(got.append)
            assert [type(x) for x in got] == [RequestStart, RequestFinish] and got[1].reason == "stop"
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
            yield receiver, sink, RequestHooks(sink.send_request, flush=sink.flush_requests), SimpleNamespace(requests={})
        finally:
            sink.close()
            receiver.close()


def test_a_receiver_that_stopped_reading_costs_counted_records_never_a_wait():
    with _agents_channel() as (receiver, sink, hooks, scheduler):
        sent = 0
        while sink.requests_dropped == 0 and sent < 200_000:  # nobody reads: the socket's buffer fills
            hooks.free_request(lambda request: None, scheduler, (_request(f"r{sent}", 3, "stop"),), {})
            sent += 1
        # the socket's queue full, the sink held what it refused, up to its backlog's bound, then dropped
        assert sink.requests_dropped == 1 and sink.held == SocketSink.MAX_BACKLOG and sent > SocketSink.MAX_BACKLOG
        assert sink._targets  # a full socket is a lagging reader, not a gone one
        got: list = []
        receiver.drain(got.append)
        assert len(got) == sent - 1 - SocketSink.MAX_BACKLOG and all(isinstance(x, RequestFinish) for x in got)
        sink.flush_requests()  # read: what it held goes as one datagram
        receiver.drain(got.append)
        assert len(got) == sent - 1 and sink.held == 0 and sink.requests_dropped == 1
        assert [x.request_id for x in got] == [f"r{i}" for i in range(sent - 1)]


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
        # the counts go at the rescan that sending looks for the frontends at, or after the records that got
        # through: before or after the batch, once
        counts = [x for x in got if type(x) is SinkCounts]
        assert counts == [SinkCounts(pid=os.getpid(), steps_dropped=0, requests_dropped=2)]
        got = [x for x in got if type(x) is not SinkCounts]
        assert [type(x) for x in got] == [RequestStart, RequestFinish]
        assert got[0].request_id == "a" and got[1].request_id == "b"
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


def test_a_burst_of_requests_goes_as_one_datagram_before_the_step_that_serves_them():
    """A datagram socket queues 10 datagrams (net.unix.max_dgram_qlen's default): 40 requests added at once,
    one datagram each, would mostly be lost. Queued, they go before the next step's record, in one datagram."""
    with _agents_channel() as (receiver, sink, hooks, _):
        scheduler = SimpleNamespace(requests={"busy": object()})  # not idle: nothing flushes but the step
        for i in range(40):
            hooks.add_request(lambda request: None, scheduler, (_request(f"r{i}"),), {})
        got: list = []
        receiver.drain(got.append)
        assert got == []  # queued
        step = ((5 << 32) | 1, 1.0, 2.0, 3, 0, 0, 0.25, (["r0"], [16], [0], [], [0], [16], [0]), 0, 0.001,
                0.008, 0.001, None, 0.006)
        sink(step)
        receiver.drain(got.append)
        assert [x.request_id for x in got[:40]] == [f"r{i}" for i in range(40)]  # all, first
        assert len(got) == 41 and got[40].step_id == step[0] and sink.requests_dropped == 0


def _launch(building: int, local_client: bool, rust: str, monkeypatch, enriched: list | None = None) -> list:
    """``VLLMWrappers.launching_engines`` on a stand-in: whether it made this launch's EngineCores the source
    (``enriched``: the launches a Python engine client being built here asked to be enriched)."""
    from otel_llm.guard import Guard
    from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers
    from otel_llm.instrumentation.wraps import Binders

    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", rust)
    became: list = []
    w = SimpleNamespace(bind=Binders(), building=building, guard=Guard(), _become_source=became.append,
                        _enrich_engines=(enriched if enriched is not None else []).append,
                        _enrich_api_servers=lambda config: became.append(("api servers", config)))

    def __init__(local_engine_count, start_index, local_start_index, vllm_config, local_client,
                 handshake_address, executor_class, log_stats):
        return "launched"
    assert VLLMWrappers.launching_engines(w, __init__, None, (1, 0, 0, "config", local_client, "addr", None, True),
                                          {}) == "launched"
    assert not w.guard.errors
    return became


def test_only_engines_no_python_client_will_hold_become_their_requests_source(monkeypatch):
    assert _launch(0, True, "1", monkeypatch) == ["config"]  # the Rust frontend's supervisor
    assert _launch(0, False, "0", monkeypatch) == ["config"]  # --headless
    # several Python API servers: each enriches its own requests (their agents keep their client_index's)
    assert _launch(0, True, "0", monkeypatch) == [("api servers", "config")]
    enriched: list = []
    assert _launch(1, True, "1", monkeypatch, enriched) == []  # an AsyncLLM / LLM being built here: its hooks
    assert enriched == ["config"]  # ... or, on the one path, its enrichment of its EngineCores' records


def _enrich_launch(monkeypatch, gives_tokens: bool = True, agent: object = object(),
                   steps: bool = True) -> str | None:
    from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers

    monkeypatch.setenv(request_hooks.ENGINE_REQUESTS_ENV, "1")  # left over from another launch
    w = SimpleNamespace(steps_armed=steps, agent=agent, _enriched_launch=False,
                        _steps_can_give_tokens=lambda config: gives_tokens, _served_name=lambda config: "tiny")
    w._enriches = lambda config: VLLMWrappers._enriches(w, config)
    w._launch_enriched = lambda enriched, config: VLLMWrappers._launch_enriched(w, enriched, config)
    VLLMWrappers._enrich_engines(w, "config")
    assert w._enriched_launch == (os.environ.get(request_hooks.ENGINE_REQUESTS_ENV) == request_hooks.ENRICHED)
    return os.environ.get(request_hooks.ENGINE_REQUESTS_ENV)


def test_the_one_path_asks_a_python_clients_engines_for_their_records_only_where_it_holds(monkeypatch):
    """The one path: the EngineCores of an engine client with an agent whose steps give the token times say
    its requests, marked as enriched; everywhere else they send nothing (a value inherited from an earlier
    launch is cleared: the frontend's own hooks would count the requests again)."""
    assert _enrich_launch(monkeypatch) == request_hooks.ENRICHED
    assert os.environ[request_hooks.ENGINE_MODEL_ENV] == "tiny"
    assert _enrich_launch(monkeypatch, steps=False) is None  # engine_steps=False: no step records at all
    assert _enrich_launch(monkeypatch, gives_tokens=False) is None  # speculative, KV connector
    assert _enrich_launch(monkeypatch, agent=None) is None  # custom providers: in-process


def test_an_api_server_of_several_enriches_where_its_supervisors_launch_asked_for_it(monkeypatch):
    """``--api-server-count N``: the supervisor launches the engines (the variable, inherited by the API
    servers it spawns next); an API server whose agent reads the steps enriches its requests, one without an
    agent stays their source (no process of it takes the engines' request records)."""
    from otel_llm.instrumentation.vllm.wrappers import VLLMWrappers

    def launched(env: str | None, agent: object = object()) -> bool:
        if env is None:
            monkeypatch.delenv(request_hooks.ENGINE_REQUESTS_ENV, raising=False)
        else:
            monkeypatch.setenv(request_hooks.ENGINE_REQUESTS_ENV, env)
        w = SimpleNamespace(steps_armed=True, agent=agent,
                            _steps_can_give_tokens=lambda config: True)
        w._enriches = lambda config: VLLMWrappers._enriches(w, config)
        return VLLMWrappers._launched_enriched(w, "config")

    assert launched(request_hooks.ENRICHED)
    assert not launched(request_hooks.ENRICHED, agent=None)  # custom providers: the in-process pipeline
    assert not launched(None) and not launched("1")  # the supervisor asked for nothing (or for no frontend)


def _enriching_wrappers(capture_content: bool = True, max_requests: int = 1000):
    """A ``VLLMWrappers`` on the one path with a stand-in pipeline and agent link (what it sends: ``sent``)."""
    from otel_llm.core.config import Config
    from otel_llm.core.pipeline import Counts
    from otel_llm.guard import Guard
    from otel_llm.instrumentation.vllm.wrappers import PRESENT, VLLMWrappers

    sent: list = []
    telemetry = SimpleNamespace(guard=Guard(), counts=Counts(), requests={},
                                config=Config(capture_content=capture_content, max_requests=max_requests))
    w = VLLMWrappers(telemetry, open_receiver=lambda: None, open_kv_receiver=lambda: None)
    w.agent, w._reads = SimpleNamespace(send=sent.append), PRESENT
    processor = SimpleNamespace(_otel_llm_model="tiny", _otel_llm_enriches=True, request_states={})
    return w, processor, sent


# vLLM's OutputProcessor.add_request and _update_stats_from_finished, as the wrappers bind their arguments
def _vllm_add_request(request, prompt, parent_req=None, request_index=0, queue=None):
    return None


def _vllm_finished(req_state, finish_reason, iteration_stats):
    return None


def test_the_frontends_enrichment_carries_what_only_it_knows():
    """The one path through ``VLLMWrappers.add_request`` and ``finished`` (vLLM's ``_update_stats_from_finished``)
    on stand-ins: one record, with what the serving layer read (operation, stream, requested model, server),
    the parent as W3C headers, vLLM's own receipt times (TTFT ends at ``arrival + first_token_latency``, e2e at
    the finishing batch), the tokens and characters it received, the n > 1 group; no sampling attributes (the
    engine's start carries them); counted once as a start and once as a finish in the frontend."""
    import contextvars

    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

    from otel_llm.agent.records import RequestEnrichment, decode
    from otel_llm.instrumentation.vllm import wrappers

    w, processor, sent = _enriching_wrappers()
    parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(0xA1, 0xB2, True, TraceFlags(1))))
    fanned = SimpleNamespace(request_id="chatcmpl-1", n=2)
    request = SimpleNamespace(request_id="chatcmpl-1-abcdefgh", external_req_id="chatcmpl-1", sampling_params=Params(),
                              lora_request=None, trace_headers=None)

    def serve() -> None:
        wrappers._OPERATION.set(("chat", SpanKind.SERVER))
        wrappers._STREAM.set(True)
        wrappers._MODEL.set("alias")
        wrappers._SERVER.set(("127.0.0.1", 8000))
        token = otel_context.attach(parent)
        try:
            w.add_request(_vllm_add_request, processor, (request, "hi", fanned, 1), {})
            w.add_request(_vllm_add_request, processor, (request, "hi", fanned, 1), {})  # a streaming continuation
        finally:
            otel_context.detach(token)
    contextvars.copy_context().run(serve)
    assert sent == [] and list(w.enriching) == ["chatcmpl-1-abcdefgh"]
    state = SimpleNamespace(request_id="chatcmpl-1-abcdefgh", detokenizer=SimpleNamespace(output_text="hello"),
                            stats=SimpleNamespace(first_token_latency=0.25, arrival_time=1700000000.0,
                                                  num_generation_tokens=5))
    w.finished(_vllm_finished, processor, (state, "stop", SimpleNamespace(iteration_timestamp=1700000001.5)), {})
    (record,) = map(decode, sent)
    assert record == RequestEnrichment(
        request_id="chatcmpl-1-abcdefgh", operation="chat", server=True,
        parent={"traceparent": f"00-{0xA1:032x}-{0xB2:016x}-01"}, response_id="chatcmpl-1", model="tiny",
        attributes={"gen_ai.request.stream": True, "gen_ai.request.model": "alias", "server.address": "127.0.0.1",
                    "server.port": 8000},
        reason="stop", output_tokens=5, output_characters=5, first_output=1700000000.25, last_output=1700000001.5,
        end=1700000001.5, prompt_text="hi", output_text="hello", group_id="chatcmpl-1", group_size=2,
        group_expected=2, choice_index=1)
    assert (w.telemetry.counts.requests_started, w.telemetry.counts.requests_finished) == (1, 1)
    assert w.enriching == {}


def test_an_offline_enrichment_leaves_out_what_it_does_not_know_and_an_abort_says_no_output():
    """Offline, without a parent, content or a group: those fields stay at their defaults (and off the wire);
    an abort (vLLM's ``abort_requests``) is no output received."""
    from otel_llm.agent.records import RequestEnrichment, decode

    w, processor, sent = _enriching_wrappers(capture_content=False)
    for rid in ("a-1", "b-1"):
        request = SimpleNamespace(request_id=rid, external_req_id=None, sampling_params=Params(), lora_request=None,
                                  trace_headers=None)
        w.add_request(_vllm_add_request, processor, (request, "secret"), {})
    state = SimpleNamespace(request_id="a-1", detokenizer=SimpleNamespace(output_text="hello"),
                            stats=SimpleNamespace(first_token_latency=0.25, arrival_time=1700000000.0,
                                                  num_generation_tokens=5))
    w.finished(_vllm_finished, processor, (state, "length", SimpleNamespace(iteration_timestamp=1700000001.5)), {})
    w.abort_requests(lambda request_ids, internal=False: list(request_ids), processor, (["b-1"],), {})
    finished, aborted = map(decode, sent)
    assert finished == RequestEnrichment(
        request_id="a-1", operation="text_completion", response_id="a-1", model="tiny", reason="length",
        output_tokens=5, output_characters=5, first_output=1700000000.25, last_output=1700000001.5,
        end=1700000001.5)
    assert (aborted.reason, aborted.first_output, aborted.last_output, aborted.output_tokens) == ("abort", 0.0, 0.0, None)
    assert not any(name in sent[0] for name in (b"secret", b"parent", b"group_id", b"attributes", b"server"))


def test_the_frontend_holds_at_most_max_requests_and_a_refused_sequence_lowers_its_groups_expectation():
    w, processor, sent = _enriching_wrappers(max_requests=1)
    fanned = SimpleNamespace(request_id="g", n=2)
    for i in range(2):
        request = SimpleNamespace(request_id=f"{i}_g-1", external_req_id="g", sampling_params=Params(),
                                  lora_request=None, trace_headers=None)
        w.add_request(_vllm_add_request, processor, (request, None, fanned, i), {})
    assert list(w.enriching) == ["0_g-1"]
    assert w.telemetry.counts.requests_untracked == 1 and w.enriching["0_g-1"].group.expected == 1
