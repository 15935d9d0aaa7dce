"""A disaggregated request in a server's own metrics: labelled by its half, and counted once in goodput.

P's half (one token, ``llm.disagg.role=prefill``) and D's (``decode``) are each an instance's request; only
D's stands for the user request in the goodput counters (every user request has exactly one)."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm import semconv as sc
from otel_llm.core.metrics import GOOD_REQUESTS, REQUESTS, ServerMetrics
from otel_llm.core.slo import SLOTable
from otel_llm.core.summary import RequestSummary
from support.metrics import points_by_name


def _record(*summaries: RequestSummary) -> dict:
    reader = InMemoryMetricReader()
    metrics = ServerMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), SLOTable.parse("tpot=0.05"))
    for s in summaries:
        metrics.record(s)
    return points_by_name(reader.get_metrics_data())


def test_a_prefill_half_is_labelled_and_left_out_of_the_goodput_counters():
    p = RequestSummary(model="m", ttft=0.2, e2e=0.2, output_tokens=1, disagg_role=sc.DISAGG_ROLE_PREFILL)
    d = RequestSummary(model="m", ttft=0.05, tpot=0.01, e2e=0.3, output_tokens=20, disagg_role=sc.DISAGG_ROLE_DECODE)
    whole = RequestSummary(model="m", ttft=0.1, tpot=0.01, e2e=0.3, output_tokens=20)
    points = _record(p, d, whole)
    counted = {dict(x.attributes).get(sc.DISAGG_ROLE): x.value for x in points[REQUESTS]}
    assert counted == {sc.DISAGG_ROLE_DECODE: 1, None: 1}  # the user request once (D's), the plain one
    assert {dict(x.attributes).get(sc.DISAGG_ROLE): x.value for x in points[GOOD_REQUESTS]} == counted
    ttft = {dict(x.attributes).get(sc.DISAGG_ROLE): x.count for x in points["gen_ai.server.time_to_first_token"]}
    assert ttft == {sc.DISAGG_ROLE_PREFILL: 1, sc.DISAGG_ROLE_DECODE: 1, None: 1}  # each half's own series


def test_a_role_a_span_made_up_is_no_label():
    points = _record(RequestSummary(model="m", ttft=0.1, e2e=0.2, disagg_role="x" * 300))
    assert all(sc.DISAGG_ROLE not in dict(x.attributes) for x in points[REQUESTS])
