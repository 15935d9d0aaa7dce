"""Peak dense 16-bit compute and memory bandwidth of common accelerators, looked up by device name.

Figures are the vendors' datasheet numbers for dense BF16/FP16 tensor math (not the "with
sparsity" figure, which is 2x) and HBM/GDDR bandwidth, for the SXM/OAM part unless the name
says otherwise. Overridable with the ``peak_flops`` / ``peak_memory_bandwidth`` options
(``OTEL_LLM_PEAK_FLOPS``, ``OTEL_LLM_PEAK_MEMORY_BANDWIDTH``); a model served in FP8 or FP32
should set them, as should any CPU (there is no CPU row: peaks there depend on the cores given).
"""

from __future__ import annotations

import re

from .roofline import DevicePeaks

T, TB = 1e12, 1e12  # TFLOP/s, TB/s

# (pattern matched against the device name, case-insensitive, first match wins; name, FLOP/s, B/s)
_TABLE: tuple[tuple[str, str, float, float], ...] = (
    # NVIDIA HGX B200 spec sheet: 36 PFLOPS BF16 with sparsity for 8 GPUs -> 2.25 PFLOPS dense per GPU; 8 TB/s
    (r"\bB200\b", "B200", 2250 * T, 8.0 * TB),
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): BF16 1,979 TFLOPS with sparsity -> 989 dense;
    # 4.8 TB/s (H200 NVL: 4.8 TB/s, 835 TFLOPS dense)
    (r"\bH200 NVL\b", "H200 NVL", 835 * T, 4.8 * TB),
    (r"\bH200\b", "H200", 989 * T, 4.8 * TB),
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM 989 TFLOPS dense BF16, 3.35 TB/s;
    # PCIe 756 TFLOPS, 2.0 TB/s; NVL 835 TFLOPS, 3.9 TB/s
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756 * T, 2.0 * TB),
    (r"\bH100 NVL\b", "H100 NVL", 835 * T, 3.9 * TB),
    (r"\bH100\b", "H100 SXM", 989 * T, 3.35 * TB),
    # NVIDIA H20 (China SKU; vendor briefings): 148 TFLOPS dense BF16, 4.0 TB/s
    (r"\bH20\b", "H20", 148 * T, 4.0 * TB),
    # NVIDIA A100 datasheet: 312 TFLOPS dense BF16; 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s, 40GB 1,555 GB/s
    (r"\bA100\b.*40GB", "A100 40GB", 312 * T, 1.555 * TB),
    (r"\bA100\b.*PCIe", "A100 80GB PCIe", 312 * T, 1.935 * TB),
    (r"\bA100\b", "A100 80GB SXM", 312 * T, 2.039 * TB),
    # NVIDIA L40S datasheet: 362.05 TFLOPS dense BF16 (733 with sparsity), 864 GB/s GDDR6
    (r"\bL40S\b", "L40S", 362 * T, 0.864 * TB),
    # NVIDIA L40 datasheet: 181 TFLOPS dense BF16, 864 GB/s
    (r"\bL40\b", "L40", 181 * T, 0.864 * TB),
    # NVIDIA L4 datasheet: 121 TFLOPS dense BF16 (242 with sparsity), 300 GB/s
    (r"\bL4\b", "L4", 121 * T, 0.300 * TB),
    # NVIDIA A10 datasheet: 125 TFLOPS dense BF16, 600 GB/s. AWS's A10G has the A10's memory (600 GB/s)
    # and lower clocks; NVIDIA publishes no A10G figure: the commonly quoted ~70 TFLOPS (AWS/partners)
    (r"\bA10G\b", "A10G", 70 * T, 0.600 * TB),
    (r"\bA10\b", "A10", 125 * T, 0.600 * TB),
    # NVIDIA T4 datasheet: 65 TFLOPS FP16 mixed precision, 320 GB/s
    (r"\bT4\b", "T4", 65 * T, 0.320 * TB),
    # NVIDIA V100 SXM2 datasheet: 125 TFLOPS tensor, 900 GB/s
    (r"\bV100\b", "V100", 125 * T, 0.900 * TB),
    # AMD Instinct MI300X data sheet: 1,307.4 TFLOPS dense BF16, 5.3 TB/s; MI325X: same compute, 6 TB/s
    (r"\bMI325X\b", "MI325X", 1307 * T, 6.0 * TB),
    (r"\bMI300X\b", "MI300X", 1307 * T, 5.3 * TB),
    # AMD Instinct MI250X data sheet: 383 TFLOPS BF16, 3.2 TB/s
    (r"\bMI250X?\b", "MI250X", 383 * T, 3.2 * TB),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), name, f, b) for p, name, f, b in _TABLE)


def lookup(device_name: str | None) -> DevicePeaks | None:
    """The table's row for a device name as NVML or torch report it ("NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB", "AMD Instinct MI300X"); None when no row matches."""
    if not device_name:
        return None
    normalised = device_name.replace("-", " ").replace("_", " ")
    for pattern, name, flops, bandwidth in _COMPILED:
        if pattern.search(normalised):
            return DevicePeaks(name, flops, bandwidth)
    return None


def resolve(device_name: str | None, peak_flops: float | None, peak_bandwidth: float | None) -> DevicePeaks | None:
    """Options win over the table, each on its own; both needed for a bound and MFU/MBU."""
    row = lookup(device_name)
    flops = peak_flops if peak_flops else (row.flops if row else None)
    bandwidth = peak_bandwidth if peak_bandwidth else (row.bandwidth if row else None)
    if not flops or not bandwidth:
        return None
    name = row.name if row and not (peak_flops and peak_bandwidth) else (device_name or "configured")
    return DevicePeaks(name, float(flops), float(bandwidth))
