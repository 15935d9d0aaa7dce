"""``VLLM_USE_RUST_FRONTEND=1 vllm serve`` under ``opentelemetry-instrument``: no Python frontend exists, so the
EngineCore is its requests' source (docs/design/enginecore-source.md). Streamed and non-streamed
``/v1/completions`` each get one SERVER request span with its phases and linked engine steps; its timings lie
within what the client observed; the metrics count every request, as ``vllm-rs``'s own do; and what
``vllm-rs`` forwards to the engine (``trace_headers``, ``external_req_id``) is what the docs say. Once with one
EngineCore, once with two (``--data-parallel-size 2``). With one, the traces go through the real gateway
(``otel-llm-collector``) with the callers' client spans for two of the requests: those two server traces end up
in their caller's trace (``trace_join``, joined on the response id), the other two go on alone; after its
prefill-interference scenario, three completions with JSON schemas (both forms ``vllm-rs`` forwards) carry
their grammar's backend and cache hit, and the steps that sampled for them the bitmask's time.

Needs the ``vllm-rs`` binary of the tested release: ``VLLM_RUST_FRONTEND_PATH``, else ``.cache/vllm-rs/vllm-rs``
(scripts/setup.sh extracts it from the ``vllm`` wheel)."""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm import semconv as sc
from otel_llm.core.metrics import SERVER_HISTOGRAMS
from otel_llm.core.self_metrics import AGENT_LOST
from otel_llm.instrumentation.vllm.step_transport import DROP_STARTS_AFTER_ENV
from otel_llm.core.summary import ATTRIBUTE_OF_FIELD
from otel_llm.instrumentation.vllm.grammar import CACHING_BACKENDS
from support.gateway_process import GatewayProcess
from support.otlp_sink import OTLPSink
from support.schemas import large_json_schema
from support.server import VLLMServer

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

_REPO = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
MAX_TOKENS = 8


def _binary() -> str | None:
    path = os.environ.get("VLLM_RUST_FRONTEND_PATH") or str(_REPO / ".cache" / "vllm-rs" / "vllm-rs")
    return path if os.access(path, os.X_OK) else None


def _metric(field: str) -> str:
    return next(h.name for h in SERVER_HISTOGRAMS if h.field == field)


def _complete(base_url: str, model: str, prompt: list[int], stream: bool, traceparent: str | None = None,
              max_tokens: int = MAX_TOKENS, headers: dict[str, str] | None = None,
              fields: dict | None = None) -> dict:
    """One ``/v1/completions`` over plain HTTP (the headers exactly as given), with what the client saw:
    when it sent, its first and last chunk (wall clock); ``fields``: more of the body (or in place of ours)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": stream, **(fields or {})}).encode()
    sent_headers = {"Content-Type": "application/json", **(headers or {})}
    if traceparent is not None:
        sent_headers["traceparent"] = traceparent
    req = urllib.request.Request(f"{base_url}/completions", data=body, method="POST", headers=sent_headers)
    sent = time.time()
    first = None
    ids = set()
    with urllib.request.urlopen(req, timeout=300) as r:
        if stream:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                if first is None:
                    first = time.time()
                ids.add(json.loads(line[5:])["id"])
        else:
            ids.add(json.loads(r.read())["id"])
    last = time.time()
    (rid,) = ids
    return {"id": rid, "sent": sent, "first": first or last, "last": last}


# -- the scripted prefill-interference scenario ----------------------------------------------------------
# Decoders stream side by side; once the server counts all of them running and GATE_CHUNKS tokens each beyond
# their first (so the engine has run decode-only steps at their batch size: the verdict's baseline), long
# prompts arrive, each prefilled in one or two steps beside the decodes (max_num_batched_tokens holds a whole
# one); the decoders go on decoding alone afterwards. Driven by the server's counters, not by sleeps. The long
# prompts' prefill steps are many decode steps' worth each whatever the machine's speed (attention grows with
# the prompt's square), and enough of them that their interference stays far above the verdict's MIN_SHARE of
# a decoder's decode time even when they reach the engine late.
VICTIMS = 6
# room for the long prompts' way to the engine on a loaded host, while their prefill steps stay far above
# MIN_SHARE of a decoder's decode time
VICTIM_TOKENS = 320
GATE_CHUNKS = 4
LONGS = 12  # the token budget prefills them one a step, each several decode steps' worth
LONG_TOKENS = 4000  # near the scenario's context, one prompt per prefill step
SCENARIO_ENGINE = {"max_model_len": 4096, "max_num_batched_tokens": 4096}
TINY_SLO = 1e-6  # every decoder breaches TPOT and is judged; a long prompt (one token) has no TPOT
DROPPED = 3  # requests after the scenario whose starts the EngineCore's sink drops (the test-only fault)
SHAPED = 3  # requests with a JSON schema after the scenario (_structured)
GRAMMAR_TOKENS = 6


def _structured(base_url: str, model: str) -> list[dict]:
    """Three completions with JSON schemas, one after the other, in both forms ``vllm-rs`` forwards to the engine:
    schema A (``structured_outputs``), schema B (``response_format``), schema A again (compiled by then: a cache
    hit where the backend keeps compiled grammars). Its JSON never completes in GRAMMAR_TOKENS tokens."""
    a, b = large_json_schema("rs_a"), large_json_schema("rs_b")
    forms = ({"structured_outputs": {"json": a}},
             {"response_format": {"type": "json_schema", "json_schema": {"name": "rs_b", "schema": b}}},
             {"structured_outputs": {"json": a}})
    assert len(forms) == SHAPED
    return [_complete(base_url, model, [11 + (i * 5 + j) % 400 for j in range(12)], False,
                      max_tokens=GRAMMAR_TOKENS, fields={"ignore_eos": False, **form}) for i, form in enumerate(forms)]


def _judge_grammars(spans: list, shaped: list[dict]) -> None:
    """The schema requests' SERVER spans carry the grammar's backend and whether it was a cache hit (by the
    backend's rule: grammar.CACHING_BACKENDS); the engine steps that sampled for them carry the bitmask's time,
    no step that served only plain requests does; no plain request waited for a grammar."""
    ids = [c["id"] for c in shaped]
    servers = {x.attributes[sc.RESPONSE_ID]: x for x in spans if x.kind == "SERVER"}
    steps = [x for x in spans if x.name == sc.SPAN_ENGINE_STEP]
    backends = {servers[rid].attributes.get(sc.STRUCTURED_OUTPUT_BACKEND) for rid in ids}
    assert len(backends) == 1 and None not in backends and "auto" not in backends, backends
    (backend,) = backends
    hits = [servers[rid].attributes.get(sc.STRUCTURED_OUTPUT_CACHE_HIT) for rid in ids]
    assert hits == [False, False, backend in CACHING_BACKENDS], (backend, hits)
    keys = {(servers[rid].trace_id, servers[rid].span_id) for rid in ids}
    for rid in ids:
        x = servers[rid]
        (decode,) = [y for y in spans if y.parent_span_id == x.span_id and y.name == sc.SPAN_DECODE]
        during = [y for y in steps if (x.trace_id, x.span_id) in y.links
                  and y.start_ns > decode.start_ns and y.end_ns <= decode.end_ns]
        assert during, rid
        for y in during:
            assert y.attributes[sc.STEP_GRAMMAR_TIME] > 0 and y.attributes[sc.STEP_GRAMMAR_REQUESTS] == 1, y.attributes
    plain_steps = [y for y in steps if not keys & set(y.links)]
    assert plain_steps and all(sc.STEP_GRAMMAR_TIME not in y.attributes for y in plain_steps)
    for rid, x in servers.items():
        if rid not in ids:
            assert sc.STRUCTURED_OUTPUT_BACKEND not in x.attributes, rid
            assert sc.STRUCTURED_OUTPUT_CACHE_HIT not in x.attributes, rid
            assert x.attributes.get(sc.SLOW_CAUSE) != sc.SLOW_QUEUE_STRUCTURED_OUTPUT, rid
            assert not x.attributes.get(sc.SLOW_SECONDS[sc.SLOW_QUEUE_STRUCTURED_OUTPUT]), rid


def _interference(base_url: str, model: str) -> tuple[list[dict], list[dict]]:
    """The scenario: (the decoders' calls, the long prompts' calls). Gated on the server's own counters
    (``vllm-rs``'s ``/metrics``: requests running, tokens generated), not on the chunks the client has read: on
    a loaded host the client's reader threads lag the engine by hundreds of tokens (a gate on them once found
    the decoders done before it opened)."""
    metrics = base_url.rsplit("/v1", 1)[0] + "/metrics"

    def generated() -> tuple[float, float]:
        page = _prometheus(metrics)
        return page.get("vllm:num_requests_running", 0.0), page.get("vllm:generation_tokens_total", 0.0)

    _, before = generated()
    with ThreadPoolExecutor(VICTIMS + LONGS) as pool:
        victims = [pool.submit(_complete, base_url, model, [5 + (i * 11 + j) % 400 for j in range(16)], True,
                               max_tokens=VICTIM_TOKENS) for i in range(VICTIMS)]
        # every decoder running, and GATE_CHUNKS decode steps of them all (their first tokens aside): the
        # verdict's baseline of decode-only steps at their batch size; far from their end
        deadline = time.monotonic() + 300
        while True:
            running, tokens = generated()
            if running >= VICTIMS and tokens - before >= VICTIMS * (1 + GATE_CHUNKS):
                break
            assert tokens - before < VICTIMS * VICTIM_TOKENS // 2, \
                f"the scenario did not run as built: {tokens - before} tokens generated, {running} running"
            assert time.monotonic() < deadline, (running, tokens - before)
            time.sleep(0.005)
        assert tokens - before < VICTIMS * VICTIM_TOKENS // 2, f"the gate opened late: {tokens - before} tokens"
        longs = [pool.submit(_complete, base_url, model, [7 + (k * 13 + j) % 400 for j in range(LONG_TOKENS)], False,
                             max_tokens=1) for k in range(LONGS)]
        return [f.result() for f in victims], [f.result() for f in longs]


def _judge_interference(spans: list, victims: list[dict], longs: list[dict]) -> None:
    """>= 90 % of the decoders the long prompts hit are judged ``prefill_interference``; no judged request
    whose decode steps carried no prefill at all is."""
    long_ids = {c["id"] for c in longs}
    servers = {x.attributes[sc.RESPONSE_ID]: x for x in spans if x.kind == "SERVER"
               and x.attributes[sc.RESPONSE_ID] not in long_ids}
    steps = [x for x in spans if x.name == sc.SPAN_ENGINE_STEP]
    decode_start = {x.parent_span_id: x.start_ns for x in spans if x.name == sc.SPAN_DECODE}

    def prefills(x) -> list[int]:  # the prefill tokens of the steps that served it after its first token
        first = decode_start.get(x.span_id)
        if first is None:
            return []
        return [y.attributes.get(sc.STEP_NUM_PREFILL_TOKENS, 0) for y in steps
                if (x.trace_id, x.span_id) in y.links and y.start_ns >= first]

    hit = {rid for rid, x in servers.items() if any(n >= LONG_TOKENS // 2 for n in prefills(x))}
    assert hit == {c["id"] for c in victims}, "the scenario did not run as built"
    judged = {rid: x.attributes[sc.SLOW_CAUSE] for rid, x in servers.items() if sc.SLOW_CAUSE in x.attributes}
    right = [rid for rid in hit if judged.get(rid) == sc.SLOW_PREFILL_INTERFERENCE]
    assert len(right) >= 0.9 * len(hit), judged
    for rid, x in servers.items():
        if rid in judged and not any(prefills(x)):
            assert judged[rid] != sc.SLOW_PREFILL_INTERFERENCE, f"{rid} was not hit, yet blamed"


def _client_spans(calls: list[tuple[int, dict]]) -> bytes:
    """The callers' CLIENT spans (as our openai instrumentation records them: the response id the client got) in
    the trace and under the span id their ``traceparent`` named, encoded as one export request."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="caller")))
    ss = rs.scope_spans.add()
    for i, c in calls:
        span = ss.spans.add(trace_id=bytes.fromhex(TRACE), span_id=(i + 1).to_bytes(8, "big"),
                            name="text_completion", kind=Span.SPAN_KIND_CLIENT,
                            start_time_unix_nano=int(c["sent"] * 1e9), end_time_unix_nano=int(c["last"] * 1e9))
        span.attributes.append(KeyValue(key=sc.RESPONSE_ID, value=AnyValue(string_value=c["id"])))
    return req.SerializeToString()


def _prometheus(url: str) -> dict[str, float]:
    """A Prometheus text page's unlabelled sums per series name (labels dropped, values added)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0].strip()
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return out


needs_binary = pytest.mark.skipif(_binary() is None, reason="the vllm-rs binary of the tested release is not here "
                                  "(scripts/setup.sh extracts it into .cache/vllm-rs)")


def _rust_env(binary: str | None) -> dict[str, str]:
    return {"VLLM_USE_RUST_FRONTEND": "1", "VLLM_RUST_FRONTEND_PATH": binary or "",
            "OTEL_LLM_BASELINE_DETAIL": "steps", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "500"}


def _last_count(sink: OTLPSink, name: str, want: int, service: str | None = None, timeout: float = 30.0):
    """The last exported point of histogram ``name`` (of ``service``), once it counts ``want`` (cumulative:
    the last export holds every request), or the last one there is after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        points = [p for p in sink.metric_points(name) if service is None or p.resource.get(sc.SERVICE_NAME) == service]
        if points and points[-1].count == want or time.monotonic() > deadline:
            return points[-1] if points else None
        time.sleep(0.2)


def _settled(sink: OTLPSink, quiet: float = 2.0, timeout: float = 60.0) -> list:
    """The sink's spans once no more came for ``quiet`` seconds (exporters batch)."""
    deadline = time.monotonic() + timeout
    spans = sink.spans()
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = sink.spans()
        if len(now) != len(spans):
            spans, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return spans


def _lost(sink: OTLPSink) -> dict[str, float]:
    """The agent's ``otel_llm.agent.lost`` counter's last value per state."""
    out: dict[str, float] = {}
    for p in sink.metric_points(AGENT_LOST.name):
        out[p.attributes.get("otel_llm.state")] = p.value
    return out


@needs_binary
@pytest.mark.parametrize("dp", [1, 2])
def test_rust_frontend_requests_are_traced_from_the_engine_core(dp: int, tmp_path):
    env = _rust_env(_binary())
    # data parallelism runs on the CPU build: two EngineCores, both their requests' source, one agent
    extra = ("--data-parallel-size", str(dp)) if dp > 1 else ()
    scenario = dp == 1  # with one EngineCore: the interference scenario, then starts dropped by the sink
    engine = SCENARIO_ENGINE if scenario else {}
    if scenario:
        env["OTEL_LLM_SLO"] = f"tpot={TINY_SLO}"
        env[DROP_STARTS_AFTER_ENV] = str(4 + VICTIMS + LONGS + SHAPED)  # the later starts are dropped
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(OTLPSink())
        gateway = stack.enter_context(GatewayProcess(tmp_path, sink.endpoint)) if dp == 1 else None
        if gateway is not None:  # the traces through the real gateway; the metrics straight to the sink
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = gateway.traces_endpoint
        s = stack.enter_context(VLLMServer(otlp_endpoint=sink.endpoint, env=env, cli=True, extra_args=extra,
                                           **engine))
        seen = []
        for i, stream in enumerate((True, False, True, False)):
            prompt = [3 + (i * 7 + j) % 400 for j in range(24 + 40 * (i % 2))]
            seen.append(_complete(s.base_url, s.model, prompt, stream, f"00-{TRACE}-{i + 1:016x}-01"))
        # the callers of the first two (one streamed, one not) traced their calls; the other two callers did not
        # (sent now: the gateway holds a server trace for its caller a bounded while)
        callers = {c["id"]: f"{i + 1:016x}" for i, c in enumerate(seen[:2])} if gateway is not None else {}
        if gateway is not None:
            assert gateway.export(_client_spans(list(enumerate(seen[:2])))) == 200
        victims, longs, shaped, dropped = [], [], [], []
        if scenario:
            victims, longs = _interference(s.base_url, s.model)
            shaped = _structured(s.base_url, s.model)  # after the scenario: its steps stay plain ones
            # the sink drops these requests' starts: their finishes alone reach the agent
            dropped = [_complete(s.base_url, s.model, [9 + j for j in range(20)], False) for _ in range(DROPPED)]
        traced = len(seen) + len(victims) + len(longs) + len(shaped)
        everyone = traced + len(dropped)

        def ready(spans):
            return sum(x.kind == "SERVER" for x in spans) >= traced
        sink.wait_for(ready, timeout=90)
        spans = _settled(sink)  # the engine steps' spans too
        joined = gateway.counter("trace_join_joined") if gateway is not None else 0
        theirs = _prometheus(s.base_url.rsplit("/v1", 1)[0] + "/metrics")
        e2e = _last_count(sink, _metric("e2e"), everyone)
        ttft = _last_count(sink, _metric("ttft"), traced)
        lost = _lost(sink)
        if dropped:
            deadline = time.monotonic() + 30
            while lost.get("orphans") != len(dropped) and time.monotonic() < deadline:
                time.sleep(0.2)
                lost = _lost(sink)
    servers = [x for x in spans if x.kind == "SERVER"]
    assert len(servers) == traced, s.log_tail()
    by_id = {}
    for x in servers:
        response_id = x.attributes[sc.RESPONSE_ID]
        # external_req_id under vllm-rs 0.32.0: exactly the id the client got (no prompt index appended)
        match = [c for c in seen + victims + longs + shaped if response_id == c["id"]]
        assert len(match) == 1, (response_id, [c["id"] for c in seen])
        by_id[match[0]["id"]] = x
    steps = [x for x in spans if x.name == sc.SPAN_ENGINE_STEP]
    for c in seen:
        x = by_id[c["id"]]
        if c["id"] in callers:  # joined at the gateway: one trace with its caller's client span
            assert x.trace_id == TRACE and x.parent_span_id == callers[c["id"]]
            assert any(y.kind == "CLIENT" and y.span_id == x.parent_span_id and y.trace_id == TRACE for y in spans)
        else:  # vllm-rs forwards no trace headers to the engine (vLLM's RFC #44757): each request is its own trace
            assert x.parent_span_id == "" and x.trace_id != TRACE
        children = {y.name for y in spans if y.parent_span_id == x.span_id}
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} <= children
        assert any((x.trace_id, x.span_id) in y.links for y in steps)
        # a request cannot start before the client sent it nor finish after its last chunk
        assert c["sent"] - 0.002 <= x.start_ns / 1e9 and x.end_ns / 1e9 <= c["last"] + 0.002
        ttft_s, e2e_s = x.attributes[ATTRIBUTE_OF_FIELD["ttft"]], x.attributes[ATTRIBUTE_OF_FIELD["e2e"]]
        assert 0 < ttft_s <= e2e_s <= c["last"] - c["sent"] + 0.002
        assert ttft_s <= c["first"] - c["sent"] + 0.002
        assert x.attributes[sc.USAGE_OUTPUT_TOKENS] == MAX_TOKENS
    assert joined == len(callers)
    # 100 % of requests in the metrics, those whose start the sink dropped included (their steps were not held:
    # no step-derived TTFT, so they are in the end-to-end histogram, not the TTFT one)
    assert e2e is not None and e2e.count == everyone
    assert ttft is not None and ttft.count == traced
    # vllm-rs's own histograms: the same requests; ours end where the engine let them go, before vllm-rs got
    # the output (TTFT: the engine's step end against vllm-rs's receipt of the first token), so never longer
    for ours, name in ((e2e, "vllm:e2e_request_latency_seconds"), (ttft, "vllm:time_to_first_token_seconds")):
        assert theirs.get(name + "_count") == everyone, (name, sorted(theirs))
        assert ours.sum <= theirs[name + "_sum"] + 0.001 * everyone, (name, ours.sum, theirs[name + "_sum"])
    if scenario:
        _judge_interference(spans, victims, longs)
        _judge_grammars(spans, shaped)
        # the dropped starts: counted by the engine's sink, relayed to the agent; their finishes were orphans
        assert lost.get("orphans") == len(dropped) and lost.get("engine_requests_dropped") == len(dropped), lost


@needs_binary
def test_a_headless_engine_traces_its_own_requests(tmp_path):
    """``vllm serve --headless``: a data-parallel deployment of two ranks on one machine, the head (the Rust
    frontend, rank 0's EngineCore, the DP coordinator) and a headless engine (rank 1), each under its own
    ``opentelemetry-instrument``. Each supervisor opens its own agent; each EngineCore is its requests' source.
    The requests the head routes to rank 1 (vllm-rs's ``X-data-parallel-rank`` header: deterministic) give
    SERVER spans and metrics through the headless supervisor's agent, those of rank 0 through the head's:
    every request once, none counted twice."""
    from support.server import free_port

    rpc = free_port()
    dp = ("--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
          "--data-parallel-rpc-port", str(rpc))
    env = _rust_env(_binary())
    per_rank = {0: [], 1: []}
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(OTLPSink())
        # the headless engine first: the head waits for it to register
        stack.enter_context(VLLMServer(otlp_endpoint=sink.endpoint, env=env, cli=True, service_name="vllm-headless",
                                       extra_args=(*dp, "--headless", "--data-parallel-start-rank", "1")))
        s = stack.enter_context(VLLMServer(otlp_endpoint=sink.endpoint, env=env, cli=True, service_name="vllm-head",
                                           extra_args=dp))
        for i in range(4):
            rank = i % 2
            prompt = [3 + (i * 5 + j) % 400 for j in range(20)]
            per_rank[rank].append(_complete(s.base_url, s.model, prompt, stream=i < 2,
                                            headers={"X-data-parallel-rank": str(rank)}))
        everyone = sum(len(v) for v in per_rank.values())
        sink.wait_for(lambda spans: sum(x.kind == "SERVER" for x in spans) >= everyone, timeout=90)
        spans = _settled(sink)
        counts = {service: _last_count(sink, _metric("e2e"), len(per_rank[rank]), service)
                  for rank, service in ((0, "vllm-head"), (1, "vllm-headless"))}
        theirs = _prometheus(s.base_url.rsplit("/v1", 1)[0] + "/metrics")
    servers = [x for x in spans if x.kind == "SERVER"]
    assert len(servers) == everyone, [x.attributes.get(sc.RESPONSE_ID) for x in servers]
    steps = [x for x in spans if x.name == sc.SPAN_ENGINE_STEP]
    for rank, service in ((0, "vllm-head"), (1, "vllm-headless")):
        for c in per_rank[rank]:
            (x,) = [x for x in servers if x.attributes[sc.RESPONSE_ID] == c["id"]]  # once, by one process
            assert x.service == service, (c["id"], x.service)
            children = {y.name for y in spans if y.parent_span_id == x.span_id}
            assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} <= children
            linked = [y for y in steps if (x.trace_id, x.span_id) in y.links]
            assert linked and {y.service for y in linked} == {service + "-engine-steps"}  # its own engine's steps
            assert c["sent"] - 0.002 <= x.start_ns / 1e9 and x.end_ns / 1e9 <= c["last"] + 0.002
            assert x.attributes[sc.USAGE_OUTPUT_TOKENS] == MAX_TOKENS
        point = counts[service]
        assert point is not None and point.count == len(per_rank[rank]), (service, point)
    assert theirs.get("vllm:e2e_request_latency_seconds_count") == everyone
