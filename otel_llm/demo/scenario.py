"""The demo's scripted workload: phases whose causes are known, driven by engine steps, not the clock.

Each phase is built so that the verdict's own rules, not the machine's speed, decide why its requests
were slow (``otel_llm.core.diagnosis.verdict``):

* **steady chat** (quiet): a few short chats at a time: the baseline, built to cause nothing;
* **long documents**: chats decoding while documents of many tokens are prefilled, one a step,
  beside them; the chats' decode steps carry the documents' prefill tokens (prefill interference);
* **burst**: four times ``max_num_seqs`` requests at once: three of every four wait with the batch full
  (queueing, max_num_seqs);
* **KV-cache squeeze**: long prompts that grow past a KV cache that holds five of them; the
  scheduler preempts some and holds the others back for KV blocks with the batch half empty;
* **LoRA slot**: requests for two adapters on an engine that holds one at a time (``max_loras=1``):
  while the first adapter's requests decode, the second's wait for the slot with the batch half empty.
  It runs on an engine of its own (``LORA_ENGINE_ARGS``, ``Phase.lora``).

Arrivals are counted in engine steps (the engine runs in this process, so each ``step()`` is one
scheduler step): the same requests meet the same batches on any machine. Before each phase a quiet
measurement runs requests of the phase's shape without its twist, ``MEASUREMENTS`` times, and the
phase's SLOs are set from the fastest (the phase's ``tpot_factor`` times its TPOT, ``TTFT_FACTOR`` times
its TTFT and at least ``TTFT_STEPS`` decode steps): they follow the machine's speed as it drifts, and a
slow spell of a shared machine during one measurement does not loosen them past the phase's cause.
Before any of that, ``warm_up`` runs every batch shape the phases and their measurements meet once: the
CPU build's first step of a shape costs up to three later ones (oneDNN builds its kernels per shape).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Callable, ContextManager, Iterable, Mapping

from .. import semconv as sc
from .adapters import RANK as LORA_RANK, write_adapter

# One engine for every phase. 81 KV blocks of 32 tokens (vLLM keeps one back): 2,560 tokens, enough
# for two documents beside the chats, too few for the squeeze. A step's token budget holds two whole
# documents, so they are prefilled two to a step.
MAX_NUM_SEQS = 6
BLOCK_SIZE = 32
KV_BLOCKS = 81
DOCUMENT_TOKENS = 1024
ENGINE_ARGS: dict[str, Any] = dict(
    load_format="dummy", dtype="float32", enforce_eager=True, max_model_len=(KV_BLOCKS - 1) * BLOCK_SIZE,
    max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=2560, block_size=BLOCK_SIZE,
    num_gpu_blocks_override=KV_BLOCKS, kv_cache_memory_bytes=64 << 20, enable_prefix_caching=False,
    disable_log_stats=False,
)
# The LoRA phase's engine: the same, with one LoRA slot and both adapters kept in host memory (a swap is a
# copy, not a load from disk). Not the other phases' engine: with LoRA on, the LoRA layers run for every
# token, adapter or not, and on the CPU they made a prefill token several times dearer than a decode
# step's share; the squeeze's quiet TTFT (three 496-token prompts prefilled at once) then rose to most of
# the victims' wait for KV blocks, and its breaches to chance.
LORA_ENGINE_ARGS: dict[str, Any] = {**ENGINE_ARGS, "enable_lora": True, "max_loras": 1, "max_cpu_loras": 2,
                                    "max_lora_rank": LORA_RANK}
DOCUMENTS_PER_WAVE = 8  # steps of a wave that prefill documents, two of them each
DOCUMENT_WAVE_STEPS = 20
CHATS_PER_WAVE = MAX_NUM_SEQS - 2  # and the chats beside them fill the batch
SQUEEZE_TOKENS = 496
# The SLOs, from the quiet measurement before each phase (its own requests' shape, without the phase's
# twist): TPOT a multiple of the measured median TPOT; TTFT a multiple of the measured median TTFT, and
# at least a number of its decode steps. A burst's later waves wait 96 decode steps, a squeezed request
# another's whole life, many times the TTFT SLO. A step prefilling two documents costs four to twenty
# quiet decode steps on the machines seen (x): a chat whose eleven decode intervals carry them eight
# times has a TPOT of (3 + 8x) / 11 quiet ones, 3.5 at the least; against three quiet TPOTs that margin
# is within a loaded machine's noise between measurement and phase, so the documents phase holds its
# chats to one and a half (DOCUMENTS_TPOT_FACTOR; at two, a run whose measurement fell in a slow spell
# of a shared machine breached one wave of its three).
TPOT_FACTOR = 3.0
DOCUMENTS_TPOT_FACTOR = 1.5
TTFT_FACTOR = 2.0
TTFT_STEPS = 16
# The engine computes on one OpenMP thread: on a shared machine, threads that wait for each other at
# every small kernel make a decode step several times slower (and its time far noisier) than one thread.
ENGINE_ENV = {"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # set before torch is imported

QUIET, DOCUMENTS, BURST, SQUEEZE, LORA = "steady chat", "long documents", "burst", "KV-cache squeeze", "LoRA slot"
# the LoRA phase's adapters: the first holds the slot while its requests decode, the second's wait
LORA_HELD, LORA_WAITING = "support-tone", "legal-summary"
ADAPTERS = (LORA_HELD, LORA_WAITING)
LORA_HOLDERS = MAX_NUM_SEQS // 2  # the first adapter's requests of a wave: half the batch
LORA_VICTIMS = 5  # the second adapter's: the batch has room for some beside them, but for the slot
# how long the first adapter holds the slot: the second's wait 126 decode steps against a TTFT SLO of 16
# (or twice a quiet TTFT): a margin of eight, above the drift of a shared machine's speed seen between a
# measurement and its phase (64 tokens, a margin of four, left some waves unbreached)
LORA_HOLD_TOKENS = 128
LORA_WAVE_STEPS = 200  # a wave starts after the last one has finished
# quiet measurements before each phase; its SLOs come from the fastest (a slow spell of a shared machine
# during one would set SLOs the phase's cause does not reach)
MEASUREMENTS = 3
QUIET_CHATS = 6  # the steady phase's measurement: its own first chats, at its own steps


@dataclass(frozen=True)
class Arrival:
    """A request the phase adds before its ``step``-th engine step."""

    step: int
    request_id: str
    prompt_tokens: int
    max_tokens: int
    role: str = "victim"  # "victim": the phase is built to slow it; "load": it slows the others
    adapter: str | None = None  # its LoRA adapter (one of ``ADAPTERS``); None: the base model
    period: int | None = None  # its prompt repeats every ``period`` tokens (an n-gram drafter's food)


@dataclass(frozen=True)
class Phase:
    key: str  # its requests' id prefix
    name: str
    causes: frozenset[str]  # the verdict causes it is built to produce; empty for the quiet phase
    built: str  # what it does, for the verdict table
    arrivals: tuple[Arrival, ...]
    # its measurement: (requests decoding together, prompt tokens, output tokens); None: its own first
    # ``QUIET_CHATS`` arrivals, at their steps (the steady phase: the same batch shapes as the phase)
    quiet: tuple[int, int, int] | None
    tpot_factor: float = TPOT_FACTOR  # its TPOT SLO, in quiet TPOTs
    lora: bool = False  # it runs on the LoRA engine (``LORA_ENGINE_ARGS``), not ``ENGINE_ARGS``'
    wave: int = 0  # steps between its waves, which repeat the same batches (0: one wave)

    def first_wave(self) -> list[Arrival]:
        return [a for a in self.arrivals if not self.wave or a.step < self.wave]

    def request_ids(self) -> set[str]:
        return {a.request_id for a in self.arrivals}

    def roles(self) -> dict[str, str]:
        return {a.request_id: a.role for a in self.arrivals}


def _chats(prefix: str, n: int, every: int, max_tokens: int) -> list[Arrival]:
    return [Arrival(i * every, f"{prefix}-{i}", 16 + (i * 11) % 32, max_tokens) for i in range(n)]


def phases(scale: int = 2) -> list[Phase]:
    """The scenario; ``scale`` sizes the phases (2: the demo, 1: the test's short run; either way each
    cause phase has at least seven requests built to breach, most at least ten)."""
    quiet = _chats("chat", 6 * scale, 8, 24)
    documents: list[Arrival] = []
    for w in range(scale + 1):
        # a wave: four chats decode three tokens alone (the verdict's baseline for a decode step of four),
        # then two documents arrive each step for eight steps, prefilled whole beside the chats' decodes,
        # which have twelve tokens in all: most of their decode steps carry two documents
        base = DOCUMENT_WAVE_STEPS * w
        documents += [Arrival(base, f"doc-chat-{w}-{i}", 16 + i, 4 + DOCUMENTS_PER_WAVE) for i in range(CHATS_PER_WAVE)]
        documents += [Arrival(base + 4 + d // 2, f"doc-{w}-{d}", DOCUMENT_TOKENS, 1, "load")
                      for d in range(2 * DOCUMENTS_PER_WAVE)]
    # the first wave fills the batch (load: it waits for nothing); the later waves queue behind it
    burst = [Arrival(0, f"burst-{i}", 8 + i % 8, 96, "load" if i < MAX_NUM_SEQS else "victim")
             for i in range((2 + scale) * MAX_NUM_SEQS)]
    # 496-token prompts: 16 blocks each, five fill the cache; each needs 4 more blocks as it grows
    # the first five are admitted at once and hold the cache (load: they wait for nothing, though one
    # may be preempted as they grow); the others wait for KV blocks
    fit = (KV_BLOCKS - 1) // math.ceil(SQUEEZE_TOKENS / BLOCK_SIZE)
    # (the victims: two more per scale step, so that even the short run has a margin above five)
    squeeze = [Arrival(0, f"squeeze-{i}", SQUEEZE_TOKENS, 120, "load" if i < fit else "victim")
               for i in range(fit + 5 + 2 * scale)]
    lora: list[Arrival] = []
    for w in range(scale + 2):
        # a wave: the first adapter's requests take the slot and decode LORA_HOLD_TOKENS; two steps later
        # the second adapter's arrive and wait for the slot, with the batch half empty. A wave starts
        # after the last one has finished (the engine idles; the next arrival comes at once)
        base = LORA_WAVE_STEPS * w
        lora += [Arrival(base, f"lora-{w}-held-{i}", 16 + i, LORA_HOLD_TOKENS, "load", LORA_HELD)
                 for i in range(LORA_HOLDERS)]
        lora += [Arrival(base + 2, f"lora-{w}-{i}", 16 + 3 * i, 16, adapter=LORA_WAITING)
                 for i in range(LORA_VICTIMS)]
    return [
        Phase("chat", QUIET, frozenset(), "short chats, three at a time", tuple(quiet), None),
        Phase("doc", DOCUMENTS, frozenset({sc.SLOW_PREFILL_INTERFERENCE}),
              f"{DOCUMENT_TOKENS}-token documents prefilled beside decoding chats", tuple(documents),
              (CHATS_PER_WAVE, 18, 24), DOCUMENTS_TPOT_FACTOR, wave=DOCUMENT_WAVE_STEPS),
        Phase("burst", BURST, frozenset({sc.SLOW_QUEUE_MAX_SEQS}),
              f"{len(burst)} requests at once, max_num_seqs {MAX_NUM_SEQS}", tuple(burst), (MAX_NUM_SEQS - 1, 12, 24)),
        Phase("squeeze", SQUEEZE, frozenset({sc.SLOW_QUEUE_KV_CACHE, sc.SLOW_PREEMPTION}),
              f"{len(squeeze)} growing {SQUEEZE_TOKENS}-token prompts, KV cache {(KV_BLOCKS - 1) * BLOCK_SIZE} "
              "tokens", tuple(squeeze), (3, SQUEEZE_TOKENS, 24)),
        Phase("lora", LORA, frozenset({sc.SLOW_QUEUE_LORA_SLOT}),
              f"two adapters, one LoRA slot: {LORA_HOLDERS} of one decode while {LORA_VICTIMS} of the other wait",
              tuple(lora), (LORA_VICTIMS, 16, 16), lora=True, wave=LORA_WAVE_STEPS),
    ]


def measurement(phase: Phase) -> list[Arrival]:
    """The quiet measurement before a phase: requests of its shape decoding together, as many as fit
    without queueing or squeezing the KV cache; for a phase without a twist (``quiet`` None), its own
    first requests, at their steps."""
    if phase.quiet is None:
        return [dataclasses.replace(a, request_id=f"{phase.key}-base-{i}")
                for i, a in enumerate(phase.arrivals[:QUIET_CHATS])]
    n, prompt_tokens, max_tokens = phase.quiet
    adapter = LORA_WAITING if phase.key == "lora" else None  # the waiting adapter's requests, in the slot at once
    out = [Arrival(0, f"{phase.key}-base-{i}", prompt_tokens + i, max_tokens, adapter=adapter) for i in range(n)]
    if phase.key == "doc":  # and its documents, two a step as in the phase, with nothing else running
        out += [Arrival(max_tokens + 8 + 4 * (i // 2), f"{phase.key}-base-doc-{i}", DOCUMENT_TOKENS, 1, "load")
                for i in range(6)]
    return out


def renamed(arrivals: Iterable[Arrival], prefix: str) -> list[Arrival]:
    """The same requests under other ids (a warm-up of a phase)."""
    return [dataclasses.replace(a, request_id=prefix + a.request_id) for a in arrivals]


def prompt(request_id: str, tokens: int, period: int | None = None) -> dict[str, list[int]]:
    """Token ids of its own for each request (no two prompts share a prefix); with ``period``, a
    pattern of that many tokens repeated."""
    seed = sum(ord(c) * 131 ** i for i, c in enumerate(request_id)) % 9973
    return {"prompt_token_ids": [3 + (seed + 31 * (j % (period or tokens))) % 500 for j in range(tokens)]}


def adapter_requests(directory: str | Path) -> dict[str, Any]:
    """The LoRA phase's adapters, written under ``directory`` (once): name -> ``vllm.lora.request.LoRARequest``."""
    from vllm.lora.request import LoRARequest

    return {name: LoRARequest(name, i + 1, write_adapter(Path(directory) / name, seed=i + 1))
            for i, name in enumerate(ADAPTERS)}


def drive(engine: Any, arrivals: Iterable[Arrival], adapters: Mapping[str, Any] | None = None) -> int:
    """Add each request before its step and step the engine until all are done; returns how many
    finished. ``engine``: a ``vllm.LLMEngine`` whose EngineCore runs in this process; ``adapters``: the
    ``LoRARequest`` of each adapter an arrival names (``adapter_requests``)."""
    from vllm import SamplingParams

    pending = sorted(arrivals, key=lambda a: a.step)
    missing = {a.adapter for a in pending if a.adapter is not None} - set(adapters or ())
    if missing:
        raise ValueError(f"no LoRARequest for adapters {sorted(missing)}: pass adapters=adapter_requests(dir)")
    step, finished, i = 0, 0, 0
    while i < len(pending) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests() and i < len(pending):
            step = max(step, pending[i].step)  # idle: the next arrival comes now
        while i < len(pending) and pending[i].step <= step:
            a = pending[i]
            engine.add_request(a.request_id, prompt(a.request_id, a.prompt_tokens, a.period),
                               SamplingParams(max_tokens=a.max_tokens, ignore_eos=True, temperature=0.0),
                               lora_request=adapters[a.adapter] if a.adapter is not None else None)
            i += 1
        finished += sum(1 for out in engine.step() if out.finished)
        step += 1
    return finished


@dataclass(frozen=True)
class Baseline:
    """What a quiet measurement found, and the SLOs it sets."""

    tpot: float  # median, s
    ttft: float  # median, s
    requests: int
    tpot_factor: float = TPOT_FACTOR  # the TPOT SLO, in these TPOTs
    repeats: int = 1  # measurements it is the fastest of

    @property
    def slo(self) -> str:
        ttft = max(TTFT_FACTOR * self.ttft, TTFT_STEPS * self.tpot)
        return f"ttft={round_up(ttft)},tpot={round_up(self.tpot_factor * self.tpot)}"

    def describe(self) -> str:
        return (f"quiet measurement: TPOT {1000 * self.tpot:.1f} ms, TTFT {1000 * self.ttft:.1f} ms (medians of "
                f"{self.requests}, the fastest of {self.repeats}); SLOs: TTFT {TTFT_FACTOR:g}x or {TTFT_STEPS} "
                f"decode steps, TPOT {self.tpot_factor:g}x: {self.slo}")

    @classmethod
    def fastest(cls, measured: list[Baseline]) -> Baseline:
        """Of repeated measurements, the fastest TPOT and TTFT (either may come from another repeat)."""
        if not measured:
            raise ValueError("no quiet measurement")
        return cls(min(b.tpot for b in measured), min(b.ttft for b in measured), measured[0].requests,
                   measured[0].tpot_factor, len(measured))


def baseline(requests: Iterable[Mapping[str, Any]], tpot_factor: float = TPOT_FACTOR) -> Baseline:
    """From the request-span attributes of a quiet ``measurement`` (every one sampled): TPOT of its
    decoding requests; TTFT of its documents where it has some (the longest prompts the phase sends),
    else of all."""
    measured = [a for a in requests if "-base-" in str(a.get(sc.RESPONSE_ID, ""))]
    tpot = [float(a[sc.LATENCY_TPOT]) for a in measured if isinstance(a.get(sc.LATENCY_TPOT), (int, float))]
    docs = [a for a in measured if "-base-doc-" in str(a[sc.RESPONSE_ID])]
    ttft = [float(a[sc.LATENCY_TTFT]) for a in docs or measured if isinstance(a.get(sc.LATENCY_TTFT), (int, float))]
    if not tpot or not ttft:
        raise ValueError("the quiet measurement recorded no TPOT or TTFT: is otel_llm instrumented?")
    return Baseline(median(tpot), median(ttft), len(measured), tpot_factor)


def round_up(seconds: float) -> str:
    """Two significant digits, rounded up (an SLO is a round number a person would write)."""
    digits = 1 - math.floor(math.log10(seconds)) if seconds > 0 else 3
    step = 10 ** -digits
    return f"{math.ceil(round(seconds / step, 6)) * step:.{max(digits, 0)}f}"  # round: 0.07 / 0.01 is 7.000000000000001


@dataclass
class PhaseTally:
    """Of one phase's victim requests (those it is built to slow) that breached an SLO: how many, and their
    verdicts. Its load requests (a document prefilled beside the chats, the burst's first wave that fills
    the batch) are slowed by their own work, not by the phase's cause: their breaches are counted apart,
    in ``load_breached``, and are not judged."""

    phase: Phase
    requests: int = 0  # victim requests sent
    load: int = 0  # load requests sent
    load_breached: int = 0
    load_causes: dict[str, int] = field(default_factory=dict)  # verdict -> breached load requests
    breached: int = 0
    causes: dict[str, int] = field(default_factory=dict)  # verdict -> breached requests
    seconds: dict[str, float] = field(default_factory=dict)  # verdict -> seconds it cost those requests

    @property
    def right(self) -> int:
        return sum(n for c, n in self.causes.items() if c in self.phase.causes)

    @property
    def share_right(self) -> float | None:
        return self.right / self.breached if self.breached else None


def tally(all_phases: list[Phase], requests: Iterable[Mapping[str, Any]]) -> list[PhaseTally]:
    """Group breached request spans (by ``gen_ai.response.id``) by the phase that sent them; a phase's
    load requests are counted apart (``PhaseTally.load_breached``)."""
    owner = {rid: (p.name, role) for p in all_phases for rid, role in p.roles().items()}
    out = {p.name: PhaseTally(p, requests=sum(a.role != "load" for a in p.arrivals),
                              load=sum(a.role == "load" for a in p.arrivals)) for p in all_phases}
    for a in requests:
        name, role = owner.get(str(a.get(sc.RESPONSE_ID, "")), (None, None))
        if name is None or not a.get(sc.SLO_BREACHED):
            continue
        t = out[name]
        cause = str(a.get(sc.SLOW_CAUSE, sc.SLOW_UNKNOWN))
        if role == "load":
            t.load_breached += 1
            t.load_causes[cause] = t.load_causes.get(cause, 0) + 1
            continue
        t.breached += 1
        t.causes[cause] = t.causes.get(cause, 0) + 1
        cost = a.get(sc.SLOW_SECONDS[cause]) if cause in sc.SLOW_SECONDS else None
        t.seconds[cause] = t.seconds.get(cause, 0.0) + (float(cost) if isinstance(cost, (int, float)) else 0.0)
    return list(out.values())


@dataclass(frozen=True)
class PhaseRun:
    phase: Phase
    slo: str
    seconds: float
    baseline: Baseline | None  # None: the SLOs were given


Measure = Callable[[], ContextManager[Callable[[], list[Mapping[str, Any]]]]]
Judge = Callable[[str], ContextManager[None]]


def warm_up(engine: Any, these: list[Phase], adapters: Mapping[str, Any] | None = None) -> None:
    """Before the first of ``these`` phases, on their engine: each phase's measurement and first wave
    (every batch shape the run meets; the adapters' first use), under other ids. The CPU build's first
    step of a batch shape costs up to three of its later ones: a first run inside a quiet measurement
    would loosen its phase's SLOs, inside a phase it would breach requests the phase does not slow."""
    for phase in these:
        drive(engine, renamed(measurement(phase), f"warm-{phase.key}-m-"), adapters)
        drive(engine, renamed(phase.first_wave(), f"warm-{phase.key}-"), adapters)


def run_phases(engine: Any, all_phases: list[Phase], measure: Measure, judge: Judge, slo: str | None = None,
               report: Callable[[PhaseRun], None] = lambda run: None,
               adapters: Mapping[str, Any] | None = None) -> list[PhaseRun]:
    """Each phase after a quiet measurement of its own (unless ``slo`` fixes the SLOs), so the SLOs follow
    the machine's speed as it drifts: ``measure()`` instruments for the measurement and yields a function
    returning its request-span attributes; ``judge(slo)`` instruments with those SLOs for the phase."""
    out = []
    for phase in all_phases:
        measured = None
        if slo is None:
            repeats = []
            for r in range(MEASUREMENTS):
                with measure() as finished:
                    drive(engine, renamed(measurement(phase), f"m{r}-"), adapters)
                    repeats.append(baseline(finished(), phase.tpot_factor))
            measured = Baseline.fastest(repeats)
        with judge(slo or measured.slo):
            started = time.monotonic()
            drive(engine, phase.arrivals, adapters)
            run = PhaseRun(phase, slo or measured.slo, time.monotonic() - started, measured)
        report(run)
        out.append(run)
    return out
