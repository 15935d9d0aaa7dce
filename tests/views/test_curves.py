"""The report's latency curves from step and request spans: what each plot holds, the roofline's
prediction beside a measured step, and the ridge point where both regimes are in the data."""

from __future__ import annotations

from otel_llm import semconv as sc
from otel_llm.views import curves
from otel_llm.views.traces import Span


def step(i: int, ms: float, prefill: int = 0, decoding: int = 0, **attrs) -> Span:
    return Span("s" * 32, f"st{i}", "", sc.SPAN_ENGINE_STEP, i * 10**8, i * 10**8 + int(ms * 1e6),
                {sc.STEP_NUM_PREFILL_TOKENS: prefill, sc.STEP_NUM_DECODE_REQS: decoding, **attrs}, "engine")


def test_prefill_and_decode_steps_go_to_their_curves_with_the_prediction() -> None:
    spans = [step(0, 40.0, prefill=512, **{sc.STEP_PREDICTED_TIME: 0.030}),
             step(1, 5.0, decoding=4, **{sc.STEP_KV_CACHE_USAGE: 0.1}),
             step(2, 6.0, decoding=8, **{sc.STEP_KV_CACHE_USAGE: 0.5}),
             Span("r" * 32, "req", "", "chat m", 0, 10**9, {sc.LATENCY_E2E: 1.0, sc.LATENCY_TTFT: 0.2,
                                                           sc.USAGE_INPUT_TOKENS: 300}, "svc")]
    prefill, decode, roof, ttft = curves.build(spans)
    assert [(p.x, p.y, p.predicted) for p in prefill.points] == [(512, 40.0, 30.0)]
    assert [(p.x, p.y, p.colour) for p in decode.points] == [(4, 5.0, 0.0), (8, 6.0, 1.0)]
    assert [(p.x, p.y) for p in ttft.points] == [(300, 200.0)]
    assert roof.points == [] and "device peaks unknown" in roof.note
    page = curves.section([prefill, decode, roof, ttft])
    assert page.count('<svg class="curve"') == 4 and page.count('class="predicted"') == 1


def test_the_ridge_point_comes_from_steps_on_both_sides_of_it() -> None:
    # peaks 100 GFLOP/s and 10 GB/s: ridge 10 FLOPs per byte
    compute = {sc.STEP_FLOPS: 2e9, sc.STEP_BYTES: 5e7, sc.STEP_INTENSITY: 40.0, sc.STEP_BOUND: "compute",
               sc.STEP_PREDICTED_TIME: 0.02}
    memory = {sc.STEP_FLOPS: 2e7, sc.STEP_BYTES: 2e7, sc.STEP_INTENSITY: 1.0, sc.STEP_BOUND: "memory",
              sc.STEP_PREDICTED_TIME: 0.002}
    roof = curves.build([step(0, 25.0, prefill=1024, **compute), step(1, 3.0, decoding=8, **memory)])[2]
    assert len(roof.points) == 2 and abs(roof.ridge - 10.0) < 1e-9
    assert 'class="ridge"' in curves.svg(roof)
    only_memory = curves.build([step(1, 3.0, decoding=8, **memory)])[2]
    assert only_memory.ridge is None and "both sides" in only_memory.note
