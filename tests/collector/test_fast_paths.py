"""The collector's own speed-ups (otel_llm_collector/fast/) against the core's derivation, and the policies
built once: the config holds validated specs, each gateway builds its own policies from them."""

from __future__ import annotations

import random
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.core.sampling import OptionError, TraceView
from otel_llm.core.sampling.registry import TYPES, PolicyConfigError, PolicySpec, build, parse_policies, parse_policy
from otel_llm.core.summary import ATTRIBUTE_SLOTS, RequestSummary
from otel_llm_collector.config import CollectorConfig
from otel_llm_collector.fast.summary import MAX_PLANS, summary_reader
from otel_llm_collector.gateway import Gateway
from otel_llm.otlp.view import SpanView, value_of
from otel_llm_collector.spans import TYPED

from collector_testkit import FakeClock, span

# values of every kind a client may send for our attributes, the odd ones included
_VALUES: list[Any] = [0.25, 3.0, 0, 7, 200, 1 << 40, -1, True, "m", "", "stop", ["stop", "length"], 1e308,
                      float("nan"),
                      # inter-token bucket counts: small (one byte each), two-byte, larger, odd types and lengths
                      [0, 3, 40, 100, 50, 5, 1, 0, 0, 0, 0, 0, 0, 0], [0, 300, 16383, 127, 128, 0, 0, 0, 0, 0, 0, 0, 0, 9],
                      [16384] + [0] * 13, [1 << 40] + [1] * 13, [-1] + [0] * 13, [0.5] + [0] * 13, [True] + [0] * 13,
                      [1] * 13, [1] * 40, [], ["1"] * 14]


def _encoded(attrs: dict[str, Any]) -> Any:
    return SpanView.FromString(span(1, 1, attrs=attrs).SerializeToString()).attributes


def test_the_summary_reader_equals_from_attributes_over_every_key_set_beyond_its_plan_bound() -> None:
    """Random subsets of our attributes (more distinct key sets than the reader remembers), random values of
    every type, with and without foreign keys: the encoded reader gives what ``from_attributes`` gives over
    the decoded values, field for field (NaN compared as NaN)."""
    rng = random.Random(11)
    read = summary_reader(value_of, TYPED)
    ours = list(ATTRIBUTE_SLOTS)
    seen_key_sets: set[frozenset] = set()
    for _ in range(3 * MAX_PLANS):
        keys = rng.sample(ours, rng.randint(1, len(ours)))
        attrs = {k: rng.choice(_VALUES) for k in keys}
        attrs[rng.choice((sc.LATENCY_E2E, sc.LATENCY_TTFT))] = rng.choice((0.5, 2, "x"))
        if rng.random() < 0.5:
            attrs["http.route"] = "/v1/chat"
        seen_key_sets.add(frozenset(attrs))
        decoded = {k: value_of(v) for k, v in _encoded(attrs).items()}
        want, got = RequestSummary.from_attributes(decoded), read(_encoded(attrs))
        assert got is not None and want is not None
        for name in RequestSummary.__slots__:
            a, b = getattr(got, name), getattr(want, name)
            assert type(a) is type(b) and (a == b or (a != a and b != b)), (name, attrs)
    assert len(seen_key_sets) > MAX_PLANS  # the reader's bound was passed: later key sets read key by key


def test_the_summary_reader_hands_native_spans_to_the_core_and_ignores_others() -> None:
    read = summary_reader(value_of, TYPED)
    native = {sc.VLLM_TTFT: 0.1, sc.VLLM_E2E: 1.1, sc.VLLM_DECODE: 0.9, sc.VLLM_COMPLETION_TOKENS: 10}
    assert read(_encoded(native)) == RequestSummary.from_attributes(native)
    assert read(_encoded({"http.method": "GET"})) is None and read(_encoded({})) is None


def test_config_holds_validated_specs_and_each_gateway_builds_its_own_policies() -> None:
    cfg = CollectorConfig.from_yaml("")
    specs = cfg.tail_sampling.policies
    assert specs and all(isinstance(s, PolicySpec) for s in specs)
    clock = FakeClock()
    a, b = Gateway(cfg, clock=clock, manual_ticks=True), Gateway(cfg, clock=clock, manual_ticks=True)
    try:
        pa, pb = a.sampler.policies, b.sampler.policies
        assert [p.name for p in pa] == [s.name for s in specs] == [p.name for p in pb]
        assert all(x is not y for x, y in zip(pa, pb))  # state (the percentile sketches) is per gateway
    finally:
        a.shutdown(0)
        b.shutdown(0)


def test_building_specs_runs_no_check_the_parse_did_not() -> None:
    """Every rule a policy's constructor applies is its ``check``, which the registry ran at parse time: a
    spec that parsed always builds (here: every type, built twice, with another clock and SLO table)."""
    entries = [
        {"name": "sa", "type": "string_attribute", "string_attribute": {"key": "k", "values": ["^a"],
                                                                         "enabled_regex_matching": True}},
        {"name": "na", "type": "numeric_attribute", "numeric_attribute": {"key": "k", "min_value": 1}},
        {"name": "ba", "type": "boolean_attribute", "boolean_attribute": {"key": "k", "value": False}},
        {"name": "sc", "type": "span_count", "span_count": {"max_spans": 3}},
        {"name": "l", "type": "latency", "latency": {"threshold_ms": 5}},
        {"name": "c", "type": "composite", "composite": {
            "max_total_spans_per_second": 10, "composite_sub_policy": [{"name": "e", "type": "error"}],
            "rate_allocation": [{"policy": "e", "percent": 100}]}},
        {"name": "s", "type": "slo"},
    ]
    specs = parse_policies(entries)
    for _ in range(2):
        built = build(specs, FakeClock(), None)
        assert [p.name for p in built] == [e["name"] for e in entries]
        assert not any(p.evaluate(TraceView(1)).sampled for p in built if p.name in ("sa", "na", "ba", "l", "s"))


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_every_registry_row_names_real_constructor_arguments(kind: str) -> None:
    """The table is the registry: each option feeds a constructor argument that exists (a renamed argument
    fails here, not at a user's config load)."""
    import inspect

    row = TYPES[kind]
    params = inspect.signature(row.cls.__init__).parameters
    for option in row.options:
        assert option.param in params or row.arrange is not None, (kind, option)
    assert "name" in params and (not row.clock or "clock" in params)


def test_a_constructor_and_the_registry_refuse_the_same_value_with_the_same_words() -> None:
    from otel_llm.core.sampling import NumericAttributePolicy

    with pytest.raises(OptionError) as direct:
        NumericAttributePolicy("k", 5, 1)
    with pytest.raises(PolicyConfigError) as via_config:
        parse_policy({"name": "x", "type": "numeric_attribute",
                      "numeric_attribute": {"key": "k", "min_value": 5, "max_value": 1}})
    assert str(via_config.value) == f"policy 'x': numeric_attribute.{direct.value}"
