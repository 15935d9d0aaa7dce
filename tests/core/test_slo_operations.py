"""Tenants (source, cleaning, the bounded label, per-tenant SLOs), engine time per request and the interference a
request's prompt caused: the core's pure functions, the SDK's metrics and the collector's derivation."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.diagnosis.engine_time import busy, engine_time, interference_caused, work_shares
from otel_llm.core.diagnosis.roofline import DevicePeaks, ModelShape
from otel_llm.core.diagnosis.verdict import SlowVerdict, StepWindow, decide
from otel_llm.core.metrics import ServerMetrics
from otel_llm.core.slo import SLO, SLOTable
from otel_llm.core.summary import RequestSummary
from otel_llm.core.tenant import MAX_LENGTH, TenantLabels, TenantSource, clean
from otel_llm.core.timeline import QUEUED, PrefillChunk, RequestTimeline, StepRecord

TENANT = sc.REQUEST_TENANT


def points(reader: InMemoryMetricReader) -> dict[str, list]:
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


# -- tenants ----------------------------------------------------------------------------------------------

def test_a_tenant_value_is_cut_and_charset_checked_before_it_is_a_label() -> None:
    assert clean("team-a") == "team-a"
    assert clean("  acme.corp/ml:prod@eu+1  ") == "acme.corp/ml:prod@eu+1"
    assert clean('a b"c\n{d}=é') == "a_b_c__d___"  # spaces, quotes, newlines, braces, non-ASCII: "_"
    huge = "x" * 1_000_000
    assert clean(huge) == "x" * MAX_LENGTH
    assert clean(b"bytes") == "bytes"
    for nothing in (None, "", "   ", 42, ["a"]):
        assert clean(nothing) is None
    # the collector derives it from a span attribute the same way
    s = RequestSummary.from_attributes({sc.LATENCY_E2E: 1.0, TENANT: "t" * 500 + " x"})
    assert s is not None and s.tenant == "t" * MAX_LENGTH


def test_tenant_sources_parse_and_resolve(monkeypatch) -> None:
    header = TenantSource.parse("header:X-Tenant-Id")
    assert header.reads_request and header.header == "x-tenant-id"
    assert header.from_request({"x-tenant-id": "team a"}, user="u") == "team_a"
    assert header.from_request(None, user="u") is None
    user = TenantSource.parse("user")
    assert user.from_request({"x-tenant-id": "h"}, user="alice") == "alice"
    lora = TenantSource.parse("lora")
    assert not lora.reads_request and lora.resolve("ignored", "sql-adapter") == "sql-adapter"
    assert lora.resolve(None, None) is None
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"service.name=s,{TENANT}=solo team")
    assert TenantSource.parse("resource").resolve(None, "x") == "solo_team"
    assert TenantSource.parse(None).kind is None and TenantSource.parse("").resolve("x", "y") == "x"
    for bad in ("header:", "header:bad header", "cookie", "user:x"):
        with pytest.raises(ValueError):
            TenantSource.parse(bad)
    assert Config.resolve({}, {"OTEL_LLM_TENANT": "header:x-team"}).tenant.header == "x-team"
    with pytest.raises(ValueError, match="OTEL_LLM_TENANT"):
        Config.resolve({}, {"OTEL_LLM_TENANT": "nonsense"})


def test_ten_thousand_tenants_keep_series_and_memory_bounded() -> None:
    """The label is the adapter label's mechanism: the SLO table's tenants first, then the first 64 seen,
    every later one ``other`` and counted; the metrics' series and the process's memory stop growing."""
    reader = InMemoryMetricReader()
    metrics = ServerMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"),
                            SLOTable.parse("ttft=1; @vip: ttft=0.1"))

    def run(first: int, n: int) -> None:
        for i in range(first, first + n):
            metrics.record(RequestSummary(model="m", ttft=0.5, e2e=1.0, tenant=f"tenant-{i}"))

    run(0, 1000)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    run(1000, 9000)
    gc.collect()
    grew = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    requests = points(reader)["llm.server.requests"]
    tenants = {p.attributes.get(TENANT) for p in requests}
    assert len(tenants) == 63 + 1 and sc.TENANT_OTHER in tenants  # "vip" reserved: 63 first-come, other
    assert "tenant-0" in tenants and "tenant-62" in tenants and "tenant-63" not in tenants
    assert sum(p.value for p in requests) == 10_000
    assert metrics.tenants.collapsed == 10_000 - 63
    assert grew < 256 * 1024, f"{grew} bytes for 9000 more tenants"  # per tenant nothing is kept
    # the reserved tenant's own SLO judges it (0.5 s TTFT breaches 0.1 s), the others' the default's
    assert metrics.record(RequestSummary(model="m", ttft=0.5, e2e=1.0, tenant="vip")) is False
    assert metrics.record(RequestSummary(model="m", ttft=0.5, e2e=1.0, tenant="tenant-5")) is True
    assert {p.attributes.get(TENANT) for p in points(reader)["llm.server.requests"]} == tenants | {"vip"}


def test_slo_table_with_goodput_and_tenants() -> None:
    t = SLOTable.parse("ttft=0.5,goodput=99%; big: ttft=2,goodput=0.95; @a: tpot=0.03; big@a: e2e=20,goodput=0.9")
    assert t.default == SLO(ttft=0.5, goodput=0.99)
    assert t.for_request("big", "a") == SLO(e2e=20, goodput=0.9)
    assert t.for_request("small", "a") == SLO(tpot=0.03)  # a tenant's SLO wins over the model's and default
    assert t.for_request("big", "b") == SLO(ttft=2, goodput=0.95)
    assert t.for_request(None, None) == t.default
    assert SLOTable.coerce({"*": SLO(ttft=1), "@a": SLO(ttft=2), "m@a": SLO(ttft=3)}).for_request("m", "a").ttft == 3
    assert SLO(ttft=1, goodput=0.99).breaches(RequestSummary(ttft=0.5)) == ()  # goodput judges no request
    for bad in ("goodput=1", "goodput=0", "goodput=abc", "@: ttft=1"):
        with pytest.raises(ValueError):
            SLOTable.parse(bad)


def test_breaches_and_goodput_by_tenant() -> None:
    reader = InMemoryMetricReader()
    metrics = ServerMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), SLOTable.parse("tpot=0.05"))
    metrics.record(RequestSummary(model="m", tpot=0.1, e2e=1, tenant="a", slow_cause=sc.SLOW_PREFILL_INTERFERENCE,
                                  engine_time=0.25, interference_caused=0.0))
    metrics.record(RequestSummary(model="m", tpot=0.01, e2e=1, tenant="b", engine_time=0.75,
                                  interference_caused=0.5))
    got = points(reader)
    breaches = {(p.attributes[TENANT], p.attributes[sc.SLOW_CAUSE]): p.value for p in got["llm.server.slo.breaches"]}
    assert breaches == {("a", sc.SLOW_PREFILL_INTERFERENCE): 1}
    good = {p.attributes[TENANT]: p.value for p in got["llm.server.requests.good"]}
    assert good == {"b": 1}
    engine = {p.attributes[TENANT]: p.sum for p in got["llm.server.request.engine_time"]}
    assert engine == {"a": 0.25, "b": 0.75}
    caused = {p.attributes[TENANT]: p.sum for p in got["llm.server.request.interference_caused"]}
    assert caused == {"a": 0.0, "b": 0.5}


def test_the_collector_derives_the_tenant_label_from_the_span() -> None:
    from otel_llm_collector.aggregation import AggregationBackend
    from otel_llm_collector.config import LabelLimits
    from otel_llm_collector.llm_metrics import LLMMetricsProcessor
    from otel_llm_collector.spans import RequestFacts
    from otel_llm_collector.telemetry import GatewayMetrics

    backend = AggregationBackend()
    processor = LLMMetricsProcessor(backend, SLOTable.parse("tpot=0.05; @strict: tpot=0.01"), GatewayMetrics(),
                                    LabelLimits())
    spans = [{sc.LATENCY_E2E: 1.0, sc.LATENCY_TPOT: 0.02, sc.REQUEST_MODEL: "m", TENANT: tenant,
              sc.REQUEST_ENGINE_TIME: 0.5} for tenant in ("strict", "relaxed", "relaxed")]
    processor.process([RequestFacts(b"t" * 16, "svc", RequestSummary.from_attributes(a), "otel_llm", None)
                       for a in spans])
    got = {}
    for metric in backend.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics:
        got[metric.name] = {p.attributes.get(TENANT): getattr(p, "value", getattr(p, "sum", None))
                            for p in metric.data.data_points}
    assert got["llm.server.requests"] == {"strict": 1, "relaxed": 2}
    assert got["llm.server.requests.good"] == {"relaxed": 2}  # the tenant's own SLO judged "strict"
    assert got["llm.server.request.engine_time"] == {"strict": 0.5, "relaxed": 1.0}


# -- engine time ------------------------------------------------------------------------------------------

def step(step_id: int, start: float, end: float, ids: list[str], tokens: list[int] | None, prefill_at=(),
         contexts=None) -> StepRecord:
    s = StepRecord.of_lists(step_id, start, end, ids, tokens, list(prefill_at))
    s.contexts = contexts
    return s


def test_work_shares_by_tokens_and_by_the_roofline() -> None:
    assert work_shares(None, 4) == [0.25] * 4
    assert work_shares([30, 10], 2) == [0.75, 0.25]
    assert work_shares([0, 0], 2) == [0.5, 0.5]
    shape = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)
    peaks = DevicePeaks("H100", 9.89e14, 3.35e12)
    # two decodes with equal contexts: equal shares; a 4096-token prefill beside them: most of the step
    equal = work_shares([1, 1], 2, [500, 500], shape, peaks)
    assert equal[0] == pytest.approx(equal[1]) and sum(equal) == pytest.approx(1.0)
    mixed = work_shares([4096, 1, 1], 3, [0, 500, 500], shape, peaks)
    assert sum(mixed) == pytest.approx(1.0) and mixed[0] > 0.9 and mixed[1] == pytest.approx(mixed[2])
    # a decode with a long context reads more KV: a larger share than one with a short context
    kv = work_shares([1, 1], 2, [100_000, 10], shape, peaks)
    assert kv[0] > kv[1]


def test_engine_times_add_up_to_the_busy_time_and_equal_work_gets_equal_time() -> None:
    steps = [step(1, 0.0, 0.10, ["a", "b", "c"], [100, 100, 50], prefill_at=(0, 1, 2)),
             step(2, 0.10, 0.12, ["a", "b", "c"], None),
             step(3, 0.12, 0.15, ["a", "b"], None),
             step(4, 0.15, 0.16, ["a", "b"], None)]
    previous, busy_times = None, []
    for s in steps:
        busy_times.append(busy(s.start, s.end, previous))
        previous = s.end
    times = {r: engine_time(r, steps, busy_times) for r in "abc"}
    assert times == {r: engine_time(r, steps) for r in "abc"}  # (no overlap: the busy times are the durations)
    assert times["a"] == pytest.approx(times["b"])  # the same steps, the same work
    assert sum(times.values()) == pytest.approx(sum(s.end - s.start for s in steps))
    assert times["c"] == pytest.approx(0.1 * 50 / 250 + 0.02 / 3)
    assert engine_time("nobody", steps) == 0.0


def test_overlapping_steps_are_counted_once() -> None:
    """Asynchronous scheduling: step 2 began before step 1 ended; its busy time starts at step 1's end."""
    assert busy(0.0, 0.10, None) == pytest.approx(0.10)
    assert busy(0.08, 0.20, 0.10) == pytest.approx(0.10)
    assert busy(0.30, 0.35, 0.20) == pytest.approx(0.05)  # an idle gap before it is not its time
    assert busy(0.05, 0.09, 0.10) == 0.0  # wholly inside the previous one


def test_the_pipeline_charges_each_step_once_over_every_request() -> None:
    """Where steps are joined: every finished request's engine time, overlapping steps counted once, on its
    span with its tenant, and in the engine-time histogram by tenant; the sum is the engine's busy time."""
    import time

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_llm.core.pipeline import Pipeline
    from otel_llm.core.timeline import RequestTimeline

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    pipeline = Pipeline(Config.resolve({"sample_rate": 1.0}, environ={}), tp.get_tracer("t"),
                        MeterProvider(metric_readers=[reader]).get_meter("t"), "test")
    base = time.monotonic() - 5.0
    tenants = {"a": "team-a", "b": "team-a", "c": "team-b"}
    for rid, tenant in tenants.items():
        pipeline.start(RequestTimeline(rid, time.time() - 5.0, model="m", response_id=rid,
                                       request_attributes={TENANT: tenant}))
    # step 2 begins 5 ms before step 1 ends (asynchronous scheduling): counted from step 1's end
    pipeline.add_step(step(1, base, base + 0.10, ["a", "b", "c"], [100, 100, 200], prefill_at=(0, 1, 2)))
    pipeline.add_step(step(2, base + 0.095, base + 0.12, ["a", "b", "c"], None))
    pipeline.add_step(step(3, base + 0.13, base + 0.14, ["a", "b"], None))
    busy_total = 0.10 + 0.02 + 0.01
    summaries = {}
    for rid in tenants:
        summaries[rid] = RequestSummary(model="m", ttft=0.1, e2e=0.2, output_tokens=3)
        pipeline.finish(rid, summaries[rid])
    assert pipeline.flush(10)
    times = {rid: s.engine_time for rid, s in summaries.items()}
    assert times["a"] == pytest.approx(times["b"])
    assert sum(times.values()) == pytest.approx(busy_total)
    assert times["c"] == pytest.approx(0.10 * 0.5 + 0.02 / 3)
    spans = {s.attributes.get(sc.RESPONSE_ID): s for s in exporter.get_finished_spans()
             if sc.REQUEST_ENGINE_TIME in (s.attributes or {})}
    assert spans["c"].attributes[sc.REQUEST_ENGINE_TIME] == pytest.approx(times["c"])
    assert spans["c"].attributes[TENANT] == "team-b" and sc.REQUEST_INTERFERENCE_CAUSED in spans["c"].attributes
    by_tenant = {p.attributes[TENANT]: p.sum for p in points(reader)["llm.server.request.engine_time"]}
    assert by_tenant == pytest.approx({"team-a": times["a"] + times["b"], "team-b": times["c"]})
    pipeline.close()


def test_interference_caused_is_the_victims_loss_shared_by_prefill_tokens() -> None:
    """Decode-only steps of 2 requests take 10 ms; a step with 2 decodes and two prompts (300 and 100 tokens)
    takes 50 ms: each decode lost 40 ms (the verdict's charge), 80 ms in all, 60 ms of it the 300-token
    prompt's."""
    window = StepWindow(64)
    engine = 7 << 32
    t = 0.0
    for i in range(1, 6):
        window.add(step(engine | i, t, t + 0.010, ["d1", "d2"], None), 0, 2)
        t += 0.010
    mixed = step(engine | 6, t, t + 0.050, ["d1", "d2", "p1", "p2"], [1, 1, 300, 100], prefill_at=(2, 3))
    window.add(mixed, 400, 2)
    big = interference_caused([PrefillChunk(engine | 6, t, t + 0.05, 300)], window)
    small = interference_caused([PrefillChunk(engine | 6, t, t + 0.05, 100)], window)
    assert big == pytest.approx(0.060) and small == pytest.approx(0.020)
    assert interference_caused([], window) == 0.0
    # a prefill-only step (no one decoding beside it) costs no one anything
    window.add(step(engine | 7, t + 0.05, t + 0.2, ["p3"], [500], prefill_at=(0,)), 500, 0)
    assert interference_caused([PrefillChunk(engine | 7, 0, 0, 500)], window) == 0.0


@pytest.mark.parametrize("source, expected", [("header:X-Tenant", "team_a"), ("user", "bob"), ("lora", None)])
def test_the_serving_layer_reads_the_tenant_from_its_source(source: str, expected: str | None) -> None:
    """Under ``vllm serve`` the request handler (wrapped by ``VLLMWrappers.serving``) sees the raw HTTP request
    and the OpenAI request: the configured source's value is read there, cleaned, for the request it starts."""
    import asyncio
    import contextvars

    from opentelemetry.sdk.trace import TracerProvider

    from otel_llm.core.pipeline import Pipeline
    from otel_llm.instrumentation.vllm import wrappers

    pipeline = Pipeline(Config.resolve({"tenant": source}, environ={}), TracerProvider().get_tracer("t"),
                        MeterProvider().get_meter("t"), "test")
    w = wrappers.VLLMWrappers(pipeline, lambda: None, lambda: None)

    class Request:
        user, stream = "bob", False

    class RawRequest:
        headers = {"x-tenant": "team a"}
        scope: dict = {}

    async def create_chat_completion(request, raw_request=None):
        return None

    def handle() -> str | None:
        handler = w.serving("chat")(create_chat_completion, None, (Request(),), {"raw_request": RawRequest()})
        asyncio.run(handler)  # (the tenant was read when the handler was called, in this context)
        return wrappers._TENANT.get()

    assert contextvars.copy_context().run(handle) == expected
    pipeline.close()


def test_a_streamed_response_carries_the_handlers_tenant_to_the_streaming_task() -> None:
    """vLLM adds a streamed request to the engine on the body's first iteration, in Starlette's streaming task,
    whose context lacks what the serving handler set: the stream carries the tenant (and the stream flag, the
    model asked for, the server) there. Without it a streamed request had no tenant."""
    import asyncio
    import contextvars

    from otel_llm.instrumentation.vllm import wrappers as w

    seen: list = []

    async def body():
        seen.append((w._TENANT.get(), w._MODEL.get(), w._STREAM.get(), w._SERVER.get(), w._OPERATION.get()[0]))
        yield "chunk"

    async def handler():
        w._TENANT.set("team-a")
        w._MODEL.set("m")
        w._STREAM.set(True)
        w._SERVER.set(("127.0.0.1", 8000))
        return body()

    async def main():
        stream = await w._streams_keep_operation(handler(), "text_completion")
        # the body is iterated in another context, as Starlette's streaming task does
        return await asyncio.create_task(_drain(stream), context=contextvars.Context())

    async def _drain(stream):
        return [c async for c in stream]

    assert asyncio.run(main()) == ["chunk"]
    assert seen == [("team-a", "m", True, ("127.0.0.1", 8000), "text_completion")]


class Scenario:
    """The two-tenant scenario's shape (tests/views/test_dashboard_prometheus.py) as step records, judged by the
    verdict and the interference-caused rule: ``victims`` decoding 1 token a step (decode-only steps take
    ``DECODE`` s), long prompts of ``LONG`` tokens prefilled beside them (a step with prefill takes ``PREFILL`` s)."""

    DECODE, PREFILL, LONG, LENGTH = 0.010, 0.030, 440, 96

    def __init__(self, victims: int = 8) -> None:
        self.window = StepWindow()
        self.engine = 9 << 32
        self.next = 1
        self.now = 100.0
        self.victims = {f"v{i}": RequestTimeline(f"v{i}", 0.0, model="m", response_id=f"v{i}") for i in range(victims)}
        self.chunks: dict[str, list[PrefillChunk]] = {}
        for t in self.victims.values():
            t.events.append((QUEUED, self.now))
        self._step({r: 8 for r in self.victims}, {}, self.DECODE)  # their prompts, one step: the first tokens

    def _step(self, prompts: dict[str, int], longs: dict[str, int], dur: float) -> None:
        step_id = self.engine | self.next
        start, end = self.now + 0.0005, self.now + 0.0005 + dur
        decoding = [r for r in self.victims if r not in prompts and len(self.victims[r].token_ts) < self.LENGTH]
        ids = [*prompts, *decoding, *longs]
        tokens = [*prompts.values(), *(1 for _ in decoding), *longs.values()]
        prefill_at = [*range(len(prompts)), *range(len(prompts) + len(decoding), len(ids))]
        rec = step(step_id, start, end, ids, tokens, prefill_at)
        self.window.add(rec, sum(prompts.values()) + sum(longs.values()), len(decoding))
        for r in [*prompts, *decoding]:
            self.victims[r].steps.append(step_id)
            self.victims[r].token_ts.append(end)
        for r, n in prompts.items():
            self.victims[r].chunks.append(PrefillChunk(step_id, start, end, n))
        for r, n in longs.items():
            self.chunks.setdefault(r, []).append(PrefillChunk(step_id, start, end, n))
        self.next += 1
        self.now = end

    def decode(self, n: int) -> None:
        for _ in range(n):
            self._step({}, {}, self.DECODE)

    def burst(self, k: int, first: int) -> None:
        """``k`` long prompts sent at once, prefilled 504 tokens a step (the 512-token budget less 8 decodes)."""
        left = {f"long{first + j}": self.LONG for j in range(k)}
        while left:
            budget, longs = 504, {}
            for r in list(left):
                n = min(budget, left[r])
                if n <= 0:
                    break
                longs[r], budget = n, budget - n
                left[r] -= n
                if not left[r]:
                    del left[r]
            self._step({}, longs, self.PREFILL)

    def judged(self) -> dict[str, SlowVerdict]:
        return {r: decide(t, self.window, ("tpot",)) for r, t in self.victims.items()}

    def caused(self) -> float:
        return sum(interference_caused(c, self.window) for c in self.chunks.values())


def test_the_two_tenant_scenario_is_charged_only_with_decode_only_steps_to_compare() -> None:
    """What the real-engine scenario's driver must guarantee, and why: with decode-only steps of the victims' batch
    before and between the bursts, every victim's TPOT breach is prefill interference and the long prompts caused
    what the victims lost; with long prompts in every step from their first decode, or only after they finished,
    nothing can be charged (the verdict says unknown)."""
    paced = Scenario()
    paced.decode(4)  # the driver's BASELINE_STEPS
    sent = 0
    while len(paced.victims["v0"].token_ts) + 24 <= Scenario.LENGTH:  # its ROOM
        paced.burst(4, sent)
        sent += 4
        paced.decode(4)  # its PAUSE_STEPS
    paced.decode(Scenario.LENGTH - len(paced.victims["v0"].token_ts))
    verdicts = paced.judged()
    assert {v.cause for v in verdicts.values()} == {sc.SLOW_PREFILL_INTERFERENCE}
    # each burst of 4 prompts (1,760 tokens) took 4 steps, each 20 ms longer than a decode-only one, for each victim
    lost = sum(v.seconds[sc.SLOW_PREFILL_INTERFERENCE] for v in verdicts.values())
    assert sent >= 12 and lost == pytest.approx(8 * sent * 0.020)
    assert paced.caused() == pytest.approx(lost)

    crowded = Scenario()  # a long prompt in every step from the victims' first decode on
    while len(crowded.victims["v0"].token_ts) < Scenario.LENGTH:
        crowded.burst(1, len(crowded.chunks))
    assert {v.cause for v in crowded.judged().values()} == {sc.SLOW_UNKNOWN}
    assert crowded.caused() == 0.0

    late = Scenario()  # the long prompts arrive once the victims have finished
    late.decode(Scenario.LENGTH - 1)
    late.burst(4, 0)
    assert {v.cause for v in late.judged().values()} == {sc.SLOW_UNKNOWN}
