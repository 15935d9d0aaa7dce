"""A synthetic NVML: the slice of pynvml the GPU sampler reads, with values a test sets (no GPU here)."""

from __future__ import annotations

from types import SimpleNamespace


class FakeNVML:
    NVML_CLOCK_SM = 1

    def __init__(self, count: int = 2) -> None:
        self.count, self.util, self.power_mw, self.throttle = count, 50, 300_000, 0x4
        self.inits = self.shutdowns = 0

    def nvmlInit(self): self.inits += 1
    def nvmlShutdown(self): self.shutdowns += 1
    def nvmlDeviceGetCount(self): return self.count
    def nvmlDeviceGetHandleByIndex(self, i): return ("h", i)
    def nvmlDeviceGetName(self, h): return b"NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h[1]}"
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=self.util, memory=20)
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=10 << 30, total=80 << 30)
    def nvmlDeviceGetPowerUsage(self, h): return self.power_mw
    def nvmlDeviceGetClockInfo(self, h, kind): return 1980
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self.throttle
