"""Deferred step reading on the vLLM transport: a spawned EngineCore's ring that fills while the frontend's
background thread reads nothing loses records, the engine never waits, and the loss is counted."""

from __future__ import annotations

import tempfile

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from otel_llm.core.config import Config
from otel_llm.core.pipeline import Pipeline
from otel_llm import shm_ring
from otel_llm.instrumentation.vllm.step_hooks import StepHooks
from otel_llm.instrumentation.vllm.step_transport import SocketSink, StepReceiver
from otel_llm.instrumentation.vllm.wrappers import CountingReader


def test_a_full_ring_loses_steps_counted_in_stats_and_the_engine_goes_on():
    """The new failure mode: nothing reads for a while (the background thread busy or blocked), the EngineCore's
    ring fills, its writes are refused (the engine does not wait), and the frontend counts what it lost."""
    if not shm_ring.AVAILABLE:
        pytest.skip("no step rings on this platform")
    shares = (["req-a", "req-b"], [16, 1], [0, 40], [], [0], [16], [0])
    pipeline = Pipeline(Config.resolve({"step_reading": "deferred"}, environ={}), TracerProvider().get_tracer("t"),
                        MeterProvider().get_meter("t"), "test")
    with tempfile.TemporaryDirectory() as d:
        receiver = StepReceiver(d)
        sink = SocketSink(d)
        sink.RING_CAPACITY = 1024  # a few records' room
        hooks = StepHooks()  # its step ids: the engine's pid in the high half, then 1, 2, 3...
        hooks.prefix = 7 << 32
        ids = [hooks.prefix | next(hooks.counter) for _ in range(60)]
        sink((ids[0], 1.0, 2.0, 3, 0, 0, 0.25, shares, 0, 0.001, 0.008, 0.001, None, 0.006))
        reader = CountingReader(receiver.drain, pipeline.counts)
        pipeline.read_steps_from(reader)
        assert pipeline.flush(10)  # the ring is announced and its first record read
        for sid in ids[1:]:
            sink((sid, 1.0, 2.0, 3, 0, 0, 0.25, shares, 0, 0.001, 0.008, 0.001, None, 0.006))
        assert sink.dropped > 0  # the case is exercised
        assert pipeline.flush(10)
        # a loss shows at the next record the ring carries (the gap in the ids)
        sink((hooks.prefix | next(hooks.counter), 1.0, 2.0, 3, 0, 0, 0.25, shares, 0, 0.001, 0.008, 0.001, None,
              0.006))
        ids.append(None)
        assert pipeline.flush(10)
        stats = pipeline.stats()
        assert stats["steps_lost"] == sink.dropped
        assert stats["steps_recorded"] == len(ids) - sink.dropped
        sink.close()
        receiver.close()
    pipeline.close()
