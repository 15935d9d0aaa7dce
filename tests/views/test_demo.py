"""The demo's arithmetic: SLOs from the quiet phase, the verdict tally per phase, quantiles at the
histogram's top bucket (the phases themselves run on the real engine: test_demo_phases.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from otel_llm import semconv as sc
from otel_llm.core.slo import SLO
from otel_llm.demo import console, scenario


def test_slos_are_rounded_up_to_two_digits() -> None:
    cases = {0.07: "0.070", 0.0123: "0.013", 0.96: "0.96", 14.2: "15", 0.296: "0.30", 0.3: "0.30", 123.4: "130"}
    assert {v: scenario.round_up(v) for v in cases} == cases
    for value, text in cases.items():
        assert float(text) >= value


def _request(rid: str, **attrs) -> dict:
    return {sc.RESPONSE_ID: rid, **attrs}


def test_a_quiet_measurement_sets_the_slos_from_its_median_tpot() -> None:
    phase = scenario.phases(1)[2]
    runs = scenario.measurement(phase)
    assert len(runs) == phase.quiet[0] and all(a.step == 0 and "-base-" in a.request_id for a in runs)
    quiet = [_request(a.request_id, **{sc.LATENCY_TPOT: t, sc.LATENCY_TTFT: 0.01})
             for a, t in zip(runs, (0.010, 0.012, 0.011, 0.5, 0.011))]
    measured = scenario.baseline(quiet + [_request("burst-1", **{sc.LATENCY_TPOT: 9.0})])  # not a measurement
    assert measured.tpot == pytest.approx(0.011) and measured.requests == 5
    assert SLO.parse(measured.slo) == SLO(ttft=0.18, tpot=0.033)  # TTFT: 16 decode steps > twice 10 ms
    docs = scenario.measurement(scenario.phases(1)[1])
    assert sum(a.prompt_tokens == scenario.DOCUMENT_TOKENS for a in docs) == 6
    with_docs = [_request(a.request_id, **{sc.LATENCY_TPOT: 0.01, sc.LATENCY_TTFT: 0.5 if "doc" in a.request_id
                                              else 0.01}) for a in docs]
    assert SLO.parse(scenario.baseline(with_docs).slo).ttft == 1.0  # twice a lone document's
    doc_phase = scenario.phases(1)[1]
    assert doc_phase.tpot_factor == scenario.DOCUMENTS_TPOT_FACTOR < scenario.TPOT_FACTOR
    assert SLO.parse(scenario.baseline(with_docs, doc_phase.tpot_factor).slo).tpot == 0.015  # 1.5 quiet TPOTs
    slow_first = [_request(a.request_id, **{sc.LATENCY_TPOT: 0.01, sc.LATENCY_TTFT: 0.3}) for a in runs]
    assert SLO.parse(scenario.baseline(slow_first).slo).ttft == 0.6  # twice the measured TTFT
    assert measured.slo in measured.describe()
    with pytest.raises(ValueError, match="quiet measurement"):
        scenario.baseline([])


def test_the_slos_come_from_the_fastest_of_repeated_measurements() -> None:
    """A slow spell during one measurement does not loosen the phase's SLOs: each objective takes the
    fastest repeat's median."""
    repeats = [scenario.Baseline(0.010, 0.05, 5), scenario.Baseline(0.080, 0.02, 5), scenario.Baseline(0.012, 0.4, 5)]
    fastest = scenario.Baseline.fastest(repeats)
    assert (fastest.tpot, fastest.ttft, fastest.repeats, fastest.requests) == (0.010, 0.02, 3, 5)
    assert SLO.parse(fastest.slo) == SLO(ttft=0.16, tpot=0.030) and "fastest of 3" in fastest.describe()
    docs = scenario.Baseline.fastest([scenario.Baseline(0.01, 0.5, 10, scenario.DOCUMENTS_TPOT_FACTOR)])
    assert docs.tpot_factor == scenario.DOCUMENTS_TPOT_FACTOR
    with pytest.raises(ValueError, match="no quiet measurement"):
        scenario.Baseline.fastest([])


def test_the_steady_phase_is_measured_on_its_own_batches() -> None:
    """The quiet phase's measurement is its own first chats at their own steps, under other ids: the same
    batch shapes (chats prefilled beside others' decodes) as the phase it sets the SLOs for."""
    quiet = scenario.phases(2)[0]
    measured = scenario.measurement(quiet)
    assert len(measured) == scenario.QUIET_CHATS < len(quiet.arrivals)
    assert [(a.step, a.prompt_tokens, a.max_tokens) for a in measured] == \
        [(a.step, a.prompt_tokens, a.max_tokens) for a in quiet.arrivals[:scenario.QUIET_CHATS]]
    assert all("-base-" in a.request_id for a in measured)
    assert not {a.request_id for a in measured} & quiet.request_ids()


def test_the_warm_up_runs_every_measurement_and_first_wave_under_other_ids() -> None:
    """Every batch shape a phase meets runs once before anything is measured: its measurement and its first
    wave (the later waves repeat it), none under an id the phases or the tally use."""
    driven: list[list[scenario.Arrival]] = []
    phases = scenario.phases(2)
    original = scenario.drive
    scenario.drive = lambda engine, arrivals, adapters=None: driven.append(list(arrivals)) or 0
    try:
        scenario.warm_up(None, phases)
    finally:
        scenario.drive = original
    shapes = lambda arrivals: sorted((a.step, a.prompt_tokens, a.max_tokens, a.adapter) for a in arrivals)
    assert [shapes(d) for d in driven] == [shapes(x) for p in phases for x in (scenario.measurement(p), p.first_wave())]
    used = {a.request_id for p in phases for a in p.arrivals}
    assert not {a.request_id for d in driven for a in d} & used
    lora, docs = phases[4], phases[1]
    assert len(lora.first_wave()) == scenario.LORA_HOLDERS + scenario.LORA_VICTIMS
    assert len(docs.first_wave()) == scenario.CHATS_PER_WAVE + 2 * scenario.DOCUMENTS_PER_WAVE
    assert phases[2].first_wave() == list(phases[2].arrivals)  # one wave: all of it


def test_every_request_belongs_to_one_phase_and_the_load_is_within_the_engine() -> None:
    phases = scenario.phases(2)
    ids = [a.request_id for p in phases for a in p.arrivals]
    assert len(ids) == len(set(ids))
    assert [p.name for p in phases] == [scenario.QUIET, scenario.DOCUMENTS, scenario.BURST, scenario.SQUEEZE,
                                        scenario.LORA]
    assert not phases[0].causes and all(p.causes for p in phases[1:])
    kv_tokens = (scenario.KV_BLOCKS - 1) * scenario.BLOCK_SIZE
    # a document fits the KV cache beside a wave of chats; the burst exceeds max_num_seqs by construction;
    # the squeeze's requests, grown, need more KV than there is
    docs = phases[1]
    chats = [a for a in docs.arrivals if a.role == "victim"][:scenario.CHATS_PER_WAVE]
    assert 2 * scenario.DOCUMENT_TOKENS + sum(a.prompt_tokens + a.max_tokens for a in chats) <= kv_tokens
    assert len(chats) + 2 <= scenario.MAX_NUM_SEQS  # two documents and the chats: one batch, nobody queues
    assert len(phases[2].arrivals) > scenario.MAX_NUM_SEQS
    grown = sum(a.prompt_tokens + a.max_tokens for a in phases[3].arrivals[:scenario.MAX_NUM_SEQS - 1])
    assert grown > kv_tokens
    assert all(a.prompt_tokens + a.max_tokens <= scenario.ENGINE_ARGS["max_model_len"] for p in phases for a in p.arrivals)
    # the LoRA phase: two adapters, one slot; the batch has room beside the first adapter's requests, so
    # the slot holds the second adapter's back, and they all fit it once the slot is free; a wave starts
    # after the last one's requests have finished
    lora = phases[4]
    assert scenario.LORA_ENGINE_ARGS["max_loras"] == 1 and {a.adapter for a in lora.arrivals} == set(scenario.ADAPTERS)
    assert [p.lora for p in phases] == [False] * 4 + [True] and "enable_lora" not in scenario.ENGINE_ARGS
    assert all(a.adapter is None for p in phases[:4] for a in p.arrivals)
    assert scenario.LORA_HOLDERS < scenario.MAX_NUM_SEQS and scenario.LORA_VICTIMS <= scenario.MAX_NUM_SEQS
    held = [a for a in lora.arrivals if a.role == "load"]
    assert {a.adapter for a in held} == {scenario.LORA_HELD} and len(lora.arrivals) - len(held) >= 10
    waves = sorted({a.step for a in held})
    assert all(b - a > max(x.max_tokens for x in lora.arrivals) + 8 for a, b in zip(waves, waves[1:]))
    assert {a.adapter for a in scenario.measurement(lora)} == {scenario.LORA_WAITING}
    assert all(a.step % lora.wave < lora.wave - max(x.max_tokens for x in lora.arrivals) - 8 for a in lora.arrivals)
    # even the short run's cause phases have more victims than the five breaches the target asks for
    for p in scenario.phases(1)[1:]:
        assert sum(a.role == "victim" for a in p.arrivals) >= 7, p.name


def test_the_tally_counts_breached_requests_per_phase_and_verdict() -> None:
    phases = scenario.phases(1)
    burst = [a.request_id for a in phases[2].arrivals if a.role == "victim"]
    documents = [a.request_id for a in phases[1].arrivals if a.role == "load"]
    spans = [_request(burst[0], **{sc.SLO_BREACHED: ("ttft",), sc.SLOW_CAUSE: sc.SLOW_QUEUE_MAX_SEQS,
                                   sc.SLOW_SECONDS[sc.SLOW_QUEUE_MAX_SEQS]: 1.5}),
             _request(burst[1], **{sc.SLO_BREACHED: ("ttft",), sc.SLOW_CAUSE: sc.SLOW_UNKNOWN}),
             _request(burst[2], **{sc.SLOW_CAUSE: sc.SLOW_UNKNOWN}),  # kept (slow), breached nothing
             _request("somebody-else", **{sc.SLO_BREACHED: ("ttft",), sc.SLOW_CAUSE: sc.SLOW_UNKNOWN}),
             # a document slowed by its own prefill: counted apart, not judged against the phase's cause
             _request(documents[0], **{sc.SLO_BREACHED: ("ttft",), sc.SLOW_CAUSE: sc.SLOW_UNKNOWN})]
    tallies = {t.phase.name: t for t in scenario.tally(phases, spans)}
    t = tallies[scenario.BURST]
    assert (t.breached, t.right, t.causes) == (2, 1, {sc.SLOW_QUEUE_MAX_SEQS: 1, sc.SLOW_UNKNOWN: 1})
    assert t.seconds[sc.SLOW_QUEUE_MAX_SEQS] == 1.5 and t.share_right == 0.5
    assert tallies[scenario.QUIET].breached == 0 and tallies[scenario.QUIET].share_right is None
    d = tallies[scenario.DOCUMENTS]
    assert (d.breached, d.load_breached, d.load_causes) == (0, 1, {sc.SLOW_UNKNOWN: 1})
    assert d.requests + d.load == len(phases[1].arrivals)
    table = "\n".join(console.verdict_table(list(tallies.values())))
    assert "queue_max_seqs" in table and "1 of 2 breached requests (50%)" in table and "not the phase's cause" in table
    assert f"1 of its {d.load} load requests breached" in table


def test_a_quantile_in_the_top_bucket_says_it_is_above_the_last_bound() -> None:
    point = SimpleNamespace(count=10, explicit_bounds=[0.1, 1.0, 10.0], bucket_counts=[5, 3, 0, 2])
    assert console.quantile_from_histogram(point, 0.5) == (0.1, False)
    assert console.quantile_from_histogram(point, 0.99) == (10.0, True)
    assert console.format_quantile(10.0, True).strip() == "> 10 s"
    assert console.format_quantile(0.0123, False).strip() == "12.3ms"
