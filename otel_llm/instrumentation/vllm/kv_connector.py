"""The KV hand-off as a phase: vLLM's KV connector, wrapped where vLLM builds it.

``KVConnectorBase_V1`` only declares the hand-off's methods; every connector (Example, NIXL, Mooncake,
LMCache, Multi, ...) overrides them. So the wrapper is put on the concrete instance that
``KVConnectorFactory.create_connector`` returns, as instance attributes over the class's methods. A
``MultiConnector`` builds its children itself (not through the factory): only the outer instance is
wrapped, and its children's work is counted once, inside its calls.

Two roles, in two places:

* **worker side** (where the model runs: a vLLM worker process on the CPU build): the time inside
  ``start_load_kv`` / ``wait_for_layer_load`` (loading) and ``save_kv_layer`` / ``wait_for_save``
  (saving), the blocks ``get_block_ids_with_load_errors`` reports (the engine recomputes them), the
  connector's own ``get_kv_connector_stats``. At the end of each step these ride on the step's
  ``KVConnectorOutput`` (one attribute: it is pickled to the EngineCore with its ``__dict__``).
* **scheduler side** (the EngineCore): which requests load how many external tokens
  (``update_state_after_alloc``), in which step (``build_connector_meta``), when an asynchronous load
  arrived (``update_connector_output``'s ``finished_recving``), which requests finished
  (``request_finished``). It turns each step's worker figures into one ``KVHandoff`` per request and
  hands it to a sink: the frontend's ``HandoffBook`` in-process, else ``kv_channel.HandoffSink``.

Every vLLM symbol read here is a contract entry (contract.py): the wrapper asks the contract once, where a
connector is built, which methods and fields are there, and keeps the fallback-aware readers it hands out.

A connector that raises raises to vLLM exactly as before (the same exception object); the request
shows a failed hand-off, and the host's error is not counted as ours (the owner's ``Guard`` counts only our own).
"""

from __future__ import annotations

import collections
import operator
import time
from typing import Any, Callable, NamedTuple

from ...guard import Guard
from ...core.handoff import KVHandoff
from ..wraps import Target, WrapTable
from . import contract
from .process_roles import in_engine_process, in_worker_process

# The methods wrapped on the concrete connector instance (fenced against KVConnectorBase_V1).
WORKER_METHODS = ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                  "get_block_ids_with_load_errors", "get_kv_connector_stats")
SCHEDULER_METHODS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                     "update_connector_output", "request_finished")
HMA_METHODS = ("request_finished_all_groups",)  # SupportsHMA's (the hybrid KV cache manager): where present
FACTORY_MODULE = "vllm.distributed.kv_transfer.kv_connector.factory"
MIXIN_MODULE = "vllm.v1.worker.kv_connector_model_runner_mixin"
AGGREGATOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.utils"
WORKER_STEP_ATTR = "_otel_llm_kv_step"  # on a KVConnectorOutput: the worker's figures for that step
_WRAPPED_ATTR = "_otel_llm_kv_wrapped"
_LOAD = frozenset(("start_load_kv", "wait_for_layer_load"))
_SAVE = frozenset(("save_kv_layer", "wait_for_save"))
MAX_TRACKED = 4096  # requests held on the scheduler side (bounded: a request vLLM never finishes goes)
MAX_PLANS = 8  # steps scheduled whose output has not come back (vLLM's batch queue keeps two)


class WorkerStep(NamedTuple):
    """One step's connector work on the worker side (engine monotonic seconds)."""
    load_start: float | None
    load_end: float | None
    load_s: float
    save_start: float | None
    save_end: float | None
    save_s: float
    failed_blocks: int
    errors: int
    error_type: str | None
    transfer_s: float | None
    bytes_transferred: int | None


def _none(_obj: Any) -> None:
    return None


class WorkerSide:
    """The worker's accumulators for the step in progress."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 stats_data: Callable[[Any], Any] = operator.attrgetter("data")) -> None:
        self.clock = clock
        self.stats_data = stats_data  # KVConnectorStats.data, through the contract (ConnectorWrapper.wrap)
        self._reset()

    def _reset(self) -> None:
        self.load_start: float | None = None
        self.load_end: float | None = None
        self.load_s = 0.0
        self.save_start: float | None = None
        self.save_end: float | None = None
        self.save_s = 0.0
        self.failed_blocks = 0
        self.errors = 0
        self.error_type: str | None = None
        self.transfer_s: float | None = None
        self.bytes_transferred: int | None = None

    def spent(self, method: str, start: float, end: float) -> None:
        if method in _LOAD:
            if self.load_start is None:
                self.load_start = start
            self.load_end = end
            self.load_s += end - start
        elif method in _SAVE:
            if self.save_start is None:
                self.save_start = start
            self.save_end = end
            self.save_s += end - start

    def raised(self, method: str, exc: BaseException) -> None:
        self.errors += 1
        self.error_type = type(exc).__qualname__

    def returned(self, method: str, result: Any) -> None:
        if method == "get_block_ids_with_load_errors":
            if result:
                self.failed_blocks += len(result)
        elif method == "get_kv_connector_stats" and result is not None:
            self._read_stats(self.stats_data(result))

    def _read_stats(self, data: Any) -> None:
        """The connector's own transfer figures where it keeps them (NIXL: lists per transfer)."""
        if not isinstance(data, dict):
            return
        duration = _total(data.get("transfer_duration"))
        if duration is not None:
            self.transfer_s = (self.transfer_s or 0.0) + duration
        moved = _total(data.get("bytes_transferred"))
        if moved is not None:
            self.bytes_transferred = (self.bytes_transferred or 0) + int(moved)
        failed = _total(data.get("num_failed_transfers"))
        if failed:
            self.errors += int(failed)
            self.error_type = self.error_type or "transfer_failed"

    def take(self) -> WorkerStep:
        step = WorkerStep(self.load_start, self.load_end, self.load_s, self.save_start, self.save_end,
                          self.save_s, self.failed_blocks, self.errors, self.error_type, self.transfer_s,
                          self.bytes_transferred)
        self._reset()
        return step


def merge_worker_steps(steps: list[WorkerStep]) -> WorkerStep:
    """The workers of one step (tensor/pipeline parallel ranks) ran side by side: the step's hand-off took
    as long as the slowest; failures and bytes add up."""
    if len(steps) == 1:
        return steps[0]

    def lo(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return min(present) if present else None

    def hi(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    moved = [s.bytes_transferred for s in steps if s.bytes_transferred is not None]
    return WorkerStep(lo([s.load_start for s in steps]), hi([s.load_end for s in steps]),
                      max(s.load_s for s in steps), lo([s.save_start for s in steps]),
                      hi([s.save_end for s in steps]), max(s.save_s for s in steps),
                      max(s.failed_blocks for s in steps), sum(s.errors for s in steps),
                      next((s.error_type for s in steps if s.error_type), None),
                      hi([s.transfer_s for s in steps]), sum(moved) if moved else None)


def _total(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, (list, tuple)):
        nums = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return float(sum(nums)) if nums else None
    return None


class _Plan(NamedTuple):
    """A scheduled step, as the scheduler-side connector saw it built."""
    loading: tuple[str, ...]  # requests whose external KV loads in this step's forward (sync connectors)
    prefilling: tuple[str, ...]  # requests computing prompt tokens in it (what a producer saves)


class SchedulerSide:
    """The scheduler's per-request hand-off records, settled into ``sink`` as each completes."""

    def __init__(self, connector: str, sink: Callable[[KVHandoff], None],
                 clock: Callable[[], float] = time.monotonic,
                 finished_recving: Callable[[Any], Any] = operator.attrgetter("finished_recving"),
                 failed_recving: Callable[[Any], Any] = operator.attrgetter("failed_recving")) -> None:
        self.connector = connector
        # KVConnectorOutput's fields, through the contract (ConnectorWrapper.wrap): _none where missing
        self.finished_recving = finished_recving
        self.failed_recving = failed_recving
        self.sink = sink
        self.clock = clock
        self.records: dict[str, KVHandoff] = {}
        self.committed: list[str] = []  # sync loads allocated since the last build_connector_meta
        self.plans: collections.deque[_Plan] = collections.deque()
        # (request, blocks held for an asynchronous send): request_finished came, settled after this step's
        # output (its save) is in
        self.finishing: list[tuple[str, bool]] = []
        self.evicted = 0

    def _record(self, request_id: str) -> KVHandoff:
        record = self.records.get(request_id)
        if record is None:
            if len(self.records) >= MAX_TRACKED:
                self.records.pop(next(iter(self.records)))
                self.evicted += 1
            record = self.records[request_id] = KVHandoff(request_id, connector=self.connector)
        return record

    def before(self, method: str, args: tuple, kwargs: dict) -> None:
        if method == "update_connector_output":
            output = args[0] if args else kwargs.get("connector_output")
            self._step_done(output)

    def returned(self, method: str, args: tuple, kwargs: dict, result: Any) -> None:
        if method == "get_num_new_matched_tokens":
            request = args[0] if args else kwargs["request"]
            count, load_async = result
            if count:
                self._record(request.request_id).load_async = bool(load_async)
        elif method == "update_state_after_alloc":
            request = args[0] if args else kwargs["request"]
            n = args[2] if len(args) > 2 else kwargs.get("num_external_tokens", 0)
            if n:
                record = self._record(request.request_id)
                record.external_tokens = max(record.external_tokens, int(n))
                if record.load_async:  # it waits (WAITING_FOR_REMOTE_KVS) until the load arrives
                    record.load_start = self.clock()
                else:
                    self.committed.append(request.request_id)
        elif method == "build_connector_meta":
            out = args[0] if args else kwargs["scheduler_output"]
            self._plan(out)
        elif method in ("request_finished", "request_finished_all_groups"):
            request = args[0] if args else kwargs["request"]
            delay_free = bool(result[0]) if isinstance(result, tuple) and result else False
            # settled after this step's output: a one-step request (P's max_tokens=1) has no record yet
            self.finishing.append((request.request_id, delay_free))

    def raised(self, method: str, args: tuple, kwargs: dict, exc: BaseException) -> None:
        """The connector raised: the request it was called for shows a failed hand-off, settled now
        (vLLM's engine may not survive the error to finish it)."""
        request = args[0] if args else kwargs.get("request")
        rid = getattr(request, "request_id", None)
        if not isinstance(rid, str):
            return
        record = self._record(rid)
        record.errors += 1
        record.error_type = type(exc).__qualname__
        self._settle(rid)

    def _plan(self, out: Any) -> None:
        prefilling = [r.req_id for r in out.scheduled_new_reqs]
        cached = out.scheduled_cached_reqs
        for rid, outputs in zip(cached.req_ids, cached.num_output_tokens):
            if not outputs:
                prefilling.append(rid)
        if len(self.plans) >= MAX_PLANS:  # outputs that never came back (an engine error): don't grow
            self.plans.popleft()
        # only a connector that saves has saves to attribute: a consumer's worker still calls its (no-op)
        # save_kv_layer, which must not become a save of the requests it loaded
        self.plans.append(_Plan(tuple(self.committed), tuple(prefilling) if self._saves else ()))
        self.committed = []

    _saves = False  # set by the wrapper for a connector that saves (kv_producer, kv_both)

    def _step_done(self, output: Any) -> None:
        plan = self.plans.popleft() if self.plans else _Plan((), ())
        step: WorkerStep | None = getattr(output, WORKER_STEP_ATTR, None)
        now = self.clock()
        if step is not None:
            for rid in plan.loading:
                record = self._record(rid)
                record.load_start = step.load_start if step.load_start is not None else now
                record.load_end = step.load_end if step.load_end is not None else now
                record.load_s += step.load_s
                record.failed_blocks += step.failed_blocks
                self._worker_facts(record, step)
            if step.save_start is not None:
                for rid in plan.prefilling:
                    record = self._record(rid)
                    if record.save_start is None:
                        record.save_start = step.save_start
                    record.save_end = step.save_end
                    record.save_s += step.save_s
                    if not plan.loading:
                        self._worker_facts(record, step)
        elif plan.loading:  # no worker figures (the worker's hook is off): the load is known, not timed
            for rid in plan.loading:
                self._record(rid)
        recv = (self.finished_recving(output) or ()) if output is not None else ()
        for rid in recv:  # an asynchronous load arrived: its wait ends now
            record = self.records.get(rid)
            if record is not None and record.load_start is not None and record.load_end is None:
                record.load_end = now
                record.load_s += now - record.load_start
        for rid in (self.failed_recving(output) or ()) if output is not None else ():
            record = self.records.get(rid)
            if record is not None:
                record.failed_recv = True
        # a loaded request is complete once its load is (its first token leaves after this call)
        for rid in plan.loading:
            self._settle(rid)
        for rid in recv:
            if rid in self.records:
                self._settle(rid)
        finishing, self.finishing = self.finishing, []
        for rid, delay_free in finishing:
            record = self.records.get(rid)
            if record is not None:
                record.save_pending = delay_free
                self._settle(rid)

    @staticmethod
    def _worker_facts(record: KVHandoff, step: WorkerStep) -> None:
        record.errors += step.errors
        if step.error_type:
            record.error_type = step.error_type
        if step.transfer_s is not None:
            record.transfer_s = (record.transfer_s or 0.0) + step.transfer_s
        if step.bytes_transferred is not None:
            record.bytes_transferred = (record.bytes_transferred or 0) + step.bytes_transferred

    def _settle(self, rid: str) -> None:
        record = self.records.pop(rid, None)
        if record is not None:
            self.sink(record)


class ConnectorWrapper:
    """Wraps connector instances for one owner (the instrumentor in-process, the plugin elsewhere).

    ``sink``: where the scheduler side's records go. The worker side needs none: its figures ride on
    the step's output (see ``attach_worker_step``). ``spawned``: the plugin's wrapper, in a process vLLM
    spawned (EngineCore, worker).

    A frontend's wrapper stands aside in a process vLLM spawned: under ``opentelemetry-instrument`` the
    spawned EngineCore runs the auto-instrumentation too (the inherited ``PYTHONPATH`` brings
    ``sitecustomize``), before multiprocessing has given the process its name, so an instrumentor there
    takes itself for a frontend and arms a wrapper whose records would stay in that process. Whether
    the process is a spawned one is asked when vLLM builds the connector (its name is set by then)."""

    def __init__(self, sink: Callable[[KVHandoff], None] | None,
                 clock: Callable[[], float] = time.monotonic, spawned: bool = False,
                 fence: contract.Contract | None = None, guard: Guard | None = None) -> None:
        self.sink = sink
        self.clock = clock
        self.spawned = spawned
        # the owner's (the instrumentor's, or the plugin's EngineSide): our errors here are counted there
        self.guard = guard = guard if guard is not None else Guard()
        self.fence = fence or contract.Contract(guard=guard)
        self.reads: _Reads | None = None  # vLLM's symbols through the contract, resolved at the first connector
        self.worker: WorkerSide | None = None  # the worker-side connector of this process, once built
        self.schedulers: list[SchedulerSide] = []
        self._table = WrapTable([
            Target(FACTORY_MODULE, "KVConnectorFactory.create_connector", self.create_connector),
            Target(MIXIN_MODULE, "KVConnectorModelRunnerMixin._get_kv_connector_output",
                   self.kv_connector_output),
            Target(AGGREGATOR_MODULE, "KVOutputAggregator.aggregate", self.aggregate),
        ], guard)

    def arm(self) -> None:
        self._table.wrap()

    def disarm(self) -> None:
        self._table.unwrap()
        self.sink = None

    # -- where vLLM builds the connector --------------------------------------------------------

    def stands_aside(self) -> bool:
        """A frontend's wrapper in a process vLLM spawned: the plugin's wrapper there is the one that reports."""
        return not self.spawned and (in_engine_process() or in_worker_process())

    def create_connector(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        connector = wrapped(*args, **kwargs)
        try:
            if self.stands_aside():
                return connector
            self.wrap(connector)
        except Exception as exc:
            self.guard.failed("kv connector wrap", exc)
        return connector

    def wrap(self, connector: Any) -> Any:
        """Wrap one concrete connector instance for its role (once: a second call changes nothing)."""
        if getattr(connector, _WRAPPED_ATTR, False):
            return connector
        reads = self.resolve()
        if not reads.role:
            return connector  # the contract has said which feature is off
        role = connector.role.name
        name = type(connector).__name__
        if role == "WORKER":
            side: Any = WorkerSide(self.clock, reads.stats_data)
            self.worker = side
            methods = reads.worker_methods
        else:
            sink = self.sink
            if sink is None:
                return connector
            side = SchedulerSide(name, lambda record: self._deliver(sink, record), self.clock,
                                 reads.finished_recving, reads.failed_recving)
            config = reads.transfer_config(connector)
            kv_role = config.kv_role if config is not None and reads.kv_role else None
            side._saves = kv_role in ("kv_producer", "kv_both") or kv_role is None
            self.schedulers.append(side)
            methods = reads.scheduler_methods
        for method in methods:
            bound = getattr(connector, method, None)
            if bound is None:
                continue
            setattr(connector, method, self._wrapper(side, method, bound, role == "WORKER"))
        setattr(connector, _WRAPPED_ATTR, True)
        return connector

    def resolve(self) -> "_Reads":
        """The contract's answers for the connector's symbols, once (vLLM's connector modules are imported
        when the first connector is built, and the wrapper asks then)."""
        reads = self.reads
        if reads is None:
            f = self.fence
            reader = f.reader
            base = "KVConnectorBase_V1."
            worker = tuple(m for m in WORKER_METHODS if f.present(base + m))
            scheduler = tuple(m for m in SCHEDULER_METHODS if f.present(base + m))
            hma = tuple(m for m in HMA_METHODS if f.present("SupportsHMA." + m))
            reads = self.reads = _Reads(
                role=f.present(base + "role", "KVConnectorRole.WORKER"),
                worker_methods=worker, scheduler_methods=scheduler + hma,
                transfer_config=reader(base + "_kv_transfer_config"),
                kv_role=f.present("KVTransferConfig.kv_role"),
                stats_data=operator.attrgetter("data") if f.present("KVConnectorStats.data") else _none,
                finished_recving=(operator.attrgetter("finished_recving")
                                  if f.present("KVConnectorOutput.finished_recving") else _none),
                failed_recving=reader("KVConnectorOutput.failed_recving"),
                kv_output=f.present("ModelRunnerOutput.kv_connector_output"))
        return reads

    def _deliver(self, sink: Callable[[KVHandoff], None], record: KVHandoff) -> None:
        try:
            sink(record)
        except Exception as exc:
            self.guard.failed("kv hand-off record", exc)

    def _wrapper(self, side: Any, method: str, bound: Callable[..., Any], worker: bool) -> Callable[..., Any]:
        clock, guard = self.clock, self.guard
        if worker:
            def call(*args: Any, **kwargs: Any) -> Any:
                start = clock()
                try:
                    result = bound(*args, **kwargs)
                except BaseException as exc:
                    try:
                        side.spent(method, start, clock())
                        side.raised(method, exc)
                    except Exception as ours:
                        guard.failed("kv connector (worker)", ours)
                    raise
                try:
                    side.spent(method, start, clock())
                    side.returned(method, result)
                except Exception as ours:
                    guard.failed("kv connector (worker)", ours)
                return result
        else:
            def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    side.before(method, args, kwargs)
                except Exception as ours:
                    guard.failed("kv connector (scheduler)", ours)
                try:
                    result = bound(*args, **kwargs)
                except BaseException as exc:
                    try:
                        side.raised(method, args, kwargs, exc)
                    except Exception as ours:
                        guard.failed("kv connector (scheduler)", ours)
                    raise
                try:
                    side.returned(method, args, kwargs, result)
                except Exception as ours:
                    guard.failed("kv connector (scheduler)", ours)
                return result
        call.__wrapped__ = bound  # type: ignore[attr-defined]
        call.__name__ = method
        return call

    # -- where a step's worker figures leave the worker -------------------------------------------

    def kv_connector_output(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if self.worker is None:  # no worker-side connector wrapped by this owner: nothing to attach
            return wrapped(*args, **kwargs)
        return _AttachWorkerStep(wrapped(*args, **kwargs), self)

    def aggregate(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """vLLM's executor merges the workers' connector outputs into a new one (with one worker too):
        the workers' figures are merged onto it."""
        if self.stands_aside():
            return wrapped(*args, **kwargs)
        figures: list[WorkerStep] = []
        try:
            if self.resolve().kv_output:
                outputs = args[0] if args else kwargs.get("outputs") or ()
                for out in outputs:  # a worker that returned nothing this step: None
                    kv = out.kv_connector_output if out is not None else None
                    step = getattr(kv, WORKER_STEP_ATTR, None)  # ours, or None
                    if step is not None:
                        figures.append(step)
        except Exception as exc:
            self.guard.failed("kv connector (aggregate)", exc)
        result = wrapped(*args, **kwargs)
        if figures:
            try:
                kv = result.kv_connector_output if result is not None else None
                if kv is not None:
                    setattr(kv, WORKER_STEP_ATTR, merge_worker_steps(figures))
            except Exception as exc:
                self.guard.failed("kv connector (aggregate)", exc)
        return result

    def attach_worker_step(self, output: Any) -> None:
        worker = self.worker
        if worker is not None and output is not None:
            setattr(output, WORKER_STEP_ATTR, worker.take())


class _Reads(NamedTuple):
    """What the contract has of the connector's symbols (``ConnectorWrapper.resolve``)."""
    role: bool  # KVConnectorBase_V1.role and KVConnectorRole.WORKER: without them nothing is wrapped
    worker_methods: tuple[str, ...]
    scheduler_methods: tuple[str, ...]
    transfer_config: Callable[[Any], Any]  # KVConnectorBase_V1._kv_transfer_config (None where missing)
    kv_role: bool
    stats_data: Callable[[Any], Any]
    finished_recving: Callable[[Any], Any]
    failed_recving: Callable[[Any], Any]
    kv_output: bool  # ModelRunnerOutput.kv_connector_output


class _AttachWorkerStep:
    """vLLM's context manager around a step's connector work, unchanged, but on its way out (after
    the loads, the forward and ``wait_for_save``) the step's worker figures go on its output."""

    __slots__ = ("inner", "owner", "output")

    def __init__(self, inner: Any, owner: ConnectorWrapper) -> None:
        self.inner = inner
        self.owner = owner
        self.output: Any = None

    def __enter__(self) -> Any:
        self.output = self.inner.__enter__()
        return self.output

    def __exit__(self, *exc_info: Any) -> Any:
        suppress = self.inner.__exit__(*exc_info)
        try:
            self.owner.attach_worker_step(self.output)
        except Exception as ours:
            self.owner.guard.failed("kv connector (worker step)", ours)
        return suppress
