"""The generated scale-out files cover disaggregated serving: prefill and decode instances both export to the
tier, and neither the deferred reason of a prefill half nor the half itself counts as a user request.

The two-tier layout's behaviour (trace-id routing, the trace kept or dropped whole, each user request counted
once) is exercised end to end in test_two_tier_loopback.py; here the all-upstream file, which has no joining
gateway, is held to the same rules as far as upstream can follow them."""

from __future__ import annotations

from ottl_check import parse_condition

from otel_llm import semconv as sc
from otel_llm.core.metrics import GOOD_REQUESTS, REQUESTS
from otel_llm_collector.config import CollectorConfig
from otel_llm_collector.scale_config import ScaleOptions, generate


def _upstream() -> dict:
    return generate(ScaleOptions(), "upstream")["upstream-only.yaml"]


def test_a_prefill_halfs_deferred_reason_is_not_a_decision_to_keep():
    (policy,) = [p for p in _upstream()["processors"]["tail_sampling"]["policies"] if p["name"] == "sdk_decision"]
    (condition,) = policy["ottl_condition"]["span"]
    parse_condition(condition)
    assert f'attributes["{sc.SAMPLING_REASON}"] != "{sc.SAMPLING_REASON_DEFERRED}"' in condition


def test_the_goodput_counters_leave_prefill_halves_out_and_every_series_names_the_role():
    metrics = _upstream()["connectors"]["signal_to_metrics"]["spans"]
    for m in metrics:
        assert {"key": sc.DISAGG_ROLE, "optional": True} in m["attributes"], m["name"]
    counters = {m["name"]: m for m in metrics if m["name"] in (REQUESTS, GOOD_REQUESTS)}
    assert set(counters) == {REQUESTS, GOOD_REQUESTS}
    for m in counters.values():
        (condition,) = m["conditions"]
        parse_condition(condition)
        assert f'attributes["{sc.DISAGG_ROLE}"] != "{sc.DISAGG_ROLE_PREFILL}"' in condition


def test_the_gateway_tier_joins_the_halves_it_receives():
    """Tier 2 runs llm_metrics (where the halves are joined into the user's request) and honours SDK decisions
    other than the deferred one; its file loads as our config."""
    tier2 = generate(ScaleOptions(), "two-tier")["tier2-gateway.yaml"]
    assert "llm_metrics" in tier2["processors"]
    assert {"name": "sdk_decision", "type": "sdk_decision"} in tier2["processors"]["tail_sampling"]["policies"]
    assert CollectorConfig.from_mapping(tier2).llm_metrics
