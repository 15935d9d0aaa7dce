"""Acceptance 5: every policy keeps and drops what it should, on constructed traces (table-driven)."""

from __future__ import annotations

import random

import pytest

from otel_llm.core.sampling import (NOT_SAMPLED, AlwaysSample, AndPolicy, BooleanAttributePolicy, BytesLimitingPolicy,
                                    CompositePolicy,
                                    Decision, DropPolicy, ErrorPolicy, FirstMatchPolicy, LatencyPercentilePolicy,
                                    LatencyPolicy, NotPolicy, NumericAttributePolicy, ProbabilisticPolicy,
                                    RateLimitingPolicy, RecordedReasonPolicy, SLOPolicy, SpanCountPolicy,
                                    StatusCodePolicy, StringAttributePolicy, TraceView, Verdict, attribute_keys,
                                    first_match)
from otel_llm.core.sampling.registry import PolicyConfigError, build_policies, build_policy
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


def test_rate_limiting_is_a_token_bucket_with_twice_the_rate_as_burst() -> None:
    # upstream: golang.org/x/time/rate, rate = spans_per_second, burst = 2x, starting full, AllowN(span count)
    clock = FakeClock()
    p = RateLimitingPolicy(10, clock)
    assert [p.evaluate(view(spans=4)).sampled for _ in range(6)] == [True] * 5 + [False]
    clock.advance(0.5)  # 5 tokens back
    assert [p.evaluate(view(spans=3)).sampled for _ in range(2)] == [True, False]
    clock.advance(10.0)  # refilled, but never past the burst
    assert not p.evaluate(view(spans=21)).sampled
    assert p.evaluate(view(spans=20)).sampled and not p.evaluate(view(spans=1)).sampled


def test_bytes_limiting_charges_the_traces_encoded_size() -> None:
    clock = FakeClock()
    p = BytesLimitingPolicy(1000, clock, burst_capacity=1500)
    assert [p.evaluate(TraceView(1, size_bytes=600)).sampled for _ in range(3)] == [True, True, False]
    clock.advance(1.0)
    assert p.evaluate(TraceView(1, size_bytes=1000)).sampled
    assert not p.evaluate(TraceView(1, size_bytes=1600)).sampled  # above the burst: never
    assert BytesLimitingPolicy(100, clock).evaluate(TraceView(1, size_bytes=200)).sampled  # default burst 2x


def test_composite_allocates_budget_in_order() -> None:
    clock = FakeClock()
    p = CompositePolicy(10, [ErrorPolicy(), AlwaysSample()], [50, 50], clock)
    kept = [p.evaluate(view(error=True, spans=1)).reason for _ in range(7)]
    # 5 spans/s for errors; past that an error trace is not kept (as upstream: the first sampled vote decides,
    # the always share is not borrowed), while traces the error policy passes over still get always's share
    assert kept == ["composite:error"] * 5 + [""] * 2
    assert [p.evaluate(view(spans=2)).reason for _ in range(3)] == ["composite:always"] * 2 + [""]
    p.evaluate(view(error=True, spans=1))  # still over the error share in this second
    assert p.evaluate(view(error=True, spans=1)).reason == ""
    clock.advance(1.0)  # a new second: every share is whole again
    assert p.evaluate(view(error=True, spans=5)).reason == "composite:error"
    assert not p.evaluate(view(error=True, spans=6)).sampled


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
    {"name": "sa", "type": "string_attribute", "string_attribute": {
        "key": "llm.model", "values": ["^gpt-4", "llama"], "enabled_regex_matching": True, "cache_max_size": 10,
        "invert_match": False}},
    {"name": "na", "type": "numeric_attribute", "numeric_attribute": {"key": "llm.temperature", "max_value": 0.5}},
    {"name": "ba", "type": "boolean_attribute", "boolean_attribute": {"key": "llm.stream", "value": True,
                                                                       "invert_match": True}},
    {"name": "sc", "type": "span_count", "span_count": {"min_spans": 2, "max_spans": 0}},
    {"name": "bl", "type": "bytes_limiting", "bytes_limiting": {"bytes_per_second": 10000, "burst_capacity": 5000}},
]


def test_registry_builds_every_type() -> None:
    built = build_policies(REGISTRY_OK, FakeClock())
    assert [p.name for p in built] == [e["name"] for e in REGISTRY_OK]


@pytest.mark.parametrize("entry,match", [
    ({"name": "x", "type": "nope"}, "unknown type"),
    ({"name": "x", "type": "bytes_limiting", "bytes_limiting": {}}, "bytes_per_second"),
    ({"name": "x", "type": "bytes_limiting", "bytes_limiting": {"bytes_per_second": 0}}, "positive"),
    ({"name": "x", "type": "bytes_limiting", "bytes_limiting": {"bytes_per_second": 9, "burst": 1}}, "unknown"),
    ({"name": "x", "type": "bytes_limiting", "bytes_limiting": {"bytes_per_second": 9, "burst_capacity": -1}},
     "positive"),
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
    # string_attribute
    ({"name": "x", "type": "string_attribute", "string_attribute": {"values": ["a"]}}, "missing string_attribute.key"),
    ({"name": "x", "type": "string_attribute"}, "missing string_attribute.key"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {"key": 5, "values": ["a"]}},
     r"string_attribute.key must be a non-empty string"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {"key": "k"}}, r"values must be a non-empty list"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {"key": "k", "values": []}}, "non-empty list"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {"key": "k", "values": "a"}}, "non-empty list"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {"key": "k", "values": [200]}}, "quote numbers"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {
        "key": "k", "values": ["ok", "(unclosed"], "enabled_regex_matching": True}}, r"bad regex '\(unclosed'"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {
        "key": "k", "values": ["a"], "enabled_regex_matching": "yes"}}, "enabled_regex_matching must be true or false"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {
        "key": "k", "values": ["a"], "invert_match": "false"}}, "invert_match must be true or false"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {
        "key": "k", "values": ["a"], "cache_max_size": "big"}}, "cache_max_size must be an integer"),
    ({"name": "x", "type": "string_attribute", "string_attribute": {
        "key": "k", "values": ["a"], "invert_matches": True}}, r"unknown string_attribute keys \['invert_matches'\]"),
    # numeric_attribute
    ({"name": "x", "type": "numeric_attribute", "numeric_attribute": {"min_value": 1}},
     "missing numeric_attribute.key"),
    ({"name": "x", "type": "numeric_attribute", "numeric_attribute": {"key": "k"}}, "min_value, max_value or both"),
    ({"name": "x", "type": "numeric_attribute", "numeric_attribute": {"key": "k", "min_value": 5, "max_value": 1}},
     "min_value must be <= max_value"),
    ({"name": "x", "type": "numeric_attribute", "numeric_attribute": {"key": "k", "min_value": True}},
     "min_value must be a number"),
    ({"name": "x", "type": "numeric_attribute", "numeric_attribute": {"key": "k", "max_value": "10"}},
     "max_value must be a number"),
    ({"name": "x", "type": "numeric_attribute", "numeric_attribute": {"key": "k", "min_value": float("nan")}},
     "min_value must be a number"),
    ({"name": "x", "type": "numeric_attribute", "numeric_attribute": {"key": "k", "min_value": 1, "invert_match": 1}},
     "invert_match must be true or false"),
    # boolean_attribute
    ({"name": "x", "type": "boolean_attribute", "boolean_attribute": {"value": True}}, "missing boolean_attribute.key"),
    ({"name": "x", "type": "boolean_attribute", "boolean_attribute": {"key": "k"}}, "value must be true or false"),
    ({"name": "x", "type": "boolean_attribute", "boolean_attribute": {"key": "k", "value": "true"}},
     "value must be true or false"),
    ({"name": "x", "type": "boolean_attribute", "boolean_attribute": {"key": "k", "value": 1}},
     "value must be true or false"),
    # span_count
    ({"name": "x", "type": "span_count", "span_count": {}}, "min_spans, max_spans or both"),
    ({"name": "x", "type": "span_count", "span_count": {"min_spans": 5, "max_spans": 2}}, "max_spans must be >="),
    ({"name": "x", "type": "span_count", "span_count": {"min_spans": -1}}, "non-negative"),
    ({"name": "x", "type": "span_count", "span_count": {"min_spans": 2.5}}, "min_spans must be an integer"),
    ({"name": "x", "type": "span_count", "span_count": {"max_spans": True}}, "max_spans must be an integer"),
    ({"name": "x", "type": "span_count", "span_count": {"min_span": 2}}, "unknown span_count keys"),
])
def test_registry_rejects_bad_config_with_a_clear_error(entry, match) -> None:
    with pytest.raises(PolicyConfigError, match=match) as err:
        build_policy(entry, FakeClock())
    if isinstance(entry, dict):
        assert "policy 'x'" in str(err.value)  # names the policy, not just the problem


# --- attribute and span-count policies --------------------------------------------------------------


def av(attributes: dict | None = None, spans: int = 1) -> TraceView:
    """A trace whose spans and resources carried ``attributes`` (key -> every value seen)."""
    return TraceView(trace_id=1, attributes=attributes or {}, span_count=spans)


MODELS = ["gpt-4o", "llama-3"]
ATTRIBUTE_CASES = [
    # string_attribute, exact
    ("str exact hit", StringAttributePolicy("llm.model", MODELS), av({"llm.model": ("gpt-4o",)}), True),
    ("str exact miss", StringAttributePolicy("llm.model", MODELS), av({"llm.model": ("gpt-4",)}), False),
    ("str exact is not substring", StringAttributePolicy("llm.model", MODELS), av({"llm.model": ("gpt-4o-mini",)}),
     False),
    ("str any span matches", StringAttributePolicy("llm.model", MODELS), av({"llm.model": ("mistral", "llama-3")}),
     True),
    ("str missing key", StringAttributePolicy("llm.model", MODELS), av({"other": ("gpt-4o",)}), False),
    ("str no attributes", StringAttributePolicy("llm.model", MODELS), av(), False),
    ("str int value", StringAttributePolicy("http.status", ["200"]), av({"http.status": (200,)}), False),
    ("str bool value", StringAttributePolicy("flag", ["True"]), av({"flag": (True,)}), False),
    ("str array not searched", StringAttributePolicy("tags", ["a"]), av({"tags": (("a", "b"),)}), False),
    ("str empty string never matches", StringAttributePolicy("k", ["", "a"]), av({"k": ("",)}), False),
    # string_attribute, regex: search semantics (Go MatchString is unanchored)
    ("regex anchored hit", StringAttributePolicy("llm.model", ["^gpt-4"], regex=True), av({"llm.model": ("gpt-4o",)}),
     True),
    ("regex anchored miss", StringAttributePolicy("llm.model", ["^gpt-4"], regex=True),
     av({"llm.model": ("my-gpt-4",)}), False),
    ("regex unanchored finds inside", StringAttributePolicy("llm.model", ["gpt"], regex=True),
     av({"llm.model": ("my-gpt-4",)}), True),
    ("regex second pattern", StringAttributePolicy("llm.model", ["^gpt", "llama-[0-9]+$"], regex=True),
     av({"llm.model": ("meta/llama-3",)}), True),
    ("regex miss", StringAttributePolicy("llm.model", ["^gpt", "llama-[0-9]+$"], regex=True),
     av({"llm.model": ("llama-3-instruct",)}), False),
    ("regex empty string never matches", StringAttributePolicy("k", [".*"], regex=True), av({"k": ("",)}), False),
    ("regex dot-star skips non-strings", StringAttributePolicy("k", [".*"], regex=True), av({"k": (3, None)}), False),
    # string_attribute, invert_match: keep when no value matches
    ("str invert match -> no", StringAttributePolicy("http.route", ["/health"], invert_match=True),
     av({"http.route": ("/health",)}), False),
    ("str invert other value -> yes", StringAttributePolicy("http.route", ["/health"], invert_match=True),
     av({"http.route": ("/v1/chat",)}), True),
    ("str invert missing key -> yes", StringAttributePolicy("http.route", ["/health"], invert_match=True), av(), True),
    ("str invert one match blocks", StringAttributePolicy("http.route", ["/health"], invert_match=True),
     av({"http.route": ("/v1/chat", "/health")}), False),
    ("str invert regex", StringAttributePolicy("http.route", ["^/health"], regex=True, invert_match=True),
     av({"http.route": ("/healthz",)}), False),
    # numeric_attribute: inclusive, ints and floats, not bools
    ("num at min", NumericAttributePolicy("n", 1, 5), av({"n": (1,)}), True),
    ("num at max", NumericAttributePolicy("n", 1, 5), av({"n": (5,)}), True),
    ("num below", NumericAttributePolicy("n", 1, 5), av({"n": (0,)}), False),
    ("num above", NumericAttributePolicy("n", 1, 5), av({"n": (6,)}), False),
    ("num float in range", NumericAttributePolicy("llm.temperature", 0.0, 0.5), av({"llm.temperature": (0.25,)}), True),
    ("num float just above", NumericAttributePolicy("llm.temperature", 0.0, 0.5), av({"llm.temperature": (0.51,)}),
     False),
    ("num float bounds, int value", NumericAttributePolicy("n", 0.5, 1.5), av({"n": (1,)}), True),
    ("num any value", NumericAttributePolicy("n", 1, 5), av({"n": (100, 3)}), True),
    ("num bool is not a number", NumericAttributePolicy("n", 0, 5), av({"n": (True,)}), False),
    ("num string is not a number", NumericAttributePolicy("n", 0, 5), av({"n": ("3",)}), False),
    ("num array is not a number", NumericAttributePolicy("n", 0, 5), av({"n": ((3,),)}), False),
    ("num nan never in range", NumericAttributePolicy("n", min_value=0), av({"n": (float("nan"),)}), False),
    ("num missing key", NumericAttributePolicy("n", 0, 5), av({"m": (3,)}), False),
    ("num min only", NumericAttributePolicy("n", min_value=10), av({"n": (10**12,)}), True),
    ("num min only below", NumericAttributePolicy("n", min_value=10), av({"n": (9,)}), False),
    ("num max only", NumericAttributePolicy("n", max_value=10), av({"n": (-10**12,)}), True),
    ("num max only above", NumericAttributePolicy("n", max_value=10), av({"n": (10.5,)}), False),
    ("num invert in range -> no", NumericAttributePolicy("n", 1, 5, invert_match=True), av({"n": (3,)}), False),
    ("num invert out of range -> yes", NumericAttributePolicy("n", 1, 5, invert_match=True), av({"n": (9,)}), True),
    ("num invert missing key -> yes", NumericAttributePolicy("n", 1, 5, invert_match=True), av(), True),
    ("num invert non-number does not block", NumericAttributePolicy("n", 0, 5, invert_match=True),
     av({"n": ("3", False)}), True),
    ("num invert one in range blocks", NumericAttributePolicy("n", 1, 5, invert_match=True), av({"n": (9, 2)}), False),
    # boolean_attribute: only real booleans
    ("bool true", BooleanAttributePolicy("llm.stream", True), av({"llm.stream": (True,)}), True),
    ("bool false vs true", BooleanAttributePolicy("llm.stream", True), av({"llm.stream": (False,)}), False),
    ("bool want false", BooleanAttributePolicy("llm.stream", False), av({"llm.stream": (False,)}), True),
    ("bool 1 is not true", BooleanAttributePolicy("llm.stream", True), av({"llm.stream": (1,)}), False),
    ("bool 'true' is not true", BooleanAttributePolicy("llm.stream", True), av({"llm.stream": ("true",)}), False),
    ("bool non-bool is not false", BooleanAttributePolicy("llm.stream", False), av({"llm.stream": ("x", 0)}), False),
    ("bool any value", BooleanAttributePolicy("llm.stream", True), av({"llm.stream": (False, True)}), True),
    ("bool missing key", BooleanAttributePolicy("llm.stream", True), av(), False),
    ("bool invert match -> no", BooleanAttributePolicy("llm.stream", True, invert_match=True),
     av({"llm.stream": (True,)}), False),
    ("bool invert other -> yes", BooleanAttributePolicy("llm.stream", True, invert_match=True),
     av({"llm.stream": (False,)}), True),
    ("bool invert missing -> yes", BooleanAttributePolicy("llm.stream", True, invert_match=True), av(), True),
    # span_count: inclusive, max 0 = no upper bound
    ("spans at min", SpanCountPolicy(2, 5), av(spans=2), True),
    ("spans at max", SpanCountPolicy(2, 5), av(spans=5), True),
    ("spans below", SpanCountPolicy(2, 5), av(spans=1), False),
    ("spans above", SpanCountPolicy(2, 5), av(spans=6), False),
    ("spans max 0 = unbounded", SpanCountPolicy(2, 0), av(spans=100_000), True),
    ("spans max None = unbounded", SpanCountPolicy(2), av(spans=100_000), True),
    ("spans max only", SpanCountPolicy(max_spans=3), av(spans=4), False),
    ("spans max only within", SpanCountPolicy(max_spans=3), av(spans=1), True),
]


@pytest.mark.parametrize("label,policy,trace,kept", ATTRIBUTE_CASES, ids=[c[0] for c in ATTRIBUTE_CASES])
def test_attribute_policy_keep_or_drop(label, policy, trace, kept) -> None:
    d = policy.evaluate(trace)
    assert d.sampled is kept
    # a yes names the policy; a no is the shared NOT_SAMPLED (never a drop: invert_match adds no verdict)
    assert d == (Decision(Verdict.SAMPLED, policy.name) if kept else NOT_SAMPLED)


def test_regex_cache_is_bounded_and_stays_correct() -> None:
    p = StringAttributePolicy("k", ["^keep"], regex=True, cache_max_size=2)
    values = ["keep-1", "drop-1", "keep-2", "drop-2", "keep-3"]
    for _ in range(2):  # second round: evicted entries are recomputed, cached ones reused, same answers
        assert [p.evaluate(av({"k": (v,)})).sampled for v in values] == [True, False, True, False, True]
        assert len(p._cache) <= 2


def test_regex_cache_default_size_is_upstreams() -> None:
    p = StringAttributePolicy("k", ["x"], regex=True, cache_max_size=0)
    for i in range(300):
        p.evaluate(av({"k": (f"v{i}",)}))
    assert len(p._cache) == 128


@pytest.mark.parametrize("make", [
    lambda: StringAttributePolicy("", ["a"]),
    lambda: StringAttributePolicy("k", []),
    lambda: StringAttributePolicy("k", "abc"),
    lambda: StringAttributePolicy("k", ["("], regex=True),
    lambda: NumericAttributePolicy("k"),
    lambda: NumericAttributePolicy("k", 2, 1),
    lambda: NumericAttributePolicy("k", True),
    lambda: BooleanAttributePolicy("k", 1),
    lambda: SpanCountPolicy(-1),
    lambda: SpanCountPolicy(5, 2),
])
def test_constructors_validate(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_attribute_keys_union_through_nested_composites() -> None:
    model = StringAttributePolicy("llm.model", ["gpt-4o"])
    temp = NumericAttributePolicy("llm.temperature", max_value=0.2)
    stream = BooleanAttributePolicy("llm.stream", True)
    route = StringAttributePolicy("http.route", ["/health"])
    nested = FirstMatchPolicy([
        AndPolicy([model, NotPolicy(temp)]),
        DropPolicy([route]),
        CompositePolicy(100, [stream, ErrorPolicy()], [50, 50], FakeClock()),
        SpanCountPolicy(10),
    ])
    want = {"llm.model", "llm.temperature", "llm.stream", "http.route"}
    assert nested.attribute_keys == want
    assert attribute_keys([nested, ProbabilisticPolicy(0.1)]) == want
    assert AndPolicy([model, NotPolicy(temp)]).attribute_keys == {"llm.model", "llm.temperature"}
    assert DropPolicy([route]).attribute_keys == {"http.route"}
    assert NotPolicy(stream).attribute_keys == {"llm.stream"}
    assert attribute_keys([ErrorPolicy(), SpanCountPolicy(2), AndPolicy([AlwaysSample()])]) == frozenset()
    assert attribute_keys([]) == frozenset()


def test_attribute_keys_looks_into_undeclared_wrappers() -> None:
    class Wrapper:  # a hand-written composite that does not declare attribute_keys
        name = "wrap"

        def __init__(self, policies):
            self.policies = policies

        def evaluate(self, trace):
            return first_match(self.policies, trace)

    inner = Wrapper([NotPolicy(BooleanAttributePolicy("b", True)), StringAttributePolicy("s", ["x"])])
    assert attribute_keys([Wrapper([inner])]) == {"b", "s"}


def test_attribute_policies_compose() -> None:
    chat_on_gpt4 = AndPolicy([StringAttributePolicy("llm.model", ["^gpt-4"], regex=True),
                              NumericAttributePolicy("llm.temperature", min_value=1.0)], "hot_gpt4")
    assert chat_on_gpt4.evaluate(av({"llm.model": ("gpt-4o",), "llm.temperature": (1.2,)})) == \
        Decision(Verdict.SAMPLED, "hot_gpt4")
    assert not chat_on_gpt4.evaluate(av({"llm.model": ("gpt-4o",), "llm.temperature": (0.7,)})).sampled
    assert not chat_on_gpt4.evaluate(av({"llm.temperature": (1.2,)})).sampled
    # the upstream way to veto: drop on the plain match (an inverted match only declines to keep)
    policies = [AlwaysSample(), DropPolicy([StringAttributePolicy("http.route", ["/health"])], "no_health")]
    assert first_match(policies, av({"http.route": ("/ready", "/health")})) == Decision(Verdict.DROPPED, "no_health")
    assert first_match(policies, av({"http.route": ("/v1/chat",)})).sampled
    not_health = StringAttributePolicy("http.route", ["/health"], invert_match=True)
    assert first_match([not_health, AlwaysSample()], av({"http.route": ("/health",)})).sampled  # no veto


def test_registry_builds_attribute_policies_with_upstream_semantics() -> None:
    built = {p.name: p for p in build_policies(REGISTRY_OK, FakeClock())}
    sa, na, ba, sc = built["sa"], built["na"], built["ba"], built["sc"]
    assert isinstance(sa, StringAttributePolicy) and sa.evaluate(av({"llm.model": ("gpt-4-turbo",)})).sampled
    assert sa.evaluate(av({"llm.model": ("meta-llama",)})).sampled
    assert not sa.evaluate(av({"llm.model": ("x",)})).sampled
    assert na.evaluate(av({"llm.temperature": (0.5,)})).sampled
    assert not na.evaluate(av({"llm.temperature": (0.7,)})).sampled
    assert na.min_value is None and na.max_value == 0.5
    assert ba.evaluate(av()).sampled and not ba.evaluate(av({"llm.stream": (True,)})).sampled  # inverted
    assert sc.max_spans is None and sc.evaluate(av(spans=10**6)).sampled and not sc.evaluate(av(spans=1)).sampled
    assert attribute_keys(list(built.values())) == {"llm.model", "llm.temperature", "llm.stream"}


def test_registry_nested_attribute_policies_declare_their_keys() -> None:
    entry = {"name": "outer", "type": "and", "and": {"and_sub_policy": [
        {"name": "m", "type": "string_attribute", "string_attribute": {"key": "llm.model", "values": ["a"]}},
        {"name": "n", "type": "not", "not": {"not_sub_policy": {
            "name": "b", "type": "boolean_attribute", "boolean_attribute": {"key": "llm.stream", "value": False}}}},
        {"name": "d", "type": "drop", "drop": {"drop_sub_policy": [
            {"name": "t", "type": "numeric_attribute", "numeric_attribute": {"key": "llm.n", "min_value": 2}}]}},
    ]}}
    policy = build_policy(entry, FakeClock())
    assert attribute_keys([policy]) == {"llm.model", "llm.stream", "llm.n"}
