"""The KV connector wrapper, driven by hand with connector classes of our own (no engine).

A fence holds the wrapped methods against vLLM's ``KVConnectorBase_V1``; a second connector class
(an asynchronous, NIXL-like one that keeps its own transfer statistics and reports failed blocks)
drives both sides; a connector that raises still raises to the caller, unchanged."""

from __future__ import annotations

import contextlib
import inspect
import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.trace import StatusCode

from otel_llm import semconv as sc
from otel_llm.core.config import Config
from otel_llm.core.handoff import HandoffBook, KVHandoff
from otel_llm.core.pipeline import Pipeline
from otel_llm.core.summary import RequestSummary
from otel_llm.core.timeline import QUEUED, SCHEDULED, RequestTimeline
from otel_llm.instrumentation.vllm import kv_channel, kv_connector as kc
from support.traces import request_trees

base = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.base")
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402


# -- the fence ---------------------------------------------------------------------------------

def test_the_wrapped_methods_are_kv_connector_base_v1s():
    """A method renamed or re-signed in vLLM fails here, loudly, not as a hand-off silently unmeasured."""
    cls = base.KVConnectorBase_V1
    for name in (*kc.WORKER_METHODS, *kc.SCHEDULER_METHODS):
        assert callable(getattr(cls, name, None)), f"KVConnectorBase_V1.{name} is gone"
    for name in kc.HMA_METHODS:
        assert callable(getattr(base.SupportsHMA, name, None)), f"SupportsHMA.{name} is gone"
    params = {name: list(inspect.signature(getattr(cls, name)).parameters) for name in kc.SCHEDULER_METHODS}
    # the arguments the scheduler side reads, by position as vLLM's scheduler passes them
    assert params["get_num_new_matched_tokens"][:3] == ["self", "request", "num_computed_tokens"]
    assert params["update_state_after_alloc"][:4] == ["self", "request", "blocks", "num_external_tokens"]
    assert params["build_connector_meta"][:2] == ["self", "scheduler_output"]
    assert params["update_connector_output"][:2] == ["self", "connector_output"]
    assert params["request_finished"][:2] == ["self", "request"]
    assert KVConnectorRole.WORKER.name == "WORKER" and KVConnectorRole.SCHEDULER.name == "SCHEDULER"
    assert {"finished_recving", "failed_recving"} <= set(KVConnectorOutput.__dataclass_fields__)
    # where vLLM builds the connector, and the context manager a step's connector work runs in
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

    assert list(inspect.signature(KVConnectorFactory.create_connector).parameters)[:3] == [
        "config", "role", "kv_cache_config"]
    assert callable(KVConnectorModelRunnerMixin._get_kv_connector_output)
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator

    assert list(inspect.signature(KVOutputAggregator.aggregate).parameters)[:2] == ["self", "outputs"]


def test_the_workers_figures_survive_vllms_aggregation_of_their_outputs():
    """vLLM's executor builds a new KVConnectorOutput from the workers' (one worker too): the figures are
    merged onto it, the slowest worker's time for the step."""
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.v1.outputs import ModelRunnerOutput

    w = kc.ConnectorWrapper(HandoffBook().add)
    outputs = []
    for load_s in (0.2, 0.5):
        kv = KVConnectorOutput()
        setattr(kv, kc.WORKER_STEP_ATTR, kc.WorkerStep(1.0, 1.0 + load_s, load_s, None, None, 0.0, 1, 0, None,
                                                        None, 100))
        outputs.append(ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0}, kv_connector_output=kv))
    aggregator = KVOutputAggregator(expected_finished_count=2)
    originals = [o.kv_connector_output for o in outputs]
    merged = w.aggregate(aggregator.aggregate, aggregator, (outputs,), {})
    assert all(merged.kv_connector_output is not o for o in originals)  # vLLM's new object
    step = getattr(merged.kv_connector_output, kc.WORKER_STEP_ATTR)
    assert (step.load_start, step.load_end, step.load_s) == (1.0, 1.5, 0.5)
    assert step.failed_blocks == 1 and step.bytes_transferred == 200


def test_a_worker_without_output_is_no_error_of_ours():
    """vLLM's executor hands the aggregator None for a worker that returned nothing this step (a step without
    model output) and gets None back: nothing to merge, nothing counted; the next step merges as usual."""
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.v1.outputs import ModelRunnerOutput

    w = kc.ConnectorWrapper(HandoffBook().add)
    aggregator = KVOutputAggregator(expected_finished_count=2)
    kv = KVConnectorOutput()
    setattr(kv, kc.WORKER_STEP_ATTR, kc.WorkerStep(1.0, 1.2, 0.2, None, None, 0.0, 0, 0, None, None, None))
    assert w.aggregate(aggregator.aggregate, aggregator, ([None],), {}) is None
    merged = w.aggregate(aggregator.aggregate, aggregator,
                         ([ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0}, kv_connector_output=kv)],), {})
    assert getattr(merged.kv_connector_output, kc.WORKER_STEP_ATTR).load_s == 0.2
    assert not w.guard.errors  # nothing counted in its owner's guard


def test_the_factory_and_the_step_context_are_wrapped_and_unwrapped():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

    from otel_llm.instrumentation.wraps import is_wrapped

    w = kc.ConnectorWrapper(HandoffBook().add)
    w.arm()
    try:
        assert is_wrapped(KVConnectorFactory, "create_connector")
        assert is_wrapped(KVConnectorModelRunnerMixin, "_get_kv_connector_output")
    finally:
        w.disarm()
    assert not is_wrapped(KVConnectorFactory, "create_connector")


# -- a second connector class -------------------------------------------------------------------

class PullConnector(base.KVConnectorBase_V1):
    """Loads asynchronously (the request waits in WAITING_FOR_REMOTE_KVS), keeps NIXL-shaped transfer
    statistics, and reports blocks it failed to load."""

    def __init__(self, role, fail_blocks=frozenset()) -> None:  # no vLLM config: the base's state unused
        self._role = role
        self.fail_blocks = set(fail_blocks)
        self.calls: list[str] = []

    # scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.calls.append("match")
        return 64, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.calls.append("alloc")

    def build_connector_meta(self, scheduler_output):
        return base.KVConnectorMetadata()

    def update_connector_output(self, connector_output):
        self.calls.append("output")

    def request_finished(self, request, block_ids):
        return False, None

    # worker side
    def start_load_kv(self, forward_context, **kwargs):
        self.calls.append("load")

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass

    def get_block_ids_with_load_errors(self):
        return set(self.fail_blocks)

    def get_kv_connector_stats(self):
        return KVConnectorStats(data={"transfer_duration": [0.25, 0.5], "bytes_transferred": [1024, 2048],
                                      "num_failed_transfers": []})


class TickClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def _request(rid: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid)


def _scheduled(new=(), cached=(), outputs=()) -> SimpleNamespace:
    return SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new],
                           scheduled_cached_reqs=SimpleNamespace(req_ids=list(cached), num_output_tokens=list(outputs)))


def test_an_asynchronous_load_is_the_wait_until_it_arrived_with_the_connectors_own_figures():
    book = HandoffBook()
    clock = TickClock()
    w = kc.ConnectorWrapper(book.add, clock=clock)
    sched = w.wrap(PullConnector(KVConnectorRole.SCHEDULER))
    worker = w.wrap(PullConnector(KVConnectorRole.WORKER, fail_blocks={7, 8}))
    assert w.wrap(sched) is sched  # once: wrapping again changes nothing

    assert sched.get_num_new_matched_tokens(_request("d1"), 0) == (64, True)
    sched.update_state_after_alloc(_request("d1"), None, 64)
    waited_from = clock.now
    sched.build_connector_meta(_scheduled())
    # the worker's step: its connector work, then the output that goes back to the scheduler
    out = KVConnectorOutput(finished_recving={"d1"})
    with kc._AttachWorkerStep(contextlib.nullcontext(out), w):
        worker.start_load_kv(None)
        worker.get_block_ids_with_load_errors()
        worker.get_kv_connector_stats()
    assert isinstance(getattr(out, kc.WORKER_STEP_ATTR), kc.WorkerStep)
    sched.update_connector_output(out)
    assert sched.calls == ["match", "alloc", "output"]  # the connector saw every call, in order
    assert worker.calls == ["load"]

    h = book.pop("d1")
    assert h is not None and h.connector == "PullConnector"
    assert h.external_tokens == 64 and h.load_async
    assert h.load_start == waited_from and h.load_end is not None and h.load_s == h.load_end - h.load_start
    # failed blocks belong to the step's sync loads: an async load's are its receive's (none here)
    assert not h.failed


def test_a_synchronous_load_takes_the_steps_worker_time_and_its_failed_blocks():
    book = HandoffBook()
    w = kc.ConnectorWrapper(book.add, clock=TickClock())

    class SyncConnector(PullConnector):
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 32, False

    sched = w.wrap(SyncConnector(KVConnectorRole.SCHEDULER))
    worker = w.wrap(SyncConnector(KVConnectorRole.WORKER, fail_blocks={3}))
    sched.get_num_new_matched_tokens(_request("d2"), 0)
    sched.update_state_after_alloc(_request("d2"), None, 32)
    sched.build_connector_meta(_scheduled(new=["d2"]))
    out = KVConnectorOutput()
    with kc._AttachWorkerStep(contextlib.nullcontext(out), w):
        worker.start_load_kv(None)
        worker.wait_for_layer_load("layer.0")
        worker.get_block_ids_with_load_errors()
        worker.get_kv_connector_stats()
    sched.update_connector_output(out)
    h = book.pop("d2")
    step = getattr(out, kc.WORKER_STEP_ATTR)
    assert h.external_tokens == 32 and not h.load_async
    assert (h.load_start, h.load_end, h.load_s) == (step.load_start, step.load_end, step.load_s)
    assert h.load_s == pytest.approx(1.0)  # two calls of one tick each
    assert h.failed_blocks == 1 and h.failed
    assert h.transfer_s == pytest.approx(0.75) and h.bytes_transferred == 3072


def test_a_producer_saves_in_its_prefill_steps_and_settles_when_it_finishes():
    book = HandoffBook()
    w = kc.ConnectorWrapper(book.add, clock=TickClock())
    sched = w.wrap(PullConnector(KVConnectorRole.SCHEDULER))
    worker = w.wrap(PullConnector(KVConnectorRole.WORKER))
    for step, scheduled in enumerate((_scheduled(new=["p1"]), _scheduled(cached=["p1"], outputs=[0]))):
        sched.build_connector_meta(scheduled)
        out = KVConnectorOutput()
        with kc._AttachWorkerStep(contextlib.nullcontext(out), w):
            worker.save_kv_layer("layer.0", None, None)
            worker.wait_for_save()
        if step == 1:  # vLLM frees the finished request before it hands the connector the step's output
            sched.request_finished(_request("p1"), [1, 2])
            assert book.pop("p1") is None  # not yet: this step's save is still to come
        sched.update_connector_output(out)
    h = book.pop("p1")
    assert h.saved and not h.loaded and h.save_s == pytest.approx(2.0) and h.save_end > h.save_start


def test_a_one_step_prefill_settles_with_its_save():
    """P's request with max_tokens=1: scheduled, saved and finished in one step (vLLM frees it before it
    hands the connector the step's output)."""
    book = HandoffBook()
    w = kc.ConnectorWrapper(book.add, clock=TickClock())
    sched = w.wrap(PullConnector(KVConnectorRole.SCHEDULER))
    worker = w.wrap(PullConnector(KVConnectorRole.WORKER))
    sched.build_connector_meta(_scheduled(new=["p2"]))
    out = KVConnectorOutput()
    with kc._AttachWorkerStep(contextlib.nullcontext(out), w):
        worker.save_kv_layer("layer.0", None, None)
    sched.request_finished(_request("p2"), [1])
    sched.update_connector_output(out)
    h = book.pop("p2")
    assert h is not None and h.saved and h.save_s == pytest.approx(0.5) and not h.save_pending
    assert not sched_side_holds(w)


def sched_side_holds(w: kc.ConnectorWrapper) -> bool:
    return any(side.records or side.finishing for side in w.schedulers)


def test_a_connector_that_raises_raises_unchanged_and_the_request_shows_a_failed_handoff():
    class Broken(PullConnector):
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            raise ConnectionError("remote KV store unreachable")

        def start_load_kv(self, forward_context, **kwargs):
            raise OSError("no such file")

    book = HandoffBook()
    w = kc.ConnectorWrapper(book.add)
    sched = w.wrap(Broken(KVConnectorRole.SCHEDULER))
    worker = w.wrap(Broken(KVConnectorRole.WORKER))
    with pytest.raises(ConnectionError) as raised:
        sched.get_num_new_matched_tokens(_request("x"), 0)
    # the connector's own exception, raised from its own frame
    assert raised.value.args == ("remote KV store unreachable",)
    assert raised.traceback[-1].name == "get_num_new_matched_tokens"
    with pytest.raises(OSError):
        worker.start_load_kv(None)
    assert not w.guard.errors  # the host's errors are not ours
    h = book.pop("x")
    assert h.failed and h.errors == 1 and h.error_type == "ConnectionError"
    assert w.worker.take().errors == 1


def test_records_cross_the_channel_and_bad_ones_are_refused(tmp_path):
    receiver = kv_channel.HandoffReceiver(str(tmp_path))
    sink = kv_channel.HandoffSink(str(tmp_path), time.monotonic)
    try:
        record = KVHandoff("r1", connector="ExampleConnector", external_tokens=32, load_start=1.0, load_end=1.5,
                           load_s=0.5, failed_blocks=2)
        sink(record)
        sink.sock.sendto(b'{"request_id": 3}', receiver.path)
        sink.sock.sendto(b"not json", receiver.path)
        got: list[KVHandoff] = []
        receiver.drain(got.append)
        assert got == [record]
        assert receiver.malformed == 2
    finally:
        sink.close()
        receiver.close()
    with pytest.raises(ValueError, match="external_tokens"):
        KVHandoff.from_wire({"request_id": "r", "external_tokens": "many"})


def test_the_book_merges_a_requests_records_and_stays_bounded():
    book = HandoffBook(max_records=2)
    book.add(KVHandoff("a", external_tokens=32, load_start=2.0, load_end=3.0, load_s=1.0))
    book.add(KVHandoff("a", save_start=1.0, save_end=4.0, save_s=0.5, errors=1))
    book.add(KVHandoff("b"))
    book.add(KVHandoff("c"))
    assert book.evicted == 1 and "a" not in book.records
    book2 = HandoffBook()
    book2.add(KVHandoff("a", external_tokens=32, load_start=2.0, load_end=3.0, load_s=1.0))
    book2.add(KVHandoff("a", save_start=1.0, save_end=4.0, save_s=0.5, errors=1))
    h = book2.pop("a")
    assert (h.external_tokens, h.load_s, h.save_s, h.errors, h.failed) == (32, 1.0, 0.5, 1, True)


# -- what the request's trace shows -------------------------------------------------------------

def _pipeline():
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"sample_rate": 1.0, "tail_quantile": 0}, environ={})
    return Pipeline(config, tp.get_tracer("t"), MeterProvider().get_meter("t"), "test"), exporter


@pytest.mark.parametrize("failed", [False, True])
def test_the_request_span_carries_the_handoff_and_a_failed_one_is_an_error(failed):
    pipeline, exporter = _pipeline()
    try:
        base_ts = time.monotonic() - 2.0
        t = RequestTimeline("d", time.time() - 2.0, model="m", response_id="d", input_tokens=70)
        assert pipeline.start(t)
        t.events += [(QUEUED, base_ts), (SCHEDULED, base_ts + 0.01)]
        t.token_ts += [base_ts + 0.1, base_ts + 0.11]
        t.handoff = KVHandoff("d", connector="ExampleConnector", external_tokens=64, load_start=base_ts + 0.02,
                              load_end=base_ts + 0.05, load_s=0.03, failed_blocks=2 if failed else 0,
                              errors=0)
        t.finish_reason = "length"
        pipeline.finish("d", RequestSummary(model="m", ttft=0.1, e2e=0.12, queue=0.01, prefill=0.09, decode=0.01,
                                            input_tokens=70, output_tokens=2))
        assert pipeline.flush(10)
        tree = request_trees(list(exporter.get_finished_spans()))["d"]
    finally:
        pipeline.close()
    a = tree.attributes
    assert a[sc.KV_TRANSFER_EXTERNAL_TOKENS] == 64 and a[sc.LATENCY_KV_LOAD] == pytest.approx(0.03)
    assert a[sc.KV_TRANSFER_FAILED] is failed
    (load,) = tree.children[sc.SPAN_KV_TRANSFER]
    assert (load.end_time - load.start_time) / 1e9 == pytest.approx(0.03, abs=1e-6)
    assert load.status.status_code == (StatusCode.ERROR if failed else StatusCode.UNSET)
    if failed:
        assert a[sc.KV_TRANSFER_FAILED_BLOCKS] == 2 and load.attributes[sc.KV_TRANSFER_FAILED_BLOCKS] == 2


@pytest.mark.parametrize("role,exported", [(sc.DISAGG_ROLE_PREFILL, True), (sc.DISAGG_ROLE_BOTH, False), (None, False)])
def test_a_prefill_instance_exports_every_request_for_the_gateway_to_decide(role, exported):
    """At sample rate 0 and no breach, a kv_producer's request is still exported (reason kv_handoff), at
    phase detail; the same request on a kv_both engine or a plain one is not."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config.resolve({"sample_rate": 0.0, "tail_quantile": 0}, environ={})
    pipeline = Pipeline(config, tp.get_tracer("t"), MeterProvider().get_meter("t"), "test")
    try:
        now = time.monotonic() - 1.0
        t = RequestTimeline("p", time.time() - 1.0, model="m", response_id="p", input_tokens=70,
                            request_attributes={sc.DISAGG_ROLE: role} if role else {})
        assert pipeline.start(t)
        t.events += [(QUEUED, now), (SCHEDULED, now + 0.01)]
        t.token_ts.append(now + 0.05)
        t.handoff = KVHandoff("p", connector="ExampleConnector", save_start=now + 0.02, save_end=now + 0.04,
                              save_s=0.02)
        t.finish_reason = "length"
        decision = pipeline.finish("p", RequestSummary(model="m", ttft=0.05, e2e=0.05, queue=0.01, prefill=0.04,
                                                       decode=0.0, input_tokens=70, output_tokens=1))
        assert pipeline.flush(10)
        spans = list(exporter.get_finished_spans())
    finally:
        pipeline.close()
    assert decision.sampled is exported
    if exported:
        tree = request_trees(spans)["p"]
        assert tree.attributes[sc.SAMPLING_REASON] == sc.SAMPLING_REASON_DEFERRED
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_KV_TRANSFER} <= set(tree.children)
        # judged although it met its SLO: the gateway weighs P's verdict in the user request's
        assert sc.SLOW_CAUSE in tree.attributes and sc.SLOW_SECONDS[sc.SLOW_QUEUE_MAX_SEQS] in tree.attributes
    else:
        assert spans == []


def test_a_consumers_no_op_save_calls_are_not_a_save_of_what_it_loaded():
    """A kv_consumer's worker still calls the connector's save methods (they return at once): the request it
    loaded shows its load, no save."""
    book = HandoffBook()
    w = kc.ConnectorWrapper(book.add, clock=TickClock())

    class Consumer(PullConnector):
        _kv_transfer_config = SimpleNamespace(kv_role="kv_consumer")

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 32, False

    sched = w.wrap(Consumer(KVConnectorRole.SCHEDULER))
    worker = w.wrap(Consumer(KVConnectorRole.WORKER))
    sched.get_num_new_matched_tokens(_request("d3"), 0)
    sched.update_state_after_alloc(_request("d3"), None, 32)
    sched.build_connector_meta(_scheduled(new=["d3"]))
    out = KVConnectorOutput()
    with kc._AttachWorkerStep(contextlib.nullcontext(out), w):
        worker.start_load_kv(None)
        worker.save_kv_layer("layer.0", None, None)
        worker.wait_for_save()
    sched.update_connector_output(out)
    h = book.pop("d3")
    assert h.loaded and h.external_tokens == 32
    assert not h.saved


def test_a_frontends_wrapper_stands_aside_in_a_process_vllm_spawned(monkeypatch):
    """Under opentelemetry-instrument a spawned EngineCore runs the auto-instrumentation too, before it has its
    process name: the instrumentor there arms a frontend's wrapper, and the plugin then arms its own. Whatever
    the order they wrap vLLM's factory in, the connector is the plugin's: its records go to the frontend."""
    import multiprocessing

    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    monkeypatch.setattr(multiprocessing.current_process(), "name", "EngineCore")
    sent: list[KVHandoff] = []
    kept_here = HandoffBook()
    built = PullConnector(KVConnectorRole.SCHEDULER)
    monkeypatch.setattr(KVConnectorFactory, "create_connector", staticmethod(lambda *a, **k: built))
    for order in ("frontend first", "plugin first"):
        built.__dict__.pop(kc._WRAPPED_ATTR, None)
        for name in kc.SCHEDULER_METHODS:
            built.__dict__.pop(name, None)
        frontend = kc.ConnectorWrapper(kept_here.add)
        plugin = kc.ConnectorWrapper(sent.append, spawned=True)
        owners = (frontend, plugin) if order == "frontend first" else (plugin, frontend)
        for owner in owners:
            owner.arm()
        try:
            connector = KVConnectorFactory.create_connector(None, KVConnectorRole.SCHEDULER, None)
        finally:
            for owner in reversed(owners):
                owner.disarm()
        assert connector is built
        assert frontend.schedulers == [] and len(plugin.schedulers) == 1, order
        connector.get_num_new_matched_tokens(_request(order), 0)
        connector.update_state_after_alloc(_request(order), None, 64)
        connector.request_finished(_request(order), [1])
        connector.update_connector_output(KVConnectorOutput(finished_recving={order}))
    assert [r.request_id for r in sent] == ["frontend first", "plugin first"]
    assert kept_here.records == {}
