"""A finish as the engine's own numbers (core/finish_facts.py): the summary they make, and their message."""

from __future__ import annotations

from otel_llm.agent import control, protocol
from otel_llm.core.finish_facts import EngineStats, FinishFacts, settle
from otel_llm.core.step_tokens import TokenWindow
from otel_llm.core.timeline import PREEMPTED, QUEUED, SCHEDULED, RequestTimeline

STATS = EngineStats(arrival=1000.0, queued=50.0, scheduled=50.25, first_token=50.75, last_token=52.75,
                    first_token_latency=0.875, generation_tokens=9, preemptions=None)


def facts(reason: str = "length", stats: EngineStats = STATS, **kw) -> FinishFacts:
    values = dict(request_id="r1", reason=reason, end=1003.5, events=[(QUEUED, 50.0), (SCHEDULED, 50.25)],
                  cache_sources=None, cached_tokens=32, output_characters=40, output_text="done",
                  model="m", operation="text_completion", provider="vllm", input_tokens=64, arrival=999.0,
                  stats=stats)
    values.update(kw)
    return FinishFacts(**values)


def started() -> RequestTimeline:
    return RequestTimeline("r1", 999.0, model="m", provider="vllm", input_tokens=64)


def test_the_engines_formulas_make_the_summary() -> None:
    t = started()
    s = settle(t, facts())
    assert (s.queue, s.prefill, s.decode, s.ttft) == (0.25, 0.5, 2.0, 0.875)
    assert s.e2e == 3.5  # from the engine's arrival, not the frontend's
    assert s.output_tokens == 9 and s.tpot == 0.25
    assert s.prefix_cache_hit_tokens == 32 and (s.cache_read_local, s.cache_read_external) == (32, 0)
    assert s.output_characters == 40 and s.finish_reason == "length" and s.error_type is None
    assert (s.model, s.provider, s.input_tokens) == ("m", "vllm", 64)
    # what deriving its token times from steps needs, on the timeline
    assert t.token_window == TokenWindow(50.75, 52.75, 9, 64)
    assert t.output_text == "done" and t.finish_reason == "length"


def test_preemptions_are_counted_from_events_where_the_engine_counts_none() -> None:
    events = [(QUEUED, 50.0), (SCHEDULED, 50.25), (PREEMPTED, 51.0), (SCHEDULED, 51.5)]
    assert settle(started(), facts(events=events)).num_preemptions == 1
    assert settle(started(), facts(events=events, stats=STATS._replace(preemptions=3))).num_preemptions == 3


def test_an_abort_before_the_first_token() -> None:
    stats = STATS._replace(scheduled=0.0, first_token=0.0, last_token=0.0, first_token_latency=0.0,
                           generation_tokens=0, arrival=0.0)
    t = started()
    s = settle(t, facts("abort", stats=stats))
    assert s.error_type == "aborted" and s.ttft is None and s.queue is None and s.decode is None
    assert s.e2e == 4.5  # from the frontend's arrival: the engine stamped none
    assert t.token_window is None and t.cache_sources is None  # no token: no cache split either


def test_a_split_that_does_not_add_up_is_left_out() -> None:
    s = settle(started(), facts(cache_sources=(10, 10)))
    assert s.prefix_cache_hit_tokens == 32 and s.cache_read_local is None


def test_a_finish_whose_start_is_unknown_keeps_its_metric_labels() -> None:
    s = settle(None, facts())
    assert (s.model, s.operation, s.provider, s.input_tokens) == ("m", "text_completion", "vllm", 64)
    assert s.decode == 2.0


def test_the_frontends_output_receipts_reach_the_timeline_where_a_python_frontend_took_them() -> None:
    t = started()
    settle(t, facts(first_output=999.875, last_output=1003.5))
    assert (t.first_output, t.last_output) == (999.875, 1003.5)
    t = started()  # an engine's own records (the Rust frontend): no receipt, nothing for the verdict to judge
    settle(t, facts())
    assert (t.first_output, t.last_output) == (None, None)


def test_the_python_frontend_reads_its_receipts_off_vllms_own_stamps() -> None:
    from types import SimpleNamespace as NS

    from otel_llm.instrumentation.vllm.wrappers import output_receipts

    st = NS(arrival_time=1000.0, first_token_latency=0.25)
    assert output_receipts(st, "length", 1003.5) == (1000.25, 1003.5)
    assert output_receipts(st, "abort", 1003.5) == (1000.25, 0.0)  # an abort is no output
    assert output_receipts(NS(arrival_time=1000.0, first_token_latency=0.0), "abort", 1003.5) == (0.0, 0.0)
    assert output_receipts(None, "stop", 1003.5) == (0.0, 0.0)  # an engine without statistics


def test_the_message_carries_every_fact() -> None:
    f = facts(first_output=999.875, last_output=1003.5)
    r = control.decode(protocol.facts_message(f))
    assert type(r) is control.FactsRecord
    got = protocol.facts_of(r)
    assert got == f._replace(events=[tuple(e) for e in f.events])
    assert protocol.facts_of(control.decode(protocol.facts_message(f, content=False))).output_text is None


def test_a_finish_with_its_summary_carries_the_receipts_too() -> None:
    """(A frontend with its own token stamps sends a summary, not the engine's numbers.)"""
    t = started()
    s = settle(t, facts(first_output=999.875, last_output=1003.5))
    got = started()
    protocol.finish_into(got, protocol.checked(control.decode(protocol.finish_message("r1", t, s))))
    assert (got.first_output, got.last_output) == (999.875, 1003.5)
    untracked_finish = protocol.checked(control.decode(protocol.finish_message("r1", None, s)))
    rid, untracked = protocol.finish_into(None, untracked_finish)
    assert rid == "r1" and untracked.ttft == s.ttft
