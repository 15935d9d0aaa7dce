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


def test_scheduler_output_lists_are_as_the_step_hooks_ship_them():
    """step_hooks.StepHooks._shares ships these lists of vLLM's SchedulerOutput raw (no per-request loop) and
    the frontend derives prefill and context from them: the fields, and when they are taken (before the
    scheduler advances num_computed_tokens; outputs counting in-flight placeholders). The equality with
    the per-request rule on a real engine is test_vllm_preemption's."""
    import dataclasses
    import inspect

    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert {"scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens", "finished_req_ids",
            "preempted_req_ids", "total_num_scheduled_tokens"} <= names(SchedulerOutput)
    assert {"req_ids", "resumed_req_ids", "num_computed_tokens", "num_output_tokens"} <= names(CachedRequestData)
    assert {"req_id", "num_computed_tokens", "prompt_token_ids", "prefill_token_ids"} <= names(NewRequestData)
    from otel_llm.instrumentation.vllm import contract

    # a property from 0.29 on; before it the step hooks read len(prompt_token_ids) (contract.py's fallback)
    if contract.installed_version() not in contract.entry("NewRequestData.prompt_len").absent:
        assert isinstance(inspect.getattr_static(NewRequestData, "prompt_len"), property)
    assert "self.num_prompt_tokens" in inspect.getsource(Request.__init__)
    schedule = inspect.getsource(Scheduler.schedule)
    assert schedule.index("self._make_cached_request_data(") < schedule.index("self._update_after_schedule(")
    cached = inspect.getsource(Scheduler._make_cached_request_data)
    assert "num_computed_tokens.append(req.num_computed_tokens)" in cached
    assert "req.num_output_tokens + req.num_output_placeholders" in cached
