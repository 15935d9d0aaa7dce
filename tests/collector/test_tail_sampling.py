"""Acceptance 5 (buffering): decision timing on an injected clock, late spans, evictions under a tiny cap."""

from __future__ import annotations

from typing import Any

from collector_testkit import FakeClock, export_request, request_attrs, span
from otel_llm.core.sampling import ErrorPolicy, SLOPolicy
from otel_llm.core.slo import SLOTable
from otel_llm_collector.config import TailSamplingConfig
from otel_llm_collector.spans import extract, spans_of
from otel_llm_collector.tail_sampling import TailSampler
from otel_llm_collector.telemetry import GatewayMetrics

SLOS = SLOTable.parse("ttft=0.5")


class Sink:
    def __init__(self) -> None:
        self.spans: list[Any] = []

    def __call__(self, items) -> None:
        self.spans.extend(spans_of(items))

    def traces(self) -> set[int]:
        return {int.from_bytes(s.trace_id, "big") for s in self.spans}


def sampler(clock: FakeClock, **cfg: Any) -> tuple[TailSampler, Sink, GatewayMetrics]:
    base = dict(decision_wait=30.0, decision_wait_after_root_received=1.0)
    base.update(cfg)
    sink, t = Sink(), GatewayMetrics()
    return TailSampler(TailSamplingConfig(**base), [ErrorPolicy(), SLOPolicy(SLOS)], clock, t, sink), sink, t


def add(s: TailSampler, *spans) -> None:
    s.add(extract(export_request(*spans)))


def test_decides_after_request_span_plus_wait_not_before(clock: FakeClock) -> None:
    s, sink, t = sampler(clock)
    add(s, span(1, 2, parent=1, name="llm.decode"))  # child first
    add(s, span(1, 1, attrs=request_attrs(ttft=0.9)))  # the request span: breaches ttft
    clock.advance(0.9)
    assert s.tick() == 0 and not sink.spans
    add(s, span(1, 3, parent=1, name="llm.decode.step"))  # straggler inside the wait
    clock.advance(0.2)
    assert s.tick() == 1
    assert sorted(int.from_bytes(x.span_id, "big") for x in sink.spans) == [1, 2, 3]
    assert t.value("count_traces_sampled", policy="slo_breach", decision="sampled") == 1


def test_trace_without_request_span_waits_for_decision_wait(clock: FakeClock) -> None:
    s, sink, _ = sampler(clock)
    add(s, span(7, 2, parent=1, error=True))
    clock.advance(29.9)
    assert s.tick() == 0
    clock.advance(0.2)
    assert s.tick() == 1 and sink.traces() == {7}


def test_drops_unremarkable_traces(clock: FakeClock) -> None:
    s, sink, t = sampler(clock)
    add(s, span(1, 1, attrs=request_attrs(ttft=0.1)), span(1, 2, parent=1))
    clock.advance(2)
    assert s.tick() == 1 and not sink.spans
    assert s.traces_on_memory == 0 and s.bytes_on_memory == 0
    assert t.value("count_traces_sampled", policy="none", decision="not_sampled") == 1


def test_late_spans_follow_their_trace_decision(clock: FakeClock) -> None:
    s, sink, t = sampler(clock)
    add(s, span(1, 1, attrs=request_attrs(ttft=0.9)))  # kept
    add(s, span(2, 1, attrs=request_attrs(ttft=0.1)))  # dropped
    clock.advance(2)
    s.tick()
    before = len(sink.spans)
    add(s, span(1, 9, parent=1), span(2, 9, parent=1))
    assert len(sink.spans) == before + 1 and sink.spans[-1].trace_id == (1).to_bytes(16, "big")
    assert s.traces_on_memory == 0  # late spans are not buffered again
    assert t.value("sampling_late_spans", decision="sampled") == 1
    assert t.value("sampling_late_spans", decision="not_sampled") == 1


def test_decision_cache_is_bounded(clock: FakeClock) -> None:
    s, sink, _ = sampler(clock, sampled_cache_size=1)
    add(s, span(1, 1, attrs=request_attrs(ttft=0.9)), span(2, 1, attrs=request_attrs(ttft=0.9)))
    clock.advance(2)
    s.tick()
    n = len(sink.spans)
    add(s, span(1, 5, parent=1))  # trace 1 fell out of the 1-entry cache: buffered as a new trace
    assert len(sink.spans) == n and s.traces_on_memory == 1


def test_num_traces_cap_evicts_oldest_by_deciding_early(clock: FakeClock) -> None:
    s, sink, t = sampler(clock, num_traces=2)
    add(s, span(1, 1, error=True))
    add(s, span(2, 1))
    add(s, span(3, 1))  # over the cap: trace 1 is decided now, and kept (error)
    assert s.traces_on_memory == 2
    assert t.value("sampling_evictions", reason="num_traces") == 1
    assert sink.traces() == {1}
    add(s, span(1, 2, parent=1))  # a late span of the evicted trace follows its decision
    assert len([x for x in sink.spans if x.trace_id == (1).to_bytes(16, "big")]) == 2


def test_byte_cap_bounds_memory(clock: FakeClock) -> None:
    s, _, t = sampler(clock, max_buffer_bytes=2000)
    for i in range(1, 200):
        add(s, span(i, 1, attrs={"payload": "x" * 100}))
        assert s.bytes_on_memory <= 2000
    assert t.value("sampling_evictions", reason="max_buffer_bytes") > 150
    assert t.value("sampling_bytes_on_memory") == s.bytes_on_memory


def test_decide_all_at_shutdown(clock: FakeClock) -> None:
    s, sink, _ = sampler(clock)
    add(s, span(1, 1, error=True), span(2, 1))
    assert s.decide_all() == 2 and sink.traces() == {1} and s.traces_on_memory == 0


def test_sdk_recorded_reason_is_honoured(clock: FakeClock) -> None:
    from otel_llm.core.sampling import RecordedReasonPolicy

    sink, t = Sink(), GatewayMetrics()
    s = TailSampler(TailSamplingConfig(decision_wait_after_root_received=0.5), [RecordedReasonPolicy()], clock, t, sink)
    add(s, span(1, 1, attrs=request_attrs(**{"llm.sampling.reason": "baseline"})))
    add(s, span(2, 1, attrs=request_attrs()))
    clock.advance(1)
    s.tick()
    assert sink.traces() == {1}


def test_buffers_encoded_bytes_not_protobuf_objects(clock: FakeClock) -> None:
    """A buffered upb message keeps its whole received request alive (~1.2 KB/span measured); bytes do not."""
    s, _, _ = sampler(clock)
    add(s, span(1, 1, attrs=request_attrs()), span(1, 2, parent=1))
    (trace,) = s._traces.values()
    assert [type(raw) for _, raw in trace.items] == [bytes, bytes]
    assert s.bytes_on_memory == sum(len(raw) for _, raw in trace.items)


def test_decision_cache_remembers_at_least_the_last_size_decisions_and_at_most_twice_that() -> None:
    from otel_llm_collector.decision_cache import DecisionCache

    cache, size = DecisionCache(100), 100
    for i in range(1, 1001):
        cache.add(i.to_bytes(16, "big"))
        assert all(j.to_bytes(16, "big") in cache for j in range(max(1, i - size + 1), i + 1))
        assert len(cache) <= 2 * size
    assert (1).to_bytes(16, "big") not in cache
    off = DecisionCache(0)
    off.add(b"x" * 16)
    assert b"x" * 16 not in off and len(off) == 0


def test_a_trace_added_while_another_add_compacts_the_queues_is_still_decided(clock: FakeClock) -> None:
    """The due queues are rebuilt when compacted: an ``add`` must append to them under the lock, not to a
    reference taken before it (that trace would never come due)."""
    import threading

    s, _, _ = sampler(clock, num_traces=10)
    many = extract(export_request(*(span(i, 1) for i in range(100, 4300))))  # evicts ~4190: a compaction

    class CompactFirst:  # another thread's add takes the lock first, as it could between two lines
        def __init__(self) -> None:
            self.lock, self.pending = threading.Lock(), True

        def __enter__(self) -> None:
            if self.pending:
                self.pending = False
                s.add(many)
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    s._lock = CompactFirst()  # type: ignore[assignment]
    add(s, span(1, 1))  # a root span: due after decision_wait_after_root_received
    clock.advance(2)
    s.tick()
    assert (1).to_bytes(16, "big") not in s._traces and s.traces_on_memory == 0


def test_a_buffered_trace_sets_every_field_of_the_view_the_policies_read() -> None:
    # PendingTrace fills TraceView's fields itself (one constructor call on the hot path): a field added to
    # TraceView must be set there too, or a policy reading it fails on buffered traces
    from dataclasses import fields

    from otel_llm.core.sampling import TraceView
    from otel_llm_collector.tail_sampling import PendingTrace

    trace = PendingTrace((5).to_bytes(16, "big"), 1.0, True, (None, b"x" * 123), 123, False, 1, 3_000_000_001).view()
    assert all(hasattr(trace, f.name) for f in fields(TraceView))
    assert (trace.trace_id, trace.span_count, trace.duration, trace.attributes, trace.size_bytes) == (5, 1, 3.0, {}, 123)
