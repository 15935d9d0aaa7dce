"""The gateway derives the SLO breach counter by cause from request spans, as the SDK records it."""

from __future__ import annotations

from collector_testkit import export_request, loopback_config, request_attrs, span

from otel_llm import semconv as sc
from otel_llm.core.metrics import SLO_BREACHES
from otel_llm_collector.gateway import Gateway
from support.metrics import points_by_name


def test_breaches_are_counted_by_objective_and_the_span_s_slow_cause() -> None:
    config = loopback_config(processors={"tail_sampling": None, "llm_metrics": {"slo": "ttft=0.5,tpot=0.05"}})
    g = Gateway(config, manual_ticks=True).start()
    try:
        kv = {sc.SLOW_CAUSE: sc.SLOW_QUEUE_KV_CACHE}
        g.ingest(export_request(
            span(1, 1, attrs=request_attrs(ttft=2.0, tpot=0.01, **kv)),  # a TTFT breach, KV queueing
            span(2, 1, attrs=request_attrs(ttft=2.0, tpot=0.1, **kv)),  # TTFT and TPOT
            span(3, 1, attrs=request_attrs(ttft=2.0)),  # no verdict on the span: unknown
            span(4, 1, attrs=request_attrs(ttft=0.1, **kv)),  # met its SLOs: not a breach
        ))
        got = sorted((p.attributes[sc.SLO_OBJECTIVE], p.attributes[sc.SLOW_CAUSE], p.value)
                     for p in points_by_name(g.metric_reader.get_metrics_data())[SLO_BREACHES])
    finally:
        g.shutdown()
    assert got == [("tpot", sc.SLOW_QUEUE_KV_CACHE, 1), ("ttft", sc.SLOW_QUEUE_KV_CACHE, 2),
                   ("ttft", sc.SLOW_UNKNOWN, 1)]
