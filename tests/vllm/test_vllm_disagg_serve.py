"""Disaggregated prefill and decode end to end: one trace per user request, kept whole by the gateway.

Two real ``vllm serve`` processes under ``opentelemetry-instrument`` -- P with ExampleConnector as
``kv_producer``, D as ``kv_consumer``, sharing the connector's storage directory -- behind the example
proxy (``examples/disagg_proxy.py``), called by the real ``openai`` client instrumented with our
adapter. Everyone exports to one real gateway (otel-llm-collector), which tail-samples on a TPOT SLO
that only D's half can breach (P generates one token: it has no TPOT); P samples nothing on its own
(``OTEL_LLM_SAMPLE_RATE=0``) and exports its half only because it is a disaggregated request's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

from otel_llm import semconv as sc
from support.server import VLLMServer, free_port

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PROXY = Path(__file__).resolve().parents[2] / "examples" / "disagg_proxy.py"
REQUESTS = 3
MAX_TOKENS = 6
PROMPT = "the quick brown fox jumps over the lazy dog and keeps running through the field " * 4
SLO = "tpot=0.000000001"  # every decode breaches; a prefill half (one token) cannot


class Clock:
    """The gateway's clock, advanced by the test: its decisions come when the test says, not when the machine does."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _kv_args(role: str, storage: Path) -> tuple[str, ...]:
    config = {"kv_connector": "ExampleConnector", "kv_role": role,
              "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    return ("--block-size", "32", "--kv-transfer-config", json.dumps(config), "--enable-prompt-tokens-details")


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited with {proc.returncode}: {proc.stderr.read().decode()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("the proxy did not start")


def _spans(path: Path) -> list[dict[str, Any]]:
    """The gateway's kept spans (its file exporter: OTLP/JSON lines), flattened with their service."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            service = next((a["value"].get("stringValue") for a in rs["resource"].get("attributes", [])
                            if a["key"] == "service.name"), None)
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    attrs = {a["key"]: _value(a["value"]) for a in s.get("attributes", [])}
                    out.append({"service": service, "name": s["name"], "trace": s["traceId"], "id": s["spanId"],
                                "parent": s.get("parentSpanId", ""), "attrs": attrs, "status": s.get("status", {}),
                                "start": int(s["startTimeUnixNano"]), "end": int(s["endTimeUnixNano"])})
    return out


def _value(v: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return tuple(_value(x) for x in v["arrayValue"].get("values", []))
    return None


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[dict[str, Any]]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import openai

    from otel_llm.instrumentation.openai import OpenAIInstrumentor
    from otel_llm_collector.config import CollectorConfig
    from otel_llm_collector.gateway import Gateway

    tmp = tmp_path_factory.mktemp("disagg")
    storage = tmp / "kv"
    storage.mkdir()
    kept_path = tmp / "kept.jsonl"
    clock = Clock()
    gateway = Gateway(CollectorConfig.from_mapping({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                             "http": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"llm_metrics": {"slo": SLO},
                       "tail_sampling": {"decision_wait": "30s", "decision_wait_after_root_received": "30s",
                                         "policies": [{"name": "errors", "type": "error"},
                                                      {"name": "sdk_decision", "type": "sdk_decision"},
                                                      {"name": "slo_breach", "type": "slo"}]}},
        "exporters": {"file": {"path": str(kept_path)}}}), clock=clock, manual_ticks=True).start()
    env = {"OTEL_LLM_SAMPLE_RATE": "0", "OTEL_LLM_ENGINE_STEPS": "false", "OTEL_LLM_SLO": SLO}
    servers = {role: VLLMServer(otlp_endpoint=gateway.http_endpoint, service_name=f"vllm-{role}", env=env,
                                extra_args=_kv_args(kv_role, storage),
                                # the whole prompt in one step: ExampleConnector stores a chunked prefill's
                                # KV by chunk, and D's load of the whole prompt then fails on its shape
                                max_num_batched_tokens=512)
               for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer"))}
    proxy = None
    provider = TracerProvider(resource=Resource.create({"service.name": "disagg-client"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{gateway.http_endpoint}/v1/traces"),
                                                   schedule_delay_millis=200))
    instrumentor = OpenAIInstrumentor()
    try:
        with ThreadPoolExecutor(2) as pool:  # both engines start at once
            for started in [pool.submit(s.start) for s in servers.values()]:
                started.result()
        port = free_port()
        proxy = subprocess.Popen(
            [sys.executable, str(PROXY), "--prefill", f"http://127.0.0.1:{servers['prefill'].port}",
             "--decode", f"http://127.0.0.1:{servers['decode'].port}", "--port", str(port)],
            env={**os.environ, "OTEL_SERVICE_NAME": "disagg-proxy", "OTEL_TRACES_EXPORTER": "otlp",
                 "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none",
                 "OTEL_EXPORTER_OTLP_ENDPOINT": gateway.http_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                 "OTEL_BSP_SCHEDULE_DELAY": "200"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        _wait_port(port, proxy)
        # a meter provider without readers: left to the environment, the client's metrics would go to
        # OTLP's default endpoint, where nothing listens in this test
        instrumentor.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        model = servers["decode"].model
        cached = []
        for i in range(REQUESTS):
            usage = None
            for chunk in client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": f"{i} {PROMPT}"}], max_tokens=MAX_TOKENS,
                    stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
                usage = chunk.usage or usage
            cached.append(usage.prompt_tokens_details.cached_tokens)
        instrumentor.uninstrument()
        provider.force_flush()
        # every span in: the client's, the proxy's (4 a request) and both servers' (each request's span and
        # its phases); then past decision_wait, so the gateway decides each trace whole
        expected = REQUESTS * (1 + 3 + 2 * 4)
        deadline = time.monotonic() + 120
        while gateway.telemetry.value("receiver_accepted_spans", transport="http") < expected:
            assert time.monotonic() < deadline, gateway.telemetry.value("receiver_accepted_spans", transport="http")
            time.sleep(0.5)
        time.sleep(2)  # a straggler batch (a server's llm.kv_transfer spans) still on its way
        clock.advance(31)
        gateway.tick()
        assert gateway.flush(30)
        yield {"spans": _spans(kept_path), "cached": cached, "servers": servers, "gateway": gateway}
    except BaseException:
        for role, s in servers.items():  # what the instances said, for the failure report
            print(f"--- vllm-{role} log ---\n{s.log_tail(80)}")
        raise
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=30)
        for s in servers.values():
            s.stop()
        gateway.shutdown()


def _trees(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_trace: dict[str, dict[str, Any]] = {}
    for s in spans:
        by_trace.setdefault(s["trace"], {})[s["id"]] = s
    return by_trace


def test_every_user_request_is_one_trace_client_router_prefill_decode(deployment):
    trees = _trees(deployment["spans"])
    servers = deployment["servers"]
    clients = [s for s in deployment["spans"] if s["service"] == "disagg-client"]
    assert len(clients) == REQUESTS and len(trees) == REQUESTS  # the gateway kept every trace, whole
    for c in clients:
        spans = trees[c["trace"]]
        assert c["parent"] == ""
        (router,) = [s for s in spans.values() if s["service"] == "disagg-proxy" and s["name"].startswith("router")]
        assert router["parent"] == c["id"]
        hops = {s["attrs"][sc.DISAGG_HOP]: s for s in spans.values() if s["parent"] == router["id"]}
        assert set(hops) == {"prefill", "decode"}
        for role in ("prefill", "decode"):
            (root,) = [s for s in spans.values() if s["service"] == f"vllm-{role}" and s["parent"] == hops[role]["id"]]
            a = root["attrs"]
            assert a[sc.DISAGG_ROLE] == role
            assert (a[sc.SERVER_ADDRESS], a[sc.SERVER_PORT]) == ("127.0.0.1", servers[role].port)
            assert hops[role]["attrs"][sc.SERVER_PORT] == servers[role].port
        # P's half: one token, its KV saved
        (p_root,) = [s for s in spans.values() if s["service"] == "vllm-prefill" and sc.LATENCY_E2E in s["attrs"]]
        assert p_root["attrs"][sc.USAGE_OUTPUT_TOKENS] == 1
        assert p_root["attrs"][sc.SAMPLING_REASON] == "kv_handoff"  # kept at phase detail for the gateway
        p_children = {s["name"] for s in spans.values() if s["parent"] == p_root["id"]}
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL} <= p_children
        # the router's own view of the user's request: its first byte out came after P's whole answer
        assert router["attrs"][sc.DISAGG_TTFT] > 0
        assert router["start"] <= hops["prefill"]["start"] < hops["prefill"]["end"] <= hops["decode"]["start"]


def test_the_decode_half_loaded_vllms_external_tokens_as_a_handoff_phase(deployment):
    trees = _trees(deployment["spans"])
    d_roots = sorted((s for s in deployment["spans"] if s["service"] == "vllm-decode" and sc.LATENCY_E2E in s["attrs"]),
                     key=lambda s: s["start"])
    assert len(d_roots) == REQUESTS
    for d, cached in zip(d_roots, deployment["cached"]):
        a = d["attrs"]
        assert cached > 0 and a[sc.KV_TRANSFER_EXTERNAL_TOKENS] == cached  # vLLM's own count, as D answered it
        assert a[sc.USAGE_OUTPUT_TOKENS] == MAX_TOKENS and a[sc.KV_TRANSFER_FAILED] is False
        (load,) = [s for s in trees[d["trace"]].values() if s["parent"] == d["id"] and s["name"] == sc.SPAN_KV_TRANSFER]
        assert load["attrs"][sc.KV_TRANSFER_DIRECTION] == sc.KV_LOAD
        assert load["attrs"][sc.KV_TRANSFER_EXTERNAL_TOKENS] == cached
        # the breach that kept the trace is D's; P's half, which met its SLO, came along
        assert sc.SLO_BREACHED in a and "tpot" in a[sc.SLO_BREACHED]


def test_the_prefill_half_did_not_breach_but_was_kept_with_the_trace(deployment):
    p_roots = [s for s in deployment["spans"] if s["service"] == "vllm-prefill" and sc.LATENCY_E2E in s["attrs"]]
    assert len(p_roots) == REQUESTS
    assert all(s["attrs"][sc.SLO_MET] is True for s in p_roots)


def test_the_prefill_half_shows_its_kv_save(deployment):
    p_roots = [s for s in deployment["spans"] if s["service"] == "vllm-prefill" and sc.LATENCY_E2E in s["attrs"]]
    trees = _trees(deployment["spans"])
    for p in p_roots:
        saves = [s for s in trees[p["trace"]].values() if s["parent"] == p["id"] and s["name"] == sc.SPAN_KV_TRANSFER]
        assert saves and saves[0]["attrs"][sc.KV_TRANSFER_DIRECTION] == sc.KV_SAVE


def test_the_gateways_goodput_counts_each_user_request_once(deployment):
    """Two halves reached the gateway per user request; its request and goodput counters hold the user's
    request joined from them, once (every one breached D's TPOT: none was good), and no half."""
    from otel_llm.core.metrics import GOOD_REQUESTS, REQUESTS as REQUESTS_METRIC
    from support.metrics import points_by_name

    g = deployment["gateway"]
    counted: dict[tuple[str, Any], float] = {}
    for name in (REQUESTS_METRIC, GOOD_REQUESTS):
        for p in points_by_name(g.metric_reader.get_metrics_data()).get(name, []):
            key = (name, dict(p.attributes).get(sc.DISAGG_ROLE))
            counted[key] = counted.get(key, 0) + p.value
    assert counted == {(REQUESTS_METRIC, "user"): REQUESTS}
    assert g.telemetry.total("disagg_user_breaches") == REQUESTS  # each user request's TPOT breach, once
