"""Check the step roofline against a real accelerator: torch + nvidia-ml-py only (no vLLM, no OpenTelemetry).

Runs prefill-shaped and decode-shaped batches through a Llama-like layer stack (RMSNorm, Q/K/V/O
projections with rotary embeddings, causal attention over a KV cache, gated SiLU MLP, LM head on
each sequence's last position: what vLLM computes in a step), times each on the device (CUDA
events), feeds the same shapes to otel_llm's estimator (``core/diagnosis/roofline.py``) and prints:

* the estimator's bound and the measured one (the resource the run came closer to saturating:
  compute if measured MFU >= measured MBU, else memory), and whether they match;
* predicted time (max of FLOPs / peak FLOP/s, bytes / peak B/s) against measured, and whether it is
  within 2x (the acceptance bound);
* the NVML sampler (``core/diagnosis/gpu.py``) run for real alongside: samples taken, peak
  utilization, power, SM clock, throttle reasons.

Usage (GPU, about 2-4 minutes on an H100/H200):
    python scripts/device/roofline_check.py --out benchmarks/results/device_roofline.json
On a machine without a GPU, to check that it runs end to end (small shapes; CPU peaks measured
once with a matmul and a copy):
    python scripts/device/roofline_check.py --cpu
Exit status 0 when every case matches its bound and is within 2x, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]


def _load_diagnosis() -> types.ModuleType:
    """otel_llm/core/diagnosis as a package of its own: no otel_llm / OpenTelemetry import needed."""
    base = ROOT / "otel_llm" / "core"
    core = types.ModuleType("_otel_core")
    core.__path__ = [str(base)]
    sys.modules["_otel_core"] = core
    for name in ("semconv", "guard"):
        spec = importlib.util.spec_from_file_location(f"_otel_core.{name}", base / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    pkg = types.ModuleType("_otel_core.diagnosis")
    pkg.__path__ = [str(base / "diagnosis")]
    sys.modules["_otel_core.diagnosis"] = pkg
    for name in ("roofline", "devices", "gpu"):
        spec = importlib.util.spec_from_file_location(f"_otel_core.diagnosis.{name}", base / "diagnosis" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        setattr(pkg, name, mod)
    return pkg


diag = _load_diagnosis()
ModelShape, step_cost, roofline, DevicePeaks = (diag.roofline.ModelShape, diag.roofline.step_cost,
                                                 diag.roofline.roofline, diag.roofline.DevicePeaks)


# -- a Llama-like stack ----------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv[None, :]  # [n, d/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Stack:
    def __init__(self, s: ModelShape, dtype: torch.dtype, device: str) -> None:
        self.s, self.dtype, self.device = s, dtype, device
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * 0.02).to(dtype=dtype, device=device)
        h, d = s.hidden, s.head_dim
        self.embed = w(s.vocab, h)
        self.lm_head = w(s.vocab, h)
        self.norm = torch.ones(h, dtype=dtype, device=device)
        self.layers = [dict(q=w(s.heads * d, h), k=w(s.kv_heads * d, h), v=w(s.kv_heads * d, h), o=w(h, s.heads * d),
                            gate=w(s.intermediate, h), up=w(s.intermediate, h), down=w(h, s.intermediate),
                            n1=torch.ones(h, dtype=dtype, device=device), n2=torch.ones(h, dtype=dtype, device=device))
                       for _ in range(s.layers)]

    def kv_cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.s
        return [(torch.randn(batch, s.kv_heads, length, s.head_dim, dtype=self.dtype, device=self.device),
                 torch.randn(batch, s.kv_heads, length, s.head_dim, dtype=self.dtype, device=self.device))
                for _ in range(s.layers)]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, context: int, cache: list | None) -> torch.Tensor:
        """One step: ``tokens`` [B, n] after ``context`` cached tokens per sequence (cache: [B, K, c+n, d])."""
        s = self.s
        B, n = tokens.shape
        pos = torch.arange(context, context + n, device=self.device)
        x = self.embed[tokens]  # [B, n, h]
        for i, L in enumerate(self.layers):
            y = rms_norm(x, L["n1"])
            q = (y @ L["q"].T).view(B, n, s.heads, s.head_dim).transpose(1, 2)
            k = (y @ L["k"].T).view(B, n, s.kv_heads, s.head_dim).transpose(1, 2)
            v = (y @ L["v"].T).view(B, n, s.kv_heads, s.head_dim).transpose(1, 2)
            q, k = rope(q, pos), rope(k, pos)
            if cache is not None:  # write this step's K/V after the context, attend over all of it
                kc, vc = cache[i]
                kc[:, :, context:context + n] = k
                vc[:, :, context:context + n] = v
                k, v = kc[:, :, :context + n], vc[:, :, :context + n]
            causal = n > 1
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal and context == 0)
            x = x + a.transpose(1, 2).reshape(B, n, s.heads * s.head_dim) @ L["o"].T
            y = rms_norm(x, L["n2"])
            x = x + (F.silu(y @ L["gate"].T) * (y @ L["up"].T)) @ L["down"].T
        last = rms_norm(x[:, -1], self.norm)  # the sampled position of each sequence
        return last @ self.lm_head.T


# -- timing ----------------------------------------------------------------------------------------

def time_it(fn, device: str, repeats: int) -> float:
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_cpu_peaks(dtype: torch.dtype) -> DevicePeaks:
    """A one-time measurement: a large matmul (FLOP/s) and a large copy (B/s)."""
    a = torch.randn(1024, 1024, dtype=dtype)
    flops = 2 * 1024 ** 3 / time_it(lambda: a @ a, "cpu", 5)
    src = torch.empty(64 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() / time_it(lambda: dst.copy_(src), "cpu", 5)  # read + write
    return DevicePeaks("cpu (measured)", flops, bandwidth)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="run on CPU with small shapes (no GPU needed)")
    ap.add_argument("--layers", type=int, default=None, help="layers of the stack (default 8 on GPU, 2 on CPU)")
    ap.add_argument("--peak-flops", type=float, default=None)
    ap.add_argument("--peak-bandwidth", type=float, default=None)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()

    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu to check the script on CPU", file=sys.stderr)
        return 2
    device = "cpu" if args.cpu else "cuda"
    if device == "cpu":
        # one thread: on a shared, oversubscribed machine OpenMP's spinning barriers made small matmuls
        # 20-50x slower than one thread's (seen here); peaks are then measured for one thread too
        torch.set_num_threads(1)
    if device == "cuda":
        dtype = torch.bfloat16
        # Llama-2-7B's layer shapes, 8 of its 32 layers (the step's per-layer work is the same)
        shape = ModelShape(layers=args.layers or 8, hidden=4096, heads=32, kv_heads=32, head_dim=128,
                           intermediate=11008, vocab=32000, weight_bytes=2, kv_bytes=2, act_bytes=2)
        cases = [("prefill", 4, 2048, 0), ("prefill", 1, 512, 0), ("decode", 1, 1, 2048),
                 ("decode", 32, 1, 1024), ("decode", 128, 1, 512)]
        name = torch.cuda.get_device_name(0)
        table = diag.devices.lookup(name)
    else:
        dtype = torch.float32
        shape = ModelShape(layers=args.layers or 2, hidden=512, heads=8, kv_heads=8, head_dim=64,
                           intermediate=1376, vocab=4000, weight_bytes=4, kv_bytes=4, act_bytes=4)
        cases = [("prefill", 2, 256, 0), ("decode", 8, 1, 256), ("decode", 1, 1, 512)]
        name, table = "cpu", None
    if args.peak_flops and args.peak_bandwidth:
        peaks = DevicePeaks(name, args.peak_flops, args.peak_bandwidth)
    elif table is not None:
        peaks = table
    elif device == "cpu":
        peaks = measure_cpu_peaks(dtype)
    else:
        print(f"{name!r} is not in the peak table: pass --peak-flops and --peak-bandwidth", file=sys.stderr)
        return 2
    print(f"device: {name}; peaks {peaks.name}: {peaks.flops / 1e9:,.1f} GFLOP/s, "
          f"{peaks.bandwidth / 1e9:,.1f} GB/s, ridge {peaks.ridge:.1f} FLOP/B")

    sampler = diag.gpu.GpuSampler.start(10.0) if device == "cuda" else None
    print("NVML sampler:", "running at 10 Hz" if sampler else "not available (no NVML)")

    stack = Stack(shape, dtype, device)
    rows, ok = [], True
    for phase, batch, n, context in cases:
        tokens = torch.randint(0, shape.vocab, (batch, n), device=device)
        cache = stack.kv_cache(batch, context + n) if context else None
        t0 = time.monotonic()
        measured = time_it(lambda: stack.step(tokens, context, cache), device, args.repeats)
        t1 = time.monotonic()
        cost = step_cost(shape, [(n, context)] * batch)
        r = roofline(cost, peaks, measured)
        measured_bound = "compute" if r.mfu >= r.mbu else "memory"
        ratio = measured / r.predicted_s
        good = measured_bound == r.bound and 0.5 <= ratio <= 2.0
        ok &= good
        row = dict(phase=phase, batch=batch, tokens=n, context=context, flops=cost.flops, bytes=cost.bytes,
                   intensity=cost.intensity, bound=r.bound, measured_bound=measured_bound,
                   predicted_ms=r.predicted_s * 1e3, measured_ms=measured * 1e3, ratio=ratio, mfu=r.mfu, mbu=r.mbu,
                   within_2x=0.5 <= ratio <= 2.0, bound_match=measured_bound == r.bound)
        if sampler is not None:
            sample = sampler.nearest((t0 + t1) / 2)
            if sample:
                row["gpu"] = {k: v for k, v in sample[0].attributes().items()}
        rows.append(row)
        print(f"{phase:7s} B={batch:<3d} n={n:<5d} ctx={context:<5d} intensity {cost.intensity:8.1f} "
              f"bound {r.bound:7s} (measured {measured_bound:7s}) predicted {r.predicted_s * 1e3:8.3f} ms "
              f"measured {measured * 1e3:8.3f} ms  ratio {ratio:5.2f}  MFU {r.mfu:.2f} MBU {r.mbu:.2f}  "
              f"{'ok' if good else 'MISMATCH'}")
        del cache
        if device == "cuda":
            torch.cuda.empty_cache()

    nvml = None
    if sampler is not None:
        sampler.sample_once()
        with sampler._lock:
            samples = [s for group in sampler._samples for s in group]
        sampler.close()
        util = [s.utilization for s in samples if s.utilization is not None]
        power = [s.power_w for s in samples if s.power_w is not None]
        clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
        reasons = sorted({r for s in samples for r in diag.gpu.throttle_names(s.throttle)})
        nvml = dict(samples=len(samples), max_utilization=max(util, default=None), max_power_w=max(power, default=None),
                    sm_clock_mhz=[min(clocks, default=None), max(clocks, default=None)], throttle_reasons=reasons)
        print(f"NVML: {len(samples)} samples, utilization up to {nvml['max_utilization']}, power up to "
              f"{nvml['max_power_w']} W, SM clock {nvml['sm_clock_mhz']} MHz, throttle reasons seen {reasons}")
    result = dict(device=name, peaks=dict(name=peaks.name, flops=peaks.flops, bandwidth=peaks.bandwidth),
                  dtype=str(dtype), shape=shape.__dict__, cases=rows, nvml=nvml, all_ok=ok,
                  torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=lambda v: None if isinstance(v, float) and
                                       math.isnan(v) else str(v)) + "\n")
        print(f"wrote {args.out}")
    print("ALL OK" if ok else "SOME CASES OUTSIDE THE ACCEPTANCE BOUNDS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
