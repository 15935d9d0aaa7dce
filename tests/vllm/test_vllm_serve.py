"""``vllm serve`` under ``opentelemetry-instrument`` (zero code): engine steps and prefill chunks reach the
API server from its EngineCore process, even though that process is auto-instrumented too; and the verdict
names an API server too busy to hand requests over (the ``frontend`` cause)."""

from __future__ import annotations

import os
import time

import pytest

from otel_llm import semconv as sc
from support.otlp_sink import OTLPSink
from support.server import VLLMServer

# each test starts its own `vllm serve` (up to ~6 min on a loaded machine, see VLLMServer.start), then serves
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]


# a third name for the model, with an SLO of its own that every request breaches: the requests the verdict judges
JUDGED, TINY_SLO = "tiny-judged", 1e-6


@pytest.fixture(scope="module")
def served():
    """One ``vllm serve`` for the module's first tests (one engine start), and its spans' sink."""
    env = {"OTEL_LLM_BASELINE_DETAIL": "steps", "OTEL_LLM_SLO": f"{JUDGED}: ttft={TINY_SLO}"}
    # names for the model (served-model-name): a request names any, the engine serves the first
    with OTLPSink() as sink, VLLMServer(otlp_endpoint=sink.endpoint, env=env,
                                        extra_args=("--served-model-name", "tiny", "tiny-alias", JUDGED)) as s:
        yield sink, s


def test_serve_reports_engine_steps_and_chunks(served):
    import openai

    names = ("tiny", "tiny-alias")
    sink, s = served
    sink.clear()
    client = openai.OpenAI(base_url=s.base_url, api_key="unused")
    prompt = [3 + j % 400 for j in range(150)]  # > max_num_batched_tokens (64): prefilled in chunks
    client.completions.create(model=names[0], prompt=prompt, max_tokens=8, extra_body={"ignore_eos": True})
    # parallel sampling: two choices of one request (vLLM fans them out to two engine requests)
    two = client.completions.create(model=names[1], prompt=prompt[:20], max_tokens=5, n=2, temperature=0.8,
                                    extra_body={"ignore_eos": True})
    # the client walks away from a stream after its first chunk: vLLM aborts the request (last, so that its
    # engine steps are its own; 10 prompt tokens: its span is the one with 10)
    stream = client.completions.create(model=names[0], prompt=prompt[:10], max_tokens=400, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()

    def ready(spans):  # exporters batch: wait until the requests and all their steps are in
        chunks = sum(1 for x in spans if x.name == sc.SPAN_PREFILL_CHUNK)
        named = {x.attributes[sc.ENGINE_STEP_ID] for x in spans
                 if x.name in (sc.SPAN_PREFILL_CHUNK, sc.SPAN_DECODE_STEP)}
        steps = {x.attributes[sc.ENGINE_STEP_ID] for x in spans if x.name == sc.SPAN_ENGINE_STEP}
        decoded = any(x.name in (sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW) for x in spans)
        return sum(x.kind == "SERVER" for x in spans) == 3 and chunks >= 3 and decoded and named <= steps
    spans = sink.wait_for(ready, timeout=30)
    (streamed,) = [x for x in spans if x.kind == "SERVER" and x.attributes.get(sc.USAGE_INPUT_TOKENS) == 10]
    a = streamed.attributes
    # vLLM aborts the request when its API server sees the client gone; on a loaded machine its EngineCore
    # may generate all 400 tokens first (a finish like any other: the abort itself is held deterministically
    # in test_vllm_async.py). Whichever vLLM did, the span says it
    if a[sc.USAGE_OUTPUT_TOKENS] == 400 and a[sc.RESPONSE_FINISH_REASONS] == ("length",):
        assert sc.ERROR_TYPE not in a and streamed.status == "UNSET"
    else:  # the client's cancellation is no server error; the span says it was aborted
        assert a.get(sc.ERROR_TYPE) == "aborted", a
        assert streamed.status == "UNSET" and a[sc.RESPONSE_FINISH_REASONS] == ("abort",)
        assert 0 < a[sc.USAGE_OUTPUT_TOKENS] < 400
    spans = [x for x in spans if x.trace_id != streamed.trace_id
             and (streamed.trace_id, streamed.span_id) not in set(x.links)]
    (request,) = [x for x in spans if x.kind == "SERVER" and sc.REQUEST_CHOICE_COUNT not in x.attributes]
    (parallel,) = [x for x in spans if x.kind == "SERVER" and sc.REQUEST_CHOICE_COUNT in x.attributes]
    # the model the client asked for, and the one that served it: the alias names the served model
    assert (request.attributes[sc.REQUEST_MODEL], request.attributes[sc.RESPONSE_MODEL]) == ("tiny", "tiny")
    assert (parallel.attributes[sc.REQUEST_MODEL], parallel.attributes[sc.RESPONSE_MODEL]) == ("tiny-alias", "tiny")
    assert request.name == "text_completion tiny" and parallel.name == "text_completion tiny-alias"
    # vLLM's own latency names beside ours, with the same values
    a = request.attributes
    assert (a[sc.VLLM_TTFT], a[sc.VLLM_E2E], a[sc.VLLM_QUEUE], a[sc.VLLM_PREFILL], a[sc.VLLM_DECODE]) == (
        a[sc.LATENCY_TTFT], a[sc.LATENCY_E2E], a[sc.LATENCY_QUEUE], a[sc.LATENCY_PREFILL], a[sc.LATENCY_DECODE])
    assert parallel.attributes[sc.REQUEST_CHOICE_COUNT] == 2
    # vLLM's id of the engine request: the response's id plus the prompt's index ("cmpl-<id>-0")
    assert parallel.attributes[sc.RESPONSE_ID].startswith(two.id)
    choices = [x for x in spans if x.name == sc.SPAN_CHOICE and x.parent_span_id == parallel.span_id]
    assert sorted(c.attributes[sc.CHOICE_INDEX] for c in choices) == [0, 1]
    assert [c.attributes[sc.USAGE_OUTPUT_TOKENS] for c in choices] == [5, 5]
    choice_links = {(parallel.trace_id, c.span_id) for c in choices}
    for c in choices:  # each sequence's phases under its choice, its engine steps linking it
        assert {x.name for x in spans if x.parent_span_id == c.span_id} >= {sc.SPAN_QUEUE, sc.SPAN_PREFILL}
        assert any((c.trace_id, c.span_id) in x.links for x in spans if x.name == sc.SPAN_ENGINE_STEP)
    assert request.attributes[sc.USAGE_INPUT_TOKENS] == 150
    # below: the n=1 request's spans and steps (the two requests ran one after the other)
    spans = [x for x in spans if x.trace_id != parallel.trace_id and not choice_links & set(x.links)]
    prefill = [x for x in spans if x.name == sc.SPAN_PREFILL and x.parent_span_id == request.span_id]
    chunks = [x for x in spans if x.name == sc.SPAN_PREFILL_CHUNK and x.parent_span_id == prefill[0].span_id]
    assert len(chunks) >= 3 and sum(c.attributes[sc.CHUNK_TOKENS] for c in chunks) == 150
    steps = [x for x in spans if x.name == sc.SPAN_ENGINE_STEP]
    # the steps behind the request's own chunk and decode-step spans: each named on its row, each linking it
    named = {x.attributes[sc.ENGINE_STEP_ID] for x in spans if x.name in (sc.SPAN_PREFILL_CHUNK, sc.SPAN_DECODE_STEP)}
    assert {x.attributes[sc.ENGINE_STEP_ID] for x in steps} == named
    assert all((request.trace_id, request.span_id) in x.links for x in steps)
    rows = [x for x in spans if x.name in (sc.SPAN_DECODE_STEP, sc.SPAN_DECODE_WINDOW)]
    assert sum(x.attributes.get(sc.STEP_TOKENS) or x.attributes[sc.WINDOW_TOKENS] for x in rows) == 7
    # engine steps under their own service: the request's trace list is requests only
    assert {x.service for x in steps} == {f"{request.service}-engine-steps"}


SHORT = " ".join(f"w{j % 50}" for j in range(8))  # 23 tokens: tokenized in a moment
HEAVY = "lorem ipsum dolor sit amet " * 20000  # 540,000 characters: its tokenization keeps the frontend busy
LONG_TEXTS = 4  # sent before the burst
BUSY_CPU_S = 0.3  # the API server's CPU since they were sent, before the burst goes: it is tokenizing them


def _cpu_s(pid: int) -> float:
    """A process's CPU so far (user and system), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        after_name = f.read().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK")


def test_a_frontend_busy_tokenizing_is_judged_the_frontend(served):
    """A burst of short requests arrives while the API server tokenizes four long texts (cut to 100 tokens
    by ``truncate_prompt_tokens``, after the whole text was tokenized): vLLM's tokenizer pool has one thread,
    so the short ones wait for it between their arrival and the hand-over to the idle engine. 12 controls, the
    same short text sent one at a time while the frontend was idle, come first: the baseline they are
    compared with (their own prompt's size class; the long texts' is another). Which short requests the
    burst affected is read from their spans (arrival → QUEUED is at least half their TTFT), not from the
    verdict; ≥ 90 % of them get ``frontend``, no control that went straight to the engine does. Every request
    of the judged model breaches its TTFT objective, so each is judged."""
    import concurrent.futures

    import openai

    sink, s = served
    sink.clear()
    client = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)

    def ask(text: str, truncate: int | None = None) -> str:
        body: dict = {"ignore_eos": True}
        if truncate is not None:
            body["truncate_prompt_tokens"] = truncate
        return client.completions.create(model=JUDGED, prompt=text, max_tokens=2, extra_body=body).id

    controls = [ask(SHORT) for _ in range(12)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        before = _cpu_s(s.proc.pid)
        heavy = [pool.submit(ask, HEAVY, 100) for _ in range(LONG_TEXTS)]
        # the short ones go once the API server has spent BUSY_CPU_S on the long texts (parsing them, then
        # tokenizing them one after the other on vLLM's one tokenizer thread, seconds in all): they arrive
        # while the frontend is busy with them, however fast or loaded the machine
        deadline = time.monotonic() + 120
        while _cpu_s(s.proc.pid) - before < BUSY_CPU_S:
            assert time.monotonic() < deadline, "the API server never got busy with the long texts"
            time.sleep(0.01)
        burst = [pool.submit(ask, SHORT) for _ in range(10)]
        burst_ids = [f.result() for f in burst]
        for f in heavy:
            f.result()

    def judged(x) -> bool:
        return x.kind == "SERVER" and x.attributes.get(sc.REQUEST_MODEL) == JUDGED

    spans = sink.wait_for(lambda got: sum(map(judged, got)) == 22 + LONG_TEXTS, timeout=60)
    requests = {x.attributes[sc.RESPONSE_ID]: x for x in spans if judged(x)}

    def request(rid: str):
        (found,) = [x for got, x in requests.items() if got.startswith(rid)]
        return found

    def handover(r) -> float:
        (queue,) = [x for x in spans if x.name == sc.SPAN_QUEUE and x.parent_span_id == r.span_id]
        queued = next(ts for name, ts, _ in queue.events if name == sc.EVENT_ENGINE_QUEUED)
        return (queued - r.start_ns) / 1e9  # the request span starts at its arrival

    assert len({request(rid).attributes[sc.USAGE_INPUT_TOKENS] for rid in controls + burst_ids}) == 1
    affected = [rid for rid in burst_ids
                if handover(request(rid)) >= 0.5 * request(rid).attributes[sc.LATENCY_TTFT]]
    assert len(affected) >= 8, "the scenario did not run as built: " + str(
        [(round(handover(request(rid)), 3), request(rid).attributes[sc.LATENCY_TTFT]) for rid in burst_ids])
    causes = {rid: request(rid).attributes[sc.SLOW_CAUSE] for rid in controls + burst_ids}
    right = [rid for rid in affected if causes[rid] == sc.SLOW_FRONTEND]
    assert len(right) >= 0.9 * len(affected), {rid: (causes[rid], round(handover(request(rid)), 3)) for rid in affected}
    for rid in right:  # charged what it waited beyond the controls' usual hand-over
        a = request(rid).attributes
        assert a[sc.SLOW_SECONDS[sc.SLOW_FRONTEND]] > 0.5 * handover(request(rid)), a
    # no control that went straight to the engine is blamed (one the loaded machine kept in the frontend
    # itself, its hand-over half its TTFT or more like the burst's, may be: that is what it met)
    for rid in controls:
        if handover(request(rid)) < 0.5 * request(rid).attributes[sc.LATENCY_TTFT]:
            assert causes[rid] != sc.SLOW_FRONTEND, (rid, request(rid).attributes)


def _frontend_of(pid: int) -> int:
    """The frontend a step socket's process serves: itself, or the API server whose agent process it is
    (otel_llm/agent: it binds the step socket for its frontend)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"agent_process" not in f.read():
            return pid
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])  # the parent's pid (the field after the state)


def _agents_asked_for(server: VLLMServer, since: float) -> list[tuple[str | None, str | None]]:
    """What each agent of ``server``'s API servers inherited: the engine records asked for (the one path:
    ``enriched``) and the API server whose records it keeps (its ``client_index``)."""
    import glob
    import tempfile

    found = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "otel-llm-steps-*", "*.sock")):
        try:
            pid = int(os.path.basename(path).split(".")[0])
            if server.proc is None or os.getsid(pid) != server.proc.pid or os.stat(path).st_mtime < since \
                    or _frontend_of(pid) == pid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        except (ValueError, OSError):
            continue
        found.append(tuple(v.decode() if v is not None else None for v in (
            env.get(b"OTEL_LLM_ENGINE_REQUESTS"), env.get(b"OTEL_LLM_AGENT_CLIENT"))))
    return sorted(found, key=str)


def _step_sockets_of(server: VLLMServer, since: float) -> set[int]:
    """The frontends (by pid) of the processes of ``server``'s session that bound a socket in a step directory since
    ``since`` (wall clock). A socket file a killed process of an earlier run left behind is older: its
    pid may belong to one of this server's processes by now (pids wrap at 32768 on a busy machine)."""
    import glob
    import tempfile

    pids = set()
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "otel-llm-steps-*", "*.sock")):
        try:
            pid = int(os.path.basename(path).split(".")[0])
            if server.proc is not None and os.getsid(pid) == server.proc.pid and os.stat(path).st_mtime >= since:
                pids.add(_frontend_of(pid))
        except (ValueError, OSError):
            pass  # not a pid-named socket, or a process that is gone
    return pids


def test_serve_with_several_api_servers_reports_steps_to_each():
    """``--api-server-count 2``: two frontend processes share one EngineCore; each binds its own step
    socket and every request, whichever frontend served it, is linked from its engine steps.

    Which frontend a connection lands on is the kernel's choice, so the test asserts what our code
    decides: both API servers bound a step socket, and no request (from either) went unlinked."""
    import concurrent.futures

    import openai

    env = {"OTEL_LLM_BASELINE_DETAIL": "steps", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "otel,process"}
    started = time.time() - 1.0  # file times are coarser than time.time()
    with OTLPSink() as sink, VLLMServer(otlp_endpoint=sink.endpoint, env=env,
                                        extra_args=("--api-server-count", "2"), cli=True) as s:
        client = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)

        def ask(i: int) -> None:
            client.completions.create(model=s.model, prompt=[3 + (i * 11 + j) % 400 for j in range(20)],
                                      max_tokens=8, extra_body={"ignore_eos": True})
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(ask, range(16)))

        def ready(spans):
            requests = [x for x in spans if x.kind == "SERVER"]
            linked = {link for x in spans if x.name == sc.SPAN_ENGINE_STEP for link in x.links}
            return len(requests) == 16 and all((r.trace_id, r.span_id) in linked for r in requests)
        spans = sink.wait_for(ready, timeout=60)
        deadline = time.monotonic() + 30
        while len(sockets := _step_sockets_of(s, started)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        agents = _agents_asked_for(s, started)
    requests = [x for x in spans if x.kind == "SERVER"]
    linked = {link for x in spans if x.name == sc.SPAN_ENGINE_STEP for link in x.links}
    unlinked = [r for r in requests if (r.trace_id, r.span_id) not in linked]
    assert len(requests) == 16 and not unlinked, f"{len(unlinked)} of {len(requests)} requests got no engine steps"
    assert len(sockets) == 2, f"each API server should bind its own step socket, found {sorted(sockets)}"
    # every request's engine steps came from the frontend that served it (its resource's pid)
    frontends = {x.resource.get("process.pid") for x in requests}
    assert frontends <= sockets, f"requests served by {frontends}, step sockets of {sockets}"
    # the one path: the engines' records, enriched, reach both agents; each keeps its own API server's
    # requests (each request above counted once: neither agent took the other's, nor its frontend's twice)
    assert agents == [("enriched", "0"), ("enriched", "1")], agents
