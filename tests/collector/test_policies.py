"""Acceptance 5: every policy keeps and drops what it should, on constructed traces (table-driven)."""

from __future__ import annotations

import random

import pytest

from otel_llm.core.policies import (AndPolicy, CompositePolicy, DropPolicy, ErrorPolicy, LatencyPercentilePolicy,
                                    LatencyPolicy, NotPolicy, ProbabilisticPolicy, RateLimitingPolicy,
                                    RecordedReasonPolicy, SLOPolicy, StatusCodePolicy, TraceView, Verdict,
                                    AlwaysSample, first_match)
from otel_llm.core.policy_registry import PolicyConfigError, build_policies, build_policy
from otel_llm.core.slo import SLOTable
from otel_llm.core.summary import RequestSummary

from collector_testkit import FakeClock


def view(*summaries: RequestSummary, error: bool = False, duration: float | None = None, reasons=(), spans=1,
         tid: int = 1) -> TraceView:
    return TraceView(tid, summaries, error, spans, duration, tuple(reasons))


FAST = RequestSummary(model="m", ttft=0.1, tpot=0.01, e2e=1.0)
SLOW_TTFT = RequestSummary(model="m", ttft=0.9, tpot=0.01, e2e=1.0)
BIG_OK = RequestSummary(model="big", ttft=0.9, tpot=0.01, e2e=1.0)
FAILED = RequestSummary(model="m", error_type="abort")
SLOS = SLOTable.parse("ttft=0.5,tpot=0.05; big: ttft=2")

CASES = [
    ("error keeps ERROR status", ErrorPolicy(), view(FAST, error=True), True),
    ("error keeps failed request", ErrorPolicy(), view(FAILED), True),
    ("error drops healthy", ErrorPolicy(), view(FAST), False),
    ("slo keeps ttft breach", SLOPolicy(SLOS), view(SLOW_TTFT), True),
    ("slo per-model override", SLOPolicy(SLOS), view(BIG_OK), False),
    ("slo drops fast", SLOPolicy(SLOS), view(FAST), False),
    ("slo ignores spans without summaries", SLOPolicy(SLOS), view(), False),
    ("latency keeps >= threshold", LatencyPolicy(2.0), view(duration=2.0), True),
    ("latency drops below", LatencyPolicy(2.0), view(duration=1.9), False),
    ("latency unknown duration", LatencyPolicy(2.0), view(), False),
    ("latency above upper", LatencyPolicy(1.0, 3.0), view(duration=3.5), False),
    ("status ERROR", StatusCodePolicy(["ERROR"]), view(error=True), True),
    ("status ERROR on healthy", StatusCodePolicy(["ERROR"]), view(), False),
    ("status OK/UNSET on healthy", StatusCodePolicy(["OK", "UNSET"]), view(), True),
    ("recorded reason any", RecordedReasonPolicy(), view(reasons=["slo_breach:ttft"]), True),
    ("recorded reason filtered", RecordedReasonPolicy(["error"]), view(reasons=["baseline"]), False),
    ("recorded reason none", RecordedReasonPolicy(), view(), False),
    ("always", AlwaysSample(), view(), True),
    ("probabilistic 0", ProbabilisticPolicy(0.0), view(tid=5), False),
    ("probabilistic 1", ProbabilisticPolicy(1.0), view(tid=5), True),
    ("and all yes", AndPolicy([ErrorPolicy(), SLOPolicy(SLOS)]), view(SLOW_TTFT, error=True), True),
    ("and one no", AndPolicy([ErrorPolicy(), SLOPolicy(SLOS)]), view(SLOW_TTFT), False),
    ("not inverts", NotPolicy(ErrorPolicy()), view(FAST), True),
]


@pytest.mark.parametrize("label,policy,trace,kept", CASES, ids=[c[0] for c in CASES])
def test_policy_keep_or_drop(label, policy, trace, kept) -> None:
    assert policy.evaluate(trace).sampled is kept


def test_drop_wins_over_keep() -> None:
    policies = [AlwaysSample(), DropPolicy([StatusCodePolicy(["ERROR"])], "drop_errors")]
    assert first_match(policies, view(error=True)).verdict is Verdict.DROPPED
    assert first_match(policies, view()).sampled


def test_broken_policy_is_no_vote() -> None:
    class Boom:
        name = "boom"

        def evaluate(self, trace):
            raise RuntimeError("bug")

    errors = []
    d = first_match([Boom(), ErrorPolicy()], view(error=True), lambda p, e: errors.append(p.name))
    assert d.sampled and errors == ["boom"]


def test_rate_limiting_budget_per_second() -> None:
    clock = FakeClock()
    p = RateLimitingPolicy(10, clock)
    assert [p.evaluate(view(spans=4)).sampled for _ in range(3)] == [True, True, False]
    clock.advance(1.0)
    assert p.evaluate(view(spans=10)).sampled
    assert not p.evaluate(view(spans=1)).sampled


def test_composite_allocates_budget_in_order() -> None:
    clock = FakeClock()
    p = CompositePolicy(10, [ErrorPolicy(), AlwaysSample()], [50, 50], clock)
    kept = [p.evaluate(view(error=True, spans=1)).reason for _ in range(7)]
    # 5 spans/s for errors, then errors also match always (its own 5 spans/s), then nothing
    assert kept[:5] == ["composite:error"] * 5
    assert kept[5:7] == ["composite:always"] * 2


def test_probabilistic_keeps_about_the_rate() -> None:
    rng = random.Random(7)
    p = ProbabilisticPolicy(0.25)
    kept = sum(p.evaluate(view(tid=rng.getrandbits(128))).sampled for _ in range(20_000))
    assert 0.23 < kept / 20_000 < 0.27


def test_percentile_keeps_about_the_slowest_share_of_a_skewed_distribution() -> None:
    """Log-normal latencies (heavy right tail): p95 policy keeps about 5%, and they are the slow ones."""
    rng = random.Random(3)
    p = LatencyPercentilePolicy(0.95, measure="ttft", min_samples=200, window=0)
    values = [rng.lognormvariate(-2.0, 1.0) for _ in range(20_000)]
    kept = [v for v in values if p.evaluate(view(RequestSummary(model="m", ttft=v))).sampled]
    share = len(kept) / len(values)
    assert 0.04 < share < 0.065
    true_p95 = sorted(values)[int(0.95 * len(values))]
    # all but the warm-up's few are above the true p95 (within the sketch's 1% relative error)
    assert sum(v >= true_p95 * 0.98 for v in kept) / len(kept) > 0.95


def test_percentile_abstains_until_min_samples_and_per_model() -> None:
    p = LatencyPercentilePolicy(0.5, measure="e2e", min_samples=10)
    for i in range(9):
        assert not p.evaluate(view(RequestSummary(model="a", e2e=100.0 + i))).sampled
    assert p.threshold("b") is None


REGISTRY_OK = [
    {"name": "a", "type": "always_sample"},
    {"name": "p", "type": "probabilistic", "probabilistic": {"sampling_percentage": 10}},
    {"name": "l", "type": "latency", "latency": {"threshold_ms": 500, "upper_threshold_ms": 5000}},
    {"name": "s", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
    {"name": "r", "type": "rate_limiting", "rate_limiting": {"spans_per_second": 100}},
    {"name": "and1", "type": "and", "and": {"and_sub_policy": [
        {"name": "x", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
        {"name": "y", "type": "latency", "latency": {"threshold_ms": 1}}]}},
    {"name": "n", "type": "not", "not": {"not_sub_policy": {"name": "z", "type": "always_sample"}}},
    {"name": "d", "type": "drop", "drop": {"drop_sub_policy": [{"name": "q", "type": "always_sample"}]}},
    {"name": "c", "type": "composite", "composite": {
        "max_total_spans_per_second": 100, "policy_order": ["c1", "c2"],
        "composite_sub_policy": [{"name": "c1", "type": "error"}, {"name": "c2", "type": "always_sample"}],
        "rate_allocation": [{"policy": "c1", "percent": 60}, {"policy": "c2", "percent": 40}]}},
    {"name": "f", "type": "first_match", "first_match": {"policies": [{"name": "f1", "type": "error"}]}},
    {"name": "slo", "type": "slo", "slo": "ttft=0.5"},
    {"name": "pct", "type": "latency_percentile", "latency_percentile": {"quantile": 0.99, "measure": "ttft"}},
    {"name": "sdk", "type": "sdk_decision", "sdk_decision": {"reasons": ["slo_breach"]}},
]


def test_registry_builds_every_type() -> None:
    built = build_policies(REGISTRY_OK, FakeClock())
    assert [p.name for p in built] == [e["name"] for e in REGISTRY_OK]


@pytest.mark.parametrize("entry,match", [
    ({"name": "x", "type": "nope"}, "unknown type"),
    ({"name": "x", "type": "probabilistic", "probabilistic": {"sampling_percentage": 150}}, "within"),
    ({"name": "x", "type": "probabilistic", "probabilistic": {"sampling_percentage": "ten"}}, "number"),
    ({"name": "x", "type": "latency", "latency": {}}, "threshold_ms"),
    ({"name": "x", "type": "status_code", "status_code": {"status_codes": ["BAD"]}}, "status_codes"),
    ({"name": "x", "type": "rate_limiting", "rate_limiting": {"spans_per_second": 0}}, "positive"),
    ({"name": "x", "type": "and", "and": {"and_sub_policy": []}}, "non-empty"),
    ({"name": "x", "type": "latency_percentile", "latency_percentile": {"quantile": 2}}, "quantile"),
    ({"name": "x", "type": "latency_percentile", "latency_percentile": {"bogus": 1}}, "unknown"),
    ({"name": "x", "type": "slo", "slo": "ttft=fast"}, "bad slo"),
    ("not a mapping", "mapping"),
])
def test_registry_rejects_bad_config_with_a_clear_error(entry, match) -> None:
    with pytest.raises(PolicyConfigError, match=match):
        build_policy(entry, FakeClock())
