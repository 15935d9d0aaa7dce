"""Per-step diagnosis on the frontend's cold path: anatomy and roofline as span attributes and metrics.

The EngineCore only stamps (instrumentation/vllm/step_hooks.py); everything here runs on the materializer thread,
for steps in batches. What each part means:

* schedule: inside the scheduler (EngineCore process, CPU);
* execute: from the scheduler's return to ``update_from_output``: the executor's work for the
  step (forward, sampling, and with the multiprocess executor the round trip to the workers);
* model: forward + sampling timed around the model runner, where it runs in the EngineCore process
  (CUDA events on a GPU, wall time on CPU); absent with the multiprocess executor;
* output: ``update_from_output`` up to the outputs' timestamp (the step's end);
* idle (before the step): since the previous step's end, while no step was in flight;
* grammar bitmask (structured outputs): the EngineCore's ``Scheduler.get_grammar_bitmask``, inside execute
  (vLLM computes it while the model runs; the workers apply it when sampling), where the step had one.

schedule + execute + output is the step's duration by construction (four stamps, one clock).
The roofline takes model time as the measured time where present, else execute time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any, Callable, Sequence

from ... import semconv as sc
from ...guard import Guard
from ..metrics import SPEC_POSITION_TOKENS, STEP_DURATION, STEP_MBU, STEP_MFU, STEP_TIME_BUCKETS, STEPS, create
from ..sdk_metrics import bind_counts, bind_value, fast_path
from ..inter_token import sorted_gap_summary
from ..timeline import StepRecord
from .devices import resolve
from .roofline import DevicePeaks, ModelShape, Roofline, StepCost, decode_step_cost, roofline, step_cost

def anatomy(step: StepRecord) -> dict[str, float]:
    """The step's parts in seconds (only those the engine reported), and its total."""
    out = {"total": step.end - step.start}
    for part, value in (("schedule", step.schedule_s), ("execute", step.execute_s), ("model", step.model_s),
                        ("output", step.output_s), ("idle", step.idle_s)):
        if value is not None:
            out[part] = value
    return out


# ``anatomy``'s parts in its order, with the StepRecord field each is read from ("total": end - start)
_PARTS = (("total", ""), ("schedule", "schedule_s"), ("execute", "execute_s"), ("model", "model_s"),
          ("output", "output_s"), ("idle", "idle_s"))
_PART_GETTERS = tuple((part, attrgetter(attr)) for part, attr in _PARTS if attr)  # each field but total's
_INF = float("inf")
_UNSEEN: Any = object()


def work(step: StepRecord) -> list[tuple[int, int]]:
    """(tokens, context before the step) per request in the step, for the roofline."""
    contexts = step.contexts
    if contexts is None or len(contexts) != len(step.ids):
        return []
    tokens = step.tokens
    return list(zip(tokens if tokens is not None else repeat(1, len(contexts)), contexts))


def cost(shape: ModelShape, step: StepRecord) -> StepCost | None:
    """The step's FLOPs and bytes (``step_cost`` of its ``work``; a plain decode batch without a loop)."""
    contexts = step.contexts
    if not contexts or len(contexts) != len(step.ids):
        return None
    if step.tokens is None:
        return decode_step_cost(shape, contexts)
    spec = step.spec
    return step_cost(shape, work(step), spec.draft_tokens if spec is not None else 0)


@dataclass(frozen=True)
class EngineFacts:
    """What the step diagnosis needs of an engine, read by its adapter when the engine is built: the roofline's
    model shape, whether it runs on an NVIDIA GPU and how many devices one step spans, its LoRA slots (the
    LoRA-slot verdict) and its KV cache's format (``kv_cache_facts``). The instrumentor keeps the last engine's,
    so instrumenting again (new options) re-arms the diagnosis for an engine built earlier; an agent process
    gets it as a declared record (agent/control.py: ``EngineRecord``)."""

    model: ModelShape | None
    on_cuda: bool
    devices: int = 1
    max_loras: int | None = None
    kv_cache: dict[str, Any] = field(default_factory=dict)


def kv_cache_facts(cache_dtype: Any, block_size: Any, model_dtype: Any = None) -> dict[str, Any]:
    """The KV cache's element type and block size as step-span attributes (``auto``: the model's dtype)."""
    out: dict[str, Any] = {}
    if cache_dtype in (None, "auto"):
        cache_dtype = str(model_dtype).rsplit(".", 1)[-1] if model_dtype is not None else None
    if cache_dtype is not None:
        out[sc.STEP_KV_CACHE_DTYPE] = str(cache_dtype)
    if isinstance(block_size, int) and block_size > 0:
        out[sc.STEP_KV_CACHE_BLOCK_SIZE] = block_size
    return out


def measured_time(step: StepRecord) -> float | None:
    return step.model_s if step.model_s is not None else step.execute_s


class StepDiagnosis:
    """Model shape and device peaks (set when the engine is built), the GPU sampler, and the step
    instruments; ``attributes`` for a step span, ``record`` for every step's metrics."""

    def __init__(self, meter: Any | None = None, guard: Guard | None = None) -> None:
        self.guard = guard  # its owner's (the pipeline's), handed to the GPU sampler
        self.shape: ModelShape | None = None
        self.peaks: DevicePeaks | None = None
        self.sampler: Any = None  # GpuSampler
        self.kv_cache: dict[str, Any] = {}  # the KV cache's dtype and block size, for step spans (the adapter sets)
        self._meter = meter
        self._bound: dict[tuple, Any] = {}
        if meter is not None:
            self._duration = create(meter, STEP_DURATION)
            self._mfu = create(meter, STEP_MFU)
            self._mbu = create(meter, STEP_MBU)
            self._steps = create(meter, STEPS)
            self._positions = create(meter, SPEC_POSITION_TOKENS)
        # (instrument, phase, part, bound, adapter) -> a recorder bound to that label set: a step's metrics are
        # six calls, each through the SDK's public API several times what the step's bookkeeping costs
        self._recorders: dict[tuple, Any] = {}
        # (phase, part, adapter) -> bucket-counts recorder, False: none
        self._counts: dict[tuple[str, str, str | None], Any] = {}

    def configure(self, shape: ModelShape | None, peaks: DevicePeaks | None) -> None:
        self.shape, self.peaks = shape, peaks

    def setup(self, shape: ModelShape | None, config: Any, on_gpu: bool, devices: int = 1) -> None:
        """An engine was built: its model, whether it runs on an NVIDIA GPU (then NVML is tried once;
        ``config.gpu_sample_hz``), and how many devices share a step (tensor x pipeline parallel).
        Peaks: ``config.peak_*`` options, else the table row for ``config.device`` or NVML's name."""
        if on_gpu and self.sampler is None and config.gpu_sample_hz > 0:
            from .gpu import GpuSampler
            self.sampler = GpuSampler.start(config.gpu_sample_hz, guard=self.guard)
            if self.sampler is not None and self._meter is not None:
                self.sampler.register_metrics(self._meter)
        name = config.device or (self.sampler.device_name if self.sampler is not None else None)
        peaks = resolve(name, config.peak_flops, config.peak_memory_bandwidth)
        self.configure(shape, peaks.times(devices) if peaks is not None else None)

    def roofline(self, step: StepRecord) -> Roofline | None:
        shape, peaks = self.shape, self.peaks
        if shape is None or peaks is None:
            return None
        c = cost(shape, step)
        if c is None:
            return None
        return roofline(c, peaks, measured_time(step))

    def attributes(self, step: StepRecord) -> dict[str, Any]:
        """Anatomy, roofline and the nearest GPU sample, for the step's span."""
        out: dict[str, Any] = dict(self.kv_cache)
        for key, value in ((sc.STEP_SCHEDULE_TIME, step.schedule_s), (sc.STEP_EXECUTE_TIME, step.execute_s),
                           (sc.STEP_MODEL_TIME, step.model_s), (sc.STEP_OUTPUT_TIME, step.output_s),
                           (sc.STEP_IDLE_BEFORE, step.idle_s)):
            if value is not None:
                out[key] = value
        grammar = step.grammar
        if grammar is not None and grammar.seconds is not None:  # structured outputs: the grammar bitmask
            out[sc.STEP_GRAMMAR_TIME] = grammar.seconds
            out[sc.STEP_GRAMMAR_REQUESTS] = grammar.requests
        shape = self.shape
        c = cost(shape, step) if shape is not None else None
        if c is not None:
            out[sc.STEP_FLOPS] = c.flops
            out[sc.STEP_BYTES] = c.bytes
            out[sc.STEP_INTENSITY] = c.intensity
            if self.peaks is not None:
                r = roofline(c, self.peaks, measured_time(step))
                out[sc.STEP_BOUND] = r.bound
                out[sc.STEP_PREDICTED_TIME] = r.predicted_s
                out[sc.STEP_DEVICE] = self.peaks.name
                if r.mfu is not None:
                    out[sc.STEP_MFU] = r.mfu
                    out[sc.STEP_MBU] = r.mbu
        sampler = self.sampler
        if sampler is not None:
            samples = sampler.nearest((step.start + step.end) / 2)
            if samples:
                out.update(samples[0].attributes())
        return out

    def record(self, steps: Sequence[StepRecord],
               adapter: Callable[[StepRecord], str | None] | None = None) -> None:
        """Metrics of a batch of steps: time by part and phase, bound, MFU and MBU, and by ``adapter(step)``,
        the step's bounded LoRA adapter label (None: no label; core/lora.py ``AdapterStepMetrics.step_label``).
        The durations of the batch go to each (phase, part, adapter) series as bucket counts in one call
        (``_add_durations``), the step counts as one add per (phase, bound, adapter): a handful of calls a
        batch, not six a step."""
        if self._meter is None:
            return
        rec = self._recorder
        groups: dict[tuple[str, str | None], list[StepRecord]] = {}  # (phase, adapter) -> its steps, in order
        labels: dict[tuple[int, ...], str | None] = {}  # a batch's steps mostly repeat their adapter sets
        for step in steps:
            loras = step.loras
            if loras and adapter is not None:
                lora = labels.get(loras, _UNSEEN)
                if lora is _UNSEEN:
                    lora = labels[loras] = adapter(step)
            else:
                lora = None
            key = (step.phase, lora)
            group = groups.get(key)
            if group is None:
                groups[key] = [step]
            else:
                group.append(step)
        counted: dict[tuple[str, str, str | None], int] = {}
        for (phase, lora), group in groups.items():
            # each part's values of the group's steps, in step order (a part a step lacks: not counted)
            got = [step.end - step.start for step in group]
            self._add_durations(phase, _PARTS[0][0], got, lora)
            for part, of in _PART_GETTERS:
                got = [v for v in map(of, group) if v is not None]
                if got:
                    self._add_durations(phase, part, got, lora)
            if self.shape is None or self.peaks is None:  # no roofline: every step's bound unknown
                unknown = (phase, "unknown", lora)
                counted[unknown] = counted.get(unknown, 0) + len(group)
                continue
            for step in group:
                r = self.roofline(step)
                bound = r.bound if r is not None else "unknown"
                counted[phase, bound, lora] = counted.get((phase, bound, lora), 0) + 1
                if r is not None and r.mfu is not None:
                    rec(self._mfu, phase, None, bound, lora)(r.mfu, None)
                    rec(self._mbu, phase, None, bound, lora)(r.mbu, None)
        for (phase, bound, lora), n in counted.items():
            rec(self._steps, phase, None, bound, lora)(n, None)
        self._record_positions(steps)

    def _record_positions(self, steps: Sequence[StepRecord]) -> None:
        """Speculative drafts and acceptances by draft position, summed over the batch: one add per
        (position, kind); nothing for a batch without drafts."""
        drafted: list[int] = []
        accepted: list[int] = []
        for step in steps:
            spec = step.spec
            if spec is None:
                continue
            d, a = spec.per_position()
            if len(d) > len(drafted):
                drafted.extend([0] * (len(d) - len(drafted)))
                accepted.extend([0] * (len(d) - len(accepted)))
            for i, (x, y) in enumerate(zip(d, a)):
                drafted[i] += x
                accepted[i] += y
        for i, (x, y) in enumerate(zip(drafted, accepted)):
            for kind, n in (("drafted", x), ("accepted", y)):
                key = (SPEC_POSITION_TOKENS.name, i, kind)
                record = self._recorders.get(key)
                if record is None:
                    record = self._recorders[key] = bind_value(
                        self._positions, {sc.SPEC_POSITION: i, sc.SPEC_TOKEN_KIND: kind})
                record(n, None)

    def _add_durations(self, phase: str, part: str, values: list[float], lora: str | None = None) -> None:
        """Values of one (phase, part, adapter) series: bucket counts, sum, min and max added to the SDK's
        aggregation at once where the recorder can (exactly what recording each would give), else
        one record each (another metrics SDK, a view, a value the SDK refuses: negative, NaN)."""
        key = (phase, part, lora)
        counts_of = self._counts.get(key)
        if counts_of is None:
            counts_of = bind_counts(self._duration, self._attrs(phase, part, None, lora), STEP_TIME_BUCKETS)
            self._counts[key] = counts_of = counts_of if fast_path(counts_of) else False
        if counts_of is False or not all(0 <= v < _INF for v in values):
            record = self._recorder(self._duration, phase, part, None, lora)
            for v in values:
                record(v, None)
            return
        total = 0.0
        for v in values:  # in order, as the SDK's aggregation adds them one by one
            total += v
        # the inter-token histogram's bucketing of sorted values (the SDK's buckets: (b[i-1], b[i]])
        s = sorted_gap_summary(sorted(values), total, STEP_TIME_BUCKETS)
        counts_of(s.counts, s.total, s.lo, s.hi)

    def _recorder(self, instrument: Any, phase: str, part: str | None, bound: str | None = None,
                  lora: str | None = None) -> Any:
        key = (id(instrument), phase, part, bound, lora)
        found = self._recorders.get(key)
        if found is None:
            found = self._recorders[key] = bind_value(instrument, self._attrs(phase, part, bound, lora))
        return found

    def _attrs(self, phase: str, part: str | None, bound: str | None = None,
               lora: str | None = None) -> dict[str, str]:
        """A label set (bounded: phases, parts, bounds and the adapter labels' cap + 2 values)."""
        key = (phase, part, bound, lora)
        found = self._bound.get(key)
        if found is None:
            found = {sc.STEP_PHASE: phase}
            if part is not None:
                found[sc.STEP_PART] = part
            if bound is not None:
                found[sc.STEP_BOUND] = bound
            if lora is not None:
                found[sc.LORA_NAME] = lora
            self._bound[key] = found
        return found

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None
