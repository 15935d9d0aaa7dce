"""Fences around vLLM internals the adapter relies on: each fails loudly when vLLM moves them."""

from __future__ import annotations

from otel_llm.core.timeline import PREEMPTED, QUEUED, SCHEDULED


def test_engine_core_event_types_have_the_values_the_timeline_uses():
    """The adapter stores ``int(event.type)`` on the timeline (no enum lookup per event on the hot
    path); the core reads those integers as its QUEUED/SCHEDULED/PREEMPTED."""
    from vllm.v1.engine import EngineCoreEventType

    assert {e.name: int(e) for e in EngineCoreEventType} == {
        "QUEUED": QUEUED, "SCHEDULED": SCHEDULED, "PREEMPTED": PREEMPTED}


def test_parallel_sampling_fan_out_is_as_the_adapter_reads_it():
    """n > 1: ``OutputProcessor.add_request`` gets the ``ParentRequest`` as ``parent_req`` and the
    sequence's index as ``request_index``; the group is kept on the ParentRequest (an attribute)."""
    import inspect

    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.engine.parallel_sampling import ParentRequest

    params = inspect.signature(OutputProcessor.add_request).parameters
    assert {"request", "prompt", "parent_req", "request_index"} <= set(params)
    assert isinstance(inspect.getattr_static(ParentRequest, "n"), property)
    assert "__slots__" not in vars(ParentRequest)  # our attribute fits on it
