"""TensorRT-LLM's own ``llm_request`` spans -> the gateway: derived metrics equal TensorRT-LLM's formulas.

The spans carry exactly what TensorRT-LLM release 1.2.1 writes: values as
``tensorrt_llm/executor/result.py`` ``GenerationResultBase.do_tracing`` @ 1.2.1 sets them (read in the
source page the release's documentation publishes, commit 376f7e1; ``native_span`` and
``native_attributes`` below follow it line by line): span ``llm_request``, kind SERVER, started at the
engine's steady-clock arrival plus ``time.time() - time.monotonic()`` and ended when ``do_tracing``
returns; latencies from ``metrics_dict`` (``_process_req_perf_metrics``: TTFT = first token - arrival,
e2e = last token - arrival, queue = first scheduled - arrival, values <= 0 dropped, so a missing one is
written as -1); the KV-cache transfer time always (0.0 without a transfer), and events
``kv_cache_transfer_start`` / ``kv_cache_transfer_end`` (the latter with ``kv_cache_size``) when both
stamps are set (disaggregated serving); finish reasons as ``json.dumps([reason])``; no model, no provider.

The attribute and event *names* are the ``tracing.SpanAttributes`` / ``tracing.SpanEvents`` members
1.2.1's ``do_tracing`` uses; their string values live in ``tensorrt_llm/llmapi/tracing.py``, which the
release's documentation does not publish. They are taken from the stored versions of that file: at
5f158410 (PR #5897's merge) for all but the KV-cache transfer ones, which it did not have yet and which
1.2.1 uses; those from the later stored versions (e.g. forks HuiGao-NV/TensorRT-LLM@195839a7,
michaelfeil/TensorRT-LLM@2b272e49), where every value 5f158410 had is unchanged.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from collector_testkit import any_value, export_request, loopback_config, span
from otel_llm.core.metrics import SERVER_HISTOGRAMS, TOKEN_USAGE
from otel_llm_collector.gateway import Gateway

# tensorrt_llm/llmapi/tracing.py, class SpanAttributes (all of it; see the module docstring for where)
GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_ID = "gen_ai.request.id"
GEN_AI_REQUEST_N = "gen_ai.request.n"
GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_KV_CACHE_TRANSFER_TIME = "gen_ai.latency.kv_cache_transfer_time"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
# class SpanEvents, the two do_tracing adds
KV_CACHE_TRANSFER_START = "kv_cache_transfer_start"
KV_CACHE_TRANSFER_END = "kv_cache_transfer_end"
TIME_CORRECTION = 1_700_000_000.0  # time.time() - time.monotonic() when do_tracing ran


def metrics_dict(arrival: float, sched: float, first: float, last: float, n_out: int) -> dict[str, float]:
    """result.py ``_process_req_perf_metrics`` @ 1.2.1 (n == 1)."""
    stat = {"ttft": first - arrival, "e2e": last - arrival, "request_queue_time": sched - arrival}
    if n_out > 1:
        stat["tpot"] = (last - first) / (n_out - 1)
    return {k: v for k, v in stat.items() if v > 0}


def native_attributes(m: dict[str, float], *, request_id: int, prompt_tokens: int, completion_tokens: int,
                      finish_reason: str | None, temperature: float | None = 0.7, top_p: float | None = 0.9,
                      top_k: int | None = 40, max_tokens: int = 64, n: int = 1,
                      kv_transfer: tuple[float, float] = (0.0, 0.0)) -> dict:
    """result.py ``do_tracing`` @ 1.2.1: ``safe_set_attr`` skips None values (0.0 is set)."""
    values = {
        GEN_AI_REQUEST_TEMPERATURE: temperature, GEN_AI_REQUEST_TOP_P: top_p, GEN_AI_REQUEST_TOP_K: top_k,
        GEN_AI_REQUEST_MAX_TOKENS: max_tokens, GEN_AI_REQUEST_N: n, GEN_AI_REQUEST_ID: request_id,
        GEN_AI_USAGE_PROMPT_TOKENS: prompt_tokens or None,  # set only when prompt_token_ids is non-empty
        GEN_AI_USAGE_COMPLETION_TOKENS: completion_tokens,
        GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: m.get("ttft", -1),
        GEN_AI_LATENCY_E2E: m.get("e2e", -1),
        GEN_AI_LATENCY_TIME_IN_QUEUE: m.get("request_queue_time", -1),
        GEN_AI_RESPONSE_FINISH_REASONS: json.dumps([finish_reason]) if finish_reason else None,
        # req_perf_metrics_dict.get(KV_CACHE_TRANSFER_END, 0.0) - .get(KV_CACHE_TRANSFER_START, 0.0)
        GEN_AI_LATENCY_KV_CACHE_TRANSFER_TIME: kv_transfer[1] - kv_transfer[0],
    }
    return {k: v for k, v in values.items() if v is not None}


def native_span(trace: int, attrs: dict, arrival: float, traced_at: float,
                kv_transfer: tuple[float, float] = (0.0, 0.0), kv_cache_size: int = 0) -> PbSpan:
    """``start_time=int((arrival_time + time_correction) * 1e9)``, ``arrival_time`` the engine's steady
    clock; it ends when ``do_tracing``'s ``with`` block does (``traced_at``, steady)."""
    s = span(trace, 1, name="llm_request", attrs=attrs, start=int((arrival + TIME_CORRECTION) * 1e9),
             end=int((traced_at + TIME_CORRECTION) * 1e9))
    s.kind = PbSpan.SPAN_KIND_SERVER
    start, end = kv_transfer
    if start and end:  # tracing.add_event on the current span, both stamps corrected the same way
        events: list[tuple[str, float, dict[str, Any]]] = [
            (KV_CACHE_TRANSFER_START, start, {}), (KV_CACHE_TRANSFER_END, end, {"kv_cache_size": kv_cache_size})]
        for name, ts, attributes in events:
            e = s.events.add(name=name, time_unix_nano=int((ts + TIME_CORRECTION) * 1e9))
            for k, v in attributes.items():
                e.attributes.add(key=k).value.CopyFrom(any_value(v))
    return s


def histograms(g: Gateway) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for rm in g.metric_reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    if hasattr(p, "bucket_counts"):
                        count, total = out.get(m.name, (0, 0.0))
                        out[m.name] = (count + p.count, total + p.sum)
    return out


def token_sums(g: Gateway) -> dict[str, float]:
    out: dict[str, float] = {}
    for rm in g.metric_reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == TOKEN_USAGE:
                    for p in m.data.data_points:
                        kind = dict(p.attributes)["gen_ai.token.type"]
                        out[kind] = out.get(kind, 0.0) + p.sum
    return out


@pytest.fixture
def gateway():
    g = Gateway(loopback_config(processors={"tail_sampling": None}, exporters={"prometheus": None},
                                receivers={"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                                                  "http": None}}}),
                manual_ticks=True).start()
    yield g
    g.shutdown()


def test_native_trtllm_spans_give_trtllm_formulas(gateway: Gateway) -> None:
    rng = random.Random(5)
    expected = {"ttft": [], "e2e": [], "queue": [], "tpot": [], "prefill": []}
    prompt = completion = 0
    n_requests = 40
    for i in range(n_requests):
        arrival = 1000.0 + i
        sched = arrival + rng.uniform(0.001, 0.2)
        first = sched + rng.uniform(0.01, 0.5)
        n_out = rng.randint(1, 200)
        last = first + (n_out - 1) * rng.uniform(0.005, 0.05)
        m = metrics_dict(arrival, sched, first, last, n_out)
        p_tokens = rng.randint(1, 4000)
        # every fourth a disaggregated generation request: its KV cache came from a context server
        kv = (arrival + 0.0005, arrival + 0.0005 + rng.uniform(0.001, 0.02)) if i % 4 == 3 else (0.0, 0.0)
        attrs = native_attributes(m, request_id=i, prompt_tokens=p_tokens, completion_tokens=n_out,
                                  finish_reason=rng.choice(["length", "stop"]), kv_transfer=kv)
        native = native_span(i + 1, attrs, arrival, last + rng.uniform(0.0, 0.002), kv, kv_cache_size=4096)
        assert len(native.events) == (2 if i % 4 == 3 else 0)
        gateway.ingest(export_request(native, service="trtllm-serve"))
        expected["ttft"].append(first - arrival)
        expected["e2e"].append(last - arrival)
        expected["queue"].append(sched - arrival)
        if n_out > 1:
            expected["tpot"].append((last - first) / (n_out - 1))
        prompt += p_tokens
        completion += n_out
    # a request whose TTFT TensorRT-LLM could not compute (written as -1): no TTFT value, the rest counts
    m = metrics_dict(2000.0, 2000.1, 2000.1, 2000.5, 3)
    del m["ttft"]
    gateway.ingest(export_request(native_span(999, native_attributes(
        m, request_id=999, prompt_tokens=7, completion_tokens=3, finish_reason="length"), 2000.0, 2000.5),
        service="trtllm-serve"))
    expected["e2e"].append(0.5)
    expected["queue"].append(0.1)
    prompt += 7
    completion += 3

    h = histograms(gateway)
    names = {s.name: s for s in SERVER_HISTOGRAMS}
    checks = {"gen_ai.server.time_to_first_token": expected["ttft"], "gen_ai.server.request.duration": expected["e2e"],
              "llm.server.queue.duration": expected["queue"], "gen_ai.server.time_per_output_token": expected["tpot"]}
    for name, values in checks.items():
        assert name in names
        assert h[name][0] == len(values), name
        assert h[name][1] == pytest.approx(sum(values), rel=1e-9, abs=1e-9), name
    assert "llm.server.prefill.duration" not in h  # TensorRT-LLM's span reports no prefill time
    assert token_sums(gateway) == {"input": prompt, "output": completion}
    assert gateway.telemetry.value("llm_metrics_requests", source="native") == n_requests + 1


@pytest.mark.parametrize("scope, provider", [("trt.llm", "tensorrt_llm"), ("vllm.llm_engine", "vllm"),
                                             ("vllm.tracing.otel", "vllm"), ("someone.else", None), ("", None)])
def test_a_native_span_gets_its_provider_from_its_tracers_scope(gateway: Gateway, scope: str,
                                                                 provider: str | None) -> None:
    """The engines' own spans name no provider (the conventions require one on the derived series): the
    instrumentation scope of the engine's tracer says which engine sent it; an unknown scope says nothing."""
    m = metrics_dict(10.0, 10.1, 10.2, 11.0, 5)
    request = export_request(native_span(7, native_attributes(m, request_id=7, prompt_tokens=3, completion_tokens=5,
                                                              finish_reason="length"), 10.0, 11.0))
    request.resource_spans[0].scope_spans[0].scope.name = scope
    gateway.ingest(request)
    providers = {dict(p.attributes).get("gen_ai.provider.name")
                 for rm in gateway.metric_reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                 for mt in sm.metrics if mt.name == TOKEN_USAGE for p in mt.data.data_points}
    assert providers == {provider}


def test_finish_reason_is_read_from_trtllms_json_string() -> None:
    from otel_llm.core.summary import RequestSummary

    m = metrics_dict(10.0, 10.1, 10.2, 11.0, 5)
    s = RequestSummary.from_attributes(native_attributes(m, request_id=1, prompt_tokens=3, completion_tokens=5,
                                                         finish_reason="length", kv_transfer=(10.0, 10.05)))
    assert s.finish_reason == "length"
    assert s.ttft == pytest.approx(0.2) and s.queue == pytest.approx(0.1) and s.e2e == pytest.approx(1.0)
    assert s.tpot == pytest.approx(0.8 / 4)
    assert s.model is None and s.provider is None  # TensorRT-LLM's span names neither


def test_our_adapter_and_trtllms_own_span_agree(gateway: Gateway) -> None:
    """The same requests through our TensorRT-LLM adapter (SDK metrics) and as TensorRT-LLM's native spans
    (built from the same perf metrics, as do_tracing does) give the same TTFT / e2e / queue / TPOT sums."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "trtllm"))
    try:
        import fake_trtllm as fake
        from trtllm_env import instrumented
    finally:
        sys.path.pop(0)
    modules = fake.build()
    fake.install(modules)
    env = instrumented(modules)
    try:
        from tensorrt_llm.llmapi.llm import LLM
        from tensorrt_llm.sampling_params import SamplingParams

        outs = LLM(model="m", engine=fake.FakeEngine(max_batch=3)).generate(
            ["a b c", "d e", "f g h i", "j", "k l m n o"], SamplingParams(max_tokens=5))
        for i, out in enumerate(outs):
            tm = out.outputs[0].request_perf_metrics.timing_metrics
            stamps = [getattr(tm, k).total_seconds() for k in ("arrival_time", "first_scheduled_time",
                                                                "first_token_time", "last_token_time")]
            m = metrics_dict(*stamps, out.outputs[0].length)
            gateway.ingest(export_request(native_span(i + 1, native_attributes(
                m, request_id=out.request_id, prompt_tokens=len(out.prompt_token_ids),
                completion_tokens=out.outputs[0].length, finish_reason=out.outputs[0].finish_reason),
                stamps[0], stamps[3])))
        native = histograms(gateway)
        for name in ("gen_ai.server.time_to_first_token", "gen_ai.server.request.duration",
                     "llm.server.queue.duration", "gen_ai.server.time_per_output_token"):
            ours = env.points(name)
            assert native[name][0] == sum(p.count for p in ours) == len(outs), name
            assert native[name][1] == pytest.approx(sum(p.sum for p in ours), rel=1e-9, abs=1e-9), name
    finally:
        env.inst.uninstrument()
        fake.uninstall()
