"""GPU telemetry from NVML (``nvidia-ml-py``, the ``gpu`` extra), sampled on a thread at a bounded rate.

NVML reads device-wide counters, so the sampler runs in the process that holds our meter and
builds the step spans (the frontend), on the same host as the engine's GPUs; vLLM's EngineCore
and workers pay nothing for it. Samples are stamped with ``time.monotonic()`` (system-wide on
Linux, the engine's clock) and kept in a bounded ring, so a step span finds the sample nearest
its middle when it is built, however late. Where NVML does not initialise (no driver, no
package, a CPU engine): no sampler, no thread, no error.
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ... import semconv as sc
from ...guard import Guard

logger = logging.getLogger("otel_llm")

# nvmlClocksEventReasons / nvmlClocksThrottleReasons bits (nvml.h); GpuIdle (0x1) is not a slowdown
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"), (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_names(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit)


@dataclass(frozen=True, slots=True)
class GpuSample:
    ts: float  # monotonic seconds
    index: int
    utilization: float | None  # 0..1
    memory_utilization: float | None
    memory_used: int | None  # bytes
    memory_total: int | None
    power_w: float | None
    sm_clock_mhz: float | None
    throttle: int | None  # reasons bitmask

    def attributes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.utilization is not None:
            out[sc.STEP_GPU_UTILIZATION] = self.utilization
        if self.memory_used is not None:
            out[sc.STEP_GPU_MEMORY] = self.memory_used
        if self.power_w is not None:
            out[sc.STEP_GPU_POWER] = self.power_w
        if self.sm_clock_mhz is not None:
            out[sc.STEP_GPU_SM_CLOCK] = self.sm_clock_mhz
        if self.throttle is not None:
            out[sc.STEP_GPU_THROTTLE] = list(throttle_names(self.throttle))
        return out


def _load_nvml() -> Any:
    import pynvml  # nvidia-ml-py
    return pynvml


class GpuSampler:
    """One NVML reading per device every ``1/hz`` seconds, kept ``keep_s`` seconds."""

    def __init__(self, nvml: Any, hz: float = 10.0, devices: list[int] | None = None, keep_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic, guard: Guard | None = None) -> None:
        self.nvml = nvml
        self.guard = guard if guard is not None else Guard()  # its owner's (the pipeline's), else its own
        self.hz = hz
        self.clock = clock
        count = nvml.nvmlDeviceGetCount()
        indices = [i for i in (devices if devices is not None else range(count)) if 0 <= i < count]
        self.handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        self.names = {i: _text(_try(nvml.nvmlDeviceGetName, h)) or f"gpu{i}" for i, h in self.handles}
        self.ids = {i: _text(_try(nvml.nvmlDeviceGetUUID, h)) or f"gpu{i}" for i, h in self.handles}
        maxlen = max(16, int(keep_s * hz))
        self._ts: collections.deque[float] = collections.deque(maxlen=maxlen)
        self._samples: collections.deque[tuple[GpuSample, ...]] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0
        self._throttle = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    @classmethod
    def start(cls, hz: float, nvml: Any = None, devices: list[int] | None = None,
              guard: Guard | None = None) -> "GpuSampler | None":
        """A running sampler, or None (and no thread) where NVML is absent or does not initialise."""
        if hz <= 0:
            return None
        guard = guard if guard is not None else Guard()
        try:
            nvml = nvml if nvml is not None else _load_nvml()
            nvml.nvmlInit()
        except Exception as exc:  # no package, no driver, no device: the normal case off NVIDIA GPUs
            logger.debug("otel-llm: no GPU telemetry (%s)", exc)
            return None
        try:
            sampler = cls(nvml, hz, devices if devices is not None else visible_devices(), guard=guard)
            if not sampler.handles:
                nvml.nvmlShutdown()
                return None
            sampler.sample_once()
        except Exception as exc:
            guard.failed("gpu sampler", exc)
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass
            return None
        sampler._thread = threading.Thread(target=sampler._run, name="otel-llm-gpu", daemon=True)
        sampler._thread.start()
        return sampler

    @property
    def device_name(self) -> str | None:
        return self.names[self.handles[0][0]] if self.handles else None

    def sample_once(self) -> tuple[GpuSample, ...]:
        nvml = self.nvml
        now = self.clock()
        out = []
        for i, h in self.handles:
            util = _try(nvml.nvmlDeviceGetUtilizationRates, h)
            mem = _try(nvml.nvmlDeviceGetMemoryInfo, h)
            power = _try(nvml.nvmlDeviceGetPowerUsage, h)
            clock = _try(nvml.nvmlDeviceGetClockInfo, h, getattr(nvml, "NVML_CLOCK_SM", 1))
            throttle = _try(self._throttle, h) if self._throttle is not None else None
            out.append(GpuSample(
                now, i,
                util.gpu / 100.0 if util is not None else None,
                util.memory / 100.0 if util is not None else None,
                int(mem.used) if mem is not None else None,
                int(mem.total) if mem is not None else None,
                power / 1000.0 if power is not None else None,  # mW
                float(clock) if clock is not None else None,
                int(throttle) if throttle is not None else None))
        samples = tuple(out)
        with self._lock:
            self._ts.append(now)
            self._samples.append(samples)
        return samples

    def latest(self) -> tuple[GpuSample, ...]:
        with self._lock:
            return self._samples[-1] if self._samples else ()

    def nearest(self, ts: float) -> tuple[GpuSample, ...]:
        """The devices' sample taken nearest ``ts`` (monotonic seconds); () when none is held."""
        with self._lock:
            stamps = self._ts
            if not stamps:
                return ()
            i = bisect.bisect_left(stamps, ts)
            if i == len(stamps) or (i > 0 and ts - stamps[i - 1] <= stamps[i] - ts):
                i -= 1
            return self._samples[i]

    def _run(self) -> None:
        period = 1.0 / self.hz
        while not self._stop.wait(period):
            try:
                self.sample_once()
            except Exception as exc:
                self.errors += 1
                self.guard.failed("gpu sample", exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass

    def register_metrics(self, meter: Any) -> None:
        """Observable instruments of ``GPU_METRICS`` read from the latest sample at each collection."""
        from .. import metrics as m  # here: the sampler itself needs no OpenTelemetry (scripts/device)

        def attrs(s: GpuSample) -> dict[str, Any]:
            return {sc.HW_ID: self.ids[s.index], sc.HW_NAME: self.names[s.index], sc.HW_TYPE: "gpu",
                    sc.HW_VENDOR: "NVIDIA"}

        def gauge(spec: Any, value: Callable[[GpuSample], float | None]) -> None:

            def callback(_options: Any) -> list[Any]:
                from opentelemetry.metrics import Observation
                out = []
                for s in self.latest():
                    v = value(s)
                    if v is not None:
                        out.append(Observation(v, attrs(s)))
                return out
            make = meter.create_observable_gauge if spec.kind == "gauge" else meter.create_observable_up_down_counter
            make(spec.name, callbacks=[callback], unit=spec.unit, description=spec.description)

        gauge(m.GPU_UTILIZATION, lambda s: s.utilization)
        gauge(m.GPU_MEMORY_UTILIZATION, lambda s: s.memory_utilization)
        gauge(m.GPU_MEMORY_USAGE, lambda s: s.memory_used)
        gauge(m.GPU_MEMORY_LIMIT, lambda s: s.memory_total)
        gauge(m.GPU_POWER, lambda s: s.power_w)
        gauge(m.GPU_SM_CLOCK, lambda s: s.sm_clock_mhz)

        def throttled(_options: Any) -> list[Any]:
            from opentelemetry.metrics import Observation
            return [Observation(1, {**attrs(s), sc.GPU_THROTTLE_REASON: name})
                    for s in self.latest() for name in throttle_names(s.throttle)]
        spec = m.GPU_THROTTLED
        meter.create_observable_gauge(spec.name, callbacks=[throttled], unit=spec.unit, description=spec.description)


def visible_devices(environ: Any = None) -> list[int] | None:
    """NVML indices named by ``CUDA_VISIBLE_DEVICES`` when it lists integers; else None (all devices)."""
    raw = (environ if environ is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if raw is None or not raw.strip():
        return None
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:  # UUIDs or MIG names: sample every device
        return None


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: that field is unknown on this device
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
