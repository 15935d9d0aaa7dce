"""The GenAI conventions on our spans, metrics and resources: the client's two metric sets (chosen by
``OTEL_SEMCONV_STABILITY_OPT_IN``), requested vs served model and aborts on server spans, vLLM's
``gen_ai.latency.*`` beside ours, a ``service.instance.id`` per process and the schema URL."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from otel_llm import semconv as sc
from otel_llm.core import providers
from otel_llm.core.client_metrics import CLIENT_METRICS, CLIENT_METRICS_LATEST, ClientMetrics, ClientSummary
from otel_llm.core.config import Config
from otel_llm.core.finish_facts import base_summary
from otel_llm.core.metrics import REQUESTS
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.slo import SLOTable
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestTimeline
from otel_llm.instrumentation.openai.record import token_details

LATEST = {sc.SEMCONV_OPT_IN_ENV: sc.GENAI_LATEST_EXPERIMENTAL}


def points(reader: InMemoryMetricReader) -> dict[str, list]:
    out: dict[str, list] = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def record_calls(latest: bool | None) -> dict[str, list]:
    reader = InMemoryMetricReader()
    metrics = ClientMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), SLOTable(), latest=latest)
    chat = ClientSummary(model="m", operation=sc.OPERATION_CHAT, provider="openai", e2e=0.5, ttft=0.1,
                         input_tokens=40, output_tokens=12, ttft_required=True, reasoning_tokens=5)
    chat.prefix_cache_hit_tokens = 32
    embeddings = ClientSummary(model="e", operation=sc.OPERATION_EMBEDDINGS, provider="openai", e2e=0.2,
                               input_tokens=7)
    metrics.record(chat, ("localhost", 8000))
    metrics.record(embeddings, ("localhost", 8000))
    return points(reader)


def test_by_default_the_client_records_the_names_the_contrib_instrumentations_emit_by_default():
    got = record_calls(latest=False)
    assert set(got) == {sc.METRIC_CLIENT_DURATION, sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK, sc.METRIC_CLIENT_TOKEN_USAGE,
                        sc.CLIENT_REQUESTS, sc.CLIENT_GOOD_REQUESTS}
    assert len(got[sc.METRIC_CLIENT_DURATION]) == 2  # chat and embeddings on one histogram, by operation
    usage = {(p.attributes[sc.OPERATION_NAME], p.attributes[sc.TOKEN_TYPE]): p.sum
             for p in got[sc.METRIC_CLIENT_TOKEN_USAGE]}
    assert usage == {("chat", "input"): 40, ("chat", "output"): 12, ("embeddings", "input"): 7}


def test_the_latest_conventions_put_inference_and_embeddings_apart_and_count_tokens():
    got = record_calls(latest=True)
    assert sc.METRIC_CLIENT_TOKEN_USAGE not in got and sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK not in got
    (inference,) = got[sc.METRIC_INFERENCE_DURATION]
    (embeddings,) = got[sc.METRIC_CLIENT_DURATION]  # embeddings are no inference (PR 521): their own metric
    assert (inference.attributes[sc.OPERATION_NAME], inference.sum) == ("chat", 0.5)
    assert (embeddings.attributes[sc.OPERATION_NAME], embeddings.sum) == ("embeddings", 0.2)
    assert [p.sum for p in got[sc.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK]] == [0.1]
    counters = {name: [(p.value, p.attributes[sc.TOKEN_MODALITY], p.attributes[sc.OPERATION_NAME]) for p in got[name]]
                for name in (sc.METRIC_USAGE_INPUT_TOKENS, sc.METRIC_USAGE_OUTPUT_TOKENS,
                             sc.METRIC_USAGE_CACHE_READ_INPUT_TOKENS, sc.METRIC_USAGE_REASONING_OUTPUT_TOKENS)}
    assert counters == {sc.METRIC_USAGE_INPUT_TOKENS: [(40, "unknown", "chat")],
                        sc.METRIC_USAGE_OUTPUT_TOKENS: [(12, "unknown", "chat")],
                        sc.METRIC_USAGE_CACHE_READ_INPUT_TOKENS: [(32, "unknown", "chat")],
                        sc.METRIC_USAGE_REASONING_OUTPUT_TOKENS: [(5, "unknown", "chat")]}
    assert [p.sum for p in got[sc.METRIC_OPERATION_INPUT_TOKENS]] == [40]
    assert [p.sum for p in got[sc.METRIC_OPERATION_OUTPUT_TOKENS]] == [12]
    assert all(p.attributes[sc.SERVER_ADDRESS] == "localhost" for p in got[sc.METRIC_USAGE_INPUT_TOKENS])


def test_the_version_is_chosen_once_from_the_environment_when_built(monkeypatch):
    monkeypatch.setenv(sc.SEMCONV_OPT_IN_ENV, f"http, {sc.GENAI_LATEST_EXPERIMENTAL}")
    m = ClientMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t"), SLOTable())
    monkeypatch.delenv(sc.SEMCONV_OPT_IN_ENV)
    assert m.latest and m.metric_set is CLIENT_METRICS_LATEST  # the variable is not read again per call
    monkeypatch.setenv(sc.SEMCONV_OPT_IN_ENV, "http")
    m = ClientMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t"), SLOTable())
    assert not m.latest and m.metric_set is CLIENT_METRICS


@pytest.mark.parametrize("usage, expected", [
    # chat/completions: cached tokens (vLLM with --enable-prompt-tokens-details), reasoning tokens
    (SimpleNamespace(prompt_tokens_details=SimpleNamespace(cached_tokens=16),
                     completion_tokens_details=SimpleNamespace(reasoning_tokens=9)), (16, 9)),
    # Responses: input/output token details
    (SimpleNamespace(input_tokens_details=SimpleNamespace(cached_tokens=0),
                     output_tokens_details=SimpleNamespace(reasoning_tokens=3)), (0, 3)),
    (SimpleNamespace(prompt_tokens_details=None, completion_tokens_details=None), (None, None)),  # not reported
    (SimpleNamespace(prompt_tokens_details=SimpleNamespace(cached_tokens="7")), (None, None)),  # not a count
    (SimpleNamespace(prompt_tokens_details=SimpleNamespace(cached_tokens=-1)), (None, None)),
])
def test_token_details_of_a_usage(usage, expected):
    assert token_details(usage) == expected


# -- server spans: requested and served model, aborts, vLLM's latency names --------------------------------


def serve(kind=SpanKind.INTERNAL, lora=None, asked=None, error=None):
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    pipeline = Pipeline(Config.resolve({"sample_rate": 1.0}, environ={}), tp.get_tracer("t"),
                        MeterProvider(metric_readers=[reader]).get_meter("t"), "test")
    base, arrival = time.monotonic() - 5.0, time.time() - 5.0
    t = RequestTimeline("r", arrival, model="base", kind=kind, response_id="r", input_tokens=10,
                        request_attributes={sc.REQUEST_MODEL: asked} if asked else {})
    t.lora_name = lora
    assert pipeline.start(t)
    t.events += [(QUEUED, base), (SCHEDULED, base + 0.01)]
    t.token_ts += [base + 0.05, base + 0.06, base + 0.08]
    t.finish_reason = "abort" if error else "length"
    s = base_summary(t, 0.08, None)  # the adapters' summary: its model is the requested one
    s.queue, s.prefill, s.decode, s.ttft, s.output_tokens, s.error_type = 0.01, 0.04, 0.03, 0.05, 3, error
    pipeline.finish("r", s)
    assert pipeline.flush(10)
    (span,) = [x for x in exporter.get_finished_spans() if x.parent is None]
    return span, points(reader)


@pytest.mark.parametrize("lora, asked, request_model, response_model", [
    (None, None, "base", "base"),  # offline, the base model
    ("sql-lora", None, "sql-lora", "sql-lora"),  # an adapter's request: served by the adapter
    ("sql-lora", "sql-lora", "sql-lora", "sql-lora"),
    (None, "alias-b", "alias-b", "base"),  # an alias of the served model (served-model-name's second name)
])
def test_the_request_span_names_the_requested_and_the_served_model(lora, asked, request_model, response_model):
    span, got = serve(SpanKind.SERVER, lora=lora, asked=asked)
    a = span.attributes
    assert (a[sc.REQUEST_MODEL], a[sc.RESPONSE_MODEL]) == (request_model, response_model)
    assert span.name == f"text_completion {request_model}"
    # the metrics carry what the client asked for, as the client's own do: the two series join on the model
    assert {p.attributes[sc.REQUEST_MODEL] for p in got[REQUESTS]} == {request_model}


def test_a_servers_abort_is_no_error_status_but_says_it_was_aborted():
    span, _ = serve(SpanKind.SERVER, error="aborted")
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes[sc.ERROR_TYPE] == "aborted" and span.attributes[sc.RESPONSE_FINISH_REASONS] == ("abort",)
    span, _ = serve(SpanKind.SERVER, error="engine_error")  # a failure is one
    assert span.status.status_code is StatusCode.ERROR
    span, _ = serve(SpanKind.INTERNAL, error="aborted")  # offline, the engine's own caller aborted: as before
    assert span.status.status_code is StatusCode.ERROR


def test_vllms_latency_names_carry_our_values():
    span, _ = serve(SpanKind.SERVER)
    a = span.attributes
    assert a[sc.VLLM_TTFT] == a[sc.LATENCY_TTFT] and a[sc.VLLM_E2E] == a[sc.LATENCY_E2E]
    assert a[sc.VLLM_QUEUE] == a[sc.LATENCY_QUEUE] and a[sc.VLLM_PREFILL] == a[sc.LATENCY_PREFILL]
    assert a[sc.VLLM_DECODE] == a[sc.LATENCY_DECODE]
    assert a[sc.VLLM_INFERENCE] == pytest.approx(a[sc.LATENCY_PREFILL] + a[sc.LATENCY_DECODE])
    # the collector still reads our canonical names from such a span (ours win over vLLM's)
    rebuilt = RequestSummary.from_attributes({**a, sc.VLLM_E2E: 99.0})
    assert rebuilt is not None and rebuilt.e2e == a[sc.LATENCY_E2E]


# -- resources and scopes ----------------------------------------------------------------------------------


def test_our_resource_has_an_instance_id_per_process(monkeypatch):
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    monkeypatch.setattr("opentelemetry.sdk.resources.Resource.create",
                        classmethod(lambda cls, attributes=None, schema_url=None: cls({"service.name": "x"})))
    first, second = providers.resource(), providers.resource()  # (an SDK release that sets none)
    assert first.attributes[sc.SERVICE_INSTANCE_ID] == second.attributes[sc.SERVICE_INSTANCE_ID]
    assert first.attributes["service.name"] == "x"
    assert providers._instance_id(1) != providers._instance_id(2)  # another process, another instance


def test_the_users_instance_id_wins(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-7,team=a")
    r = providers.resource()
    assert r.attributes[sc.SERVICE_INSTANCE_ID] == "pod-7" and r.attributes["team"] == "a"


def test_our_tracers_and_meters_carry_the_schema_url():
    from otel_llm.instrumentation.openai import OpenAIInstrumentor

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    inst = OpenAIInstrumentor()
    inst.instrument(tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        inst.telemetry.tracer.start_span("probe").end()
        inst.telemetry.metrics.record(ClientSummary(model="m", operation="chat", e2e=0.1))
    finally:
        inst.uninstrument()
    (span,) = exporter.get_finished_spans()
    assert span.instrumentation_scope.schema_url == sc.SCHEMA_URL
    scopes = [sm.scope for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics]
    assert scopes and all(s.schema_url == sc.SCHEMA_URL for s in scopes)
