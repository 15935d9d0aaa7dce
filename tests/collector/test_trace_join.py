"""A server request trace without a caller (vLLM's Rust frontend), joined into its client call's trace by response id."""

from __future__ import annotations

from typing import Any

import pytest
from collector_testkit import FakeClock, export_request, loopback_config, request_attrs, span
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_llm.core.sampling import ErrorPolicy, SLOPolicy
from otel_llm.core.slo import SLOTable
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.spans import spans_of
from otel_llm_collector.trace_join import DEFAULT_WAIT, candidates

from otel_llm import semconv as sc

SLOS = SLOTable.parse("ttft=0.5")
CLIENT_TRACE, SERVER_TRACE, STEP_TRACE = 0xC1, 0x51, 0xE1
CLIENT_SPAN, SERVER_ROOT = 0x11, 0x21


def client_call(response_id: str, trace: int = CLIENT_TRACE, error: bool = False) -> Span:
    s = span(trace, CLIENT_SPAN, name="text_completion m", error=error,
             attrs={sc.RESPONSE_ID: response_id, sc.REQUEST_MODEL: "m"})
    s.kind = Span.SPAN_KIND_CLIENT
    return s


def server_trace(response_id: str, trace: int = SERVER_TRACE, ttft: float = 0.1) -> list[Span]:
    """A request span without a parent (the EngineCore's), a phase under it, and an engine step linking to it."""
    root = span(trace, SERVER_ROOT, name="text_completion m",
                attrs=request_attrs(ttft=ttft, **{sc.RESPONSE_ID: response_id}))
    root.kind = Span.SPAN_KIND_SERVER
    phase = span(trace, SERVER_ROOT + 1, parent=SERVER_ROOT, name="llm.prefill")
    step = span(STEP_TRACE + trace, 0x31, name="llm.engine.step")
    link = step.links.add()
    link.trace_id, link.span_id = trace.to_bytes(16, "big"), SERVER_ROOT.to_bytes(8, "big")
    return [root, phase, step]


class Sink:
    """The spans the sampler kept (``spans``) and every span handed to it (``handed``, engine steps included:
    their own traces are decided apart)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.handed: list[Span] = []

    def __call__(self, items: Any) -> None:
        self.spans.extend(spans_of(items))

    def by_name(self) -> dict[str, Span]:
        return {s.name: s for s in self.spans}


def gateway(clock: FakeClock, **join: Any) -> tuple[Gateway, Sink]:
    cfg = loopback_config(processors={"tail_sampling": {"decision_wait": "30s",
                                                        "decision_wait_after_root_received": "1s"}})
    g = Gateway(cfg, clock=clock, manual_ticks=True, policies=[ErrorPolicy(), SLOPolicy(SLOS)])
    sink = Sink()
    assert g.sampler is not None and g.trace_join is not None
    g.sampler._emit = sink
    add = g.sampler.add

    def handed(batch: Any) -> None:
        sink.handed.extend(spans_of([(rec[1], rec[2]) for rec in batch.spans]))
        add(batch)

    g.sampler.add = handed
    for k, v in join.items():
        setattr(g.trace_join, f"_{k}", v)
    return g, sink


def counter(g: Gateway, name: str, **labels: str) -> float:
    return g.telemetry.registry.get_sample_value(f"otelcol_llm_{name}_total", labels) or 0.0


@pytest.mark.parametrize("server_id,client_id", [
    ("cmpl-abc", "cmpl-abc"),  # Rust frontend: the external id itself
    ("cmpl-abc-1a2b3c4d", "cmpl-abc"),  # Python frontend: external id + 8 random characters
    ("cmpl-abc-2", "cmpl-abc"),  # a completion's third prompt
    ("cmpl-abc-2-1a2b3c4d", "cmpl-abc"),
    ("chatcmpl-xyz", "chatcmpl-xyz"),
])
@pytest.mark.parametrize("client_first", [True, False])
def test_server_trace_moves_into_the_client_trace(server_id: str, client_id: str, client_first: bool) -> None:
    clock = FakeClock()
    g, sink = gateway(clock)
    client = export_request(client_call(client_id), service="app")
    server = export_request(*server_trace(server_id, ttft=0.9), service="vllm")  # slow: the SLO policy keeps it
    for req in (client, server) if client_first else (server, client):
        g.ingest(req)
        clock.advance(0.5)
    clock.advance(1.0)
    g.tick()
    spans = sink.by_name()
    assert set(spans) == {"text_completion m", "llm.prefill"} and len(sink.spans) == 3
    c = CLIENT_TRACE.to_bytes(16, "big")
    root = next(s for s in sink.spans if s.span_id == SERVER_ROOT.to_bytes(8, "big"))
    assert root.trace_id == c and root.parent_span_id == CLIENT_SPAN.to_bytes(8, "big")
    assert spans["llm.prefill"].trace_id == c and spans["llm.prefill"].parent_span_id == root.span_id
    (step,) = [s for s in sink.handed if s.name == "llm.engine.step"]
    assert step.trace_id != c and step.links[0].trace_id == c and step.links[0].span_id == root.span_id
    assert counter(g, "trace_join_joined") == 1


@pytest.mark.parametrize("slow_server,client_error,kept", [
    (True, False, True),  # kept for the server's side: the client span comes along
    (False, True, True),  # kept for the client's side: the server's spans come along
    (False, False, False),
])
def test_the_joined_trace_is_decided_once_over_both_sides(slow_server: bool, client_error: bool, kept: bool) -> None:
    clock = FakeClock()
    g, sink = gateway(clock)
    g.ingest(export_request(*server_trace("cmpl-q", ttft=0.9 if slow_server else 0.1)))
    g.ingest(export_request(client_call("cmpl-q", error=client_error)))
    clock.advance(2.0)
    g.tick()
    assert len(sink.spans) == (3 if kept else 0)  # the step's own trace is decided apart
    assert {s.trace_id for s in sink.spans} <= {CLIENT_TRACE.to_bytes(16, "big")}


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_half_whose_partner_never_comes_goes_on_alone_after_the_wait(side: str) -> None:
    clock = FakeClock()
    g, sink = gateway(clock)
    if side == "server":
        g.ingest(export_request(*server_trace("cmpl-lonely", ttft=0.9)))
    else:
        g.ingest(export_request(client_call("cmpl-lonely", error=True)))
    clock.advance(DEFAULT_WAIT - 0.1)
    g.tick()
    assert sink.spans == [] and g.trace_join.waiting == 1
    clock.advance(0.2)
    g.tick()  # handed to the sampler now; decided after its root wait
    clock.advance(1.1)
    g.tick()
    assert len(sink.spans) == (2 if side == "server" else 1)
    if side == "server":
        root = next(s for s in sink.spans if s.span_id == SERVER_ROOT.to_bytes(8, "big"))
        assert root.trace_id == SERVER_TRACE.to_bytes(16, "big") and not root.parent_span_id
    assert g.trace_join.waiting == 0 and counter(g, "trace_join_alone", side=side) == 1


def test_later_spans_of_a_waiting_server_trace_wait_with_it() -> None:
    clock = FakeClock()
    g, sink = gateway(clock)
    root, phase, step = server_trace("cmpl-late", ttft=0.9)
    late_step = span(0xEE, 0x32, name="llm.engine.step")
    late_step.links.add(trace_id=SERVER_TRACE.to_bytes(16, "big"), span_id=SERVER_ROOT.to_bytes(8, "big"))
    g.ingest(export_request(root))
    g.ingest(export_request(phase, step))  # the same trace and a step linking into it, in a later batch
    step_trace = step.trace_id
    assert g.trace_join.holds(SERVER_TRACE.to_bytes(16, "big")) and g.trace_join.holds(step_trace)
    g.ingest(export_request(client_call("cmpl-late")))
    assert not g.trace_join.holds(SERVER_TRACE.to_bytes(16, "big")) and not g.trace_join.holds(step_trace)
    g.ingest(export_request(late_step))  # a step linking into the joined trace, after the join
    clock.advance(2.0)
    g.tick()
    assert {s.trace_id for s in sink.spans} == {CLIENT_TRACE.to_bytes(16, "big")} and len(sink.spans) == 3
    steps = [s for s in sink.handed if s.name == "llm.engine.step"]
    assert len(steps) == 2 and {s.links[0].trace_id for s in steps} == {CLIENT_TRACE.to_bytes(16, "big")}


def test_the_table_is_bounded_oldest_forgotten_first() -> None:
    clock = FakeClock()
    g, sink = gateway(clock, max=2)
    for i in range(3):
        g.ingest(export_request(*server_trace(f"cmpl-{i}x", trace=0x100 + i, ttft=0.9)))
    assert g.trace_join.waiting == 2 and counter(g, "trace_join_forgotten") == 1
    g.ingest(export_request(client_call("cmpl-0x")))  # its server trace went on alone: nothing to join
    clock.advance(1.5)
    g.tick()
    assert counter(g, "trace_join_joined") == 0
    assert SERVER_TRACE.to_bytes(16, "big") not in {s.trace_id for s in sink.spans}
    assert (0x100).to_bytes(16, "big") in {s.trace_id for s in sink.spans}  # the forgotten one, on its own


def test_one_client_call_joins_each_of_its_prompts() -> None:
    clock = FakeClock()
    g, sink = gateway(clock)
    g.ingest(export_request(client_call("cmpl-multi")))
    for i in range(2):
        g.ingest(export_request(*server_trace(f"cmpl-multi-{i}", trace=0x200 + i, ttft=0.9)[:2]))
    clock.advance(2.0)
    g.tick()
    assert {s.trace_id for s in sink.spans} == {CLIENT_TRACE.to_bytes(16, "big")} and len(sink.spans) == 5
    assert counter(g, "trace_join_joined") == 2
    clock.advance(DEFAULT_WAIT)
    g.tick()
    join = g.trace_join
    assert join.waiting == 0 and not join._servers and not join._clients and not join._held  # nothing left behind


def test_shutdown_hands_on_what_waits() -> None:
    clock = FakeClock()
    g, sink = gateway(clock)
    g.ingest(export_request(*server_trace("cmpl-bye", ttft=0.9)))
    g.shutdown(0)
    assert len(sink.handed) == 3 and len(sink.spans) == 2


@pytest.mark.parametrize("rid,expected", [
    ("cmpl-abc", ["cmpl-abc"]),
    ("cmpl-abc-1a2b3c4d", ["cmpl-abc-1a2b3c4d", "cmpl-abc"]),
    ("cmpl-abc-3", ["cmpl-abc-3", "cmpl-abc"]),
    ("cmpl-abc-3-1a2b3c4d", ["cmpl-abc-3-1a2b3c4d", "cmpl-abc-3", "cmpl-abc"]),
])
def test_candidates(rid: str, expected: list[str]) -> None:
    assert candidates(rid) == expected
