"""The slow-cause verdict: why a kept request was slow, from its own timeline and the engine steps around it.

Engine-agnostic: it reads a ``RequestTimeline`` (QUEUED/SCHEDULED/PREEMPTED events, token stamps,
the ids of the steps that served it and which of them computed its prompt) and a window of recent
``StepFacts`` per engine (each step's start and end, batch counts, and why requests stayed waiting).
It runs in the cold path, after the request finished, for requests kept for a cause. The method,
formula by formula, is in docs/verdict.md; in short, each cause is the time it cost
the request above what a comparable step costs, summed over the breached measure's phases:

* queueing, split by the reason the engine's admission stopped in each step the request waited
  through (max running sequences, KV cache, token budget), except the steps where the request itself
  could not be admitted for its LoRA adapter: its adapter was not among the step's adapters while the
  step ran ``max_loras`` of them (vLLM's scheduler skips such a request whatever else happens, so the
  limit alone kept it waiting; decided per request, not from the step-wide reason);
* prefill interference: its decode steps that carried other requests' prefill tokens, minus the
  median of decode-only steps of the same decode batch size before each (``prefill_loss``); steps that skipped it while it ran and
  carried prefill count whole;
* grammar interference: its decode steps (without prefill) in which the engine computed a grammar bitmask,
  beyond a comparable step without one, at most the bitmask's time, for the part of the mask that was
  other requests' (``grammar_wait``);
* preemption: from being preempted until its next token;
* batch growth: in its decode steps with more decoding requests than its first one had, the median
  decode-only step at that batch size minus the median at the batch size it started with;
* engine starvation: idle gaps between consecutive engine steps while it was pending, beyond the
  median gap;
* its grammar: the steps it waited through, for a request with a structured-output grammar, that
  admitted everyone else and left requests waiting for their grammar (``BLOCKED_STRUCTURED_OUTPUT``);
* the frontend: its hand-over (arrival to QUEUED) beyond comparable requests', and where a Python
  frontend received its outputs, the delay from the engine's first (last) token stamp to that receipt
  beyond recent requests' (``frontend.py``), above the cause's declared floor;
* its own work: its prompt's prefill beyond a short prompt's (``own_prefill``), and for an e2e breach
  whose TPOT met its SLO the decode time beyond what the e2e SLO left it (``own_length``).

The causes, their objectives and formulas are declared in ``causes.py``.

The dominant cause is the largest, when it is at least ``MIN_SHARE`` of the phases' time and larger
than the time the data could not attribute; otherwise ``unknown``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Callable, Iterable, NamedTuple

from ... import semconv as sc
from ..handoff import HandoffHistory
from ..timeline import (BLOCKED_KV_CACHE, BLOCKED_MAX_SEQS, BLOCKED_STRUCTURED_OUTPUT, BLOCKED_TOKEN_BUDGET, QUEUED,
                        RequestTimeline, StepRecord)
from .causes import BY_NAME, NAMES
from .frontend import FIRST, LAST, FrontendHistory, OutputDelays, excess

MIN_SHARE = 0.1  # a cause explains a request when it cost at least this share of the breached phases' time
CONTEXT_STEPS = 64  # steps before the request's own, read for the baselines (median decode step, median gap)
MIN_SAMPLES = 3  # decode-only steps of a batch size needed for its median

_QUEUE_CAUSE = {BLOCKED_MAX_SEQS: sc.SLOW_QUEUE_MAX_SEQS, BLOCKED_KV_CACHE: sc.SLOW_QUEUE_KV_CACHE,
                BLOCKED_TOKEN_BUDGET: sc.SLOW_QUEUE_TOKEN_BUDGET}
# the phases of the request each objective measures: before the first token, after it
_PHASES = {"ttft": (True, False), "tpot": (False, True), "e2e": (True, True)}


class StepFacts(NamedTuple):
    """One engine step, compactly: what the verdict reads (a window holds thousands)."""

    step_id: int
    start: float  # engine monotonic
    end: float
    running: int
    waiting: int
    preempted: int
    blocked: int  # BLOCKED_*: why requests stayed waiting after this step's schedule
    prefill_tokens: int
    decode_requests: int
    loras: tuple[int, ...] | None = None  # the LoRA adapters (ids) the step ran
    grammar_s: float = 0.0  # seconds the engine spent on the step's grammar bitmask (0: none computed)
    grammar_requests: int = 0  # the structured requests that mask covered

    @property
    def duration(self) -> float:
        return self.end - self.start


def engine_of(step_id: int) -> int:
    """Step ids are ``pid << 32 | counter`` per engine (see the adapters): the engine part."""
    return step_id >> 32


class StepWindow:
    """The most recent ``size`` steps of each engine, appended where steps arrive (O(1)) and read
    by the verdict on the materializer thread."""

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self.max_loras: int | None = None  # the engine's LoRA slots, where it serves adapters (set by the adapter)
        self.handoffs = HandoffHistory()  # the decode side's KV load times, for the kv_transfer cause
        self.frontend = FrontendHistory()  # arrival -> QUEUED of recent requests, for the frontend cause
        self.outputs = OutputDelays()  # engine token stamp -> the frontend's receipt, the same cause's output side
        # wall clock - engine monotonic clock, where the verdict runs (frontend.py: one host, one CLOCK_MONOTONIC)
        self.wall_offset: Callable[[], float] = lambda: time.time() - time.monotonic()
        self._engines: dict[int, deque[tuple]] = {}  # engine -> StepFacts-shaped tuples, in step order
        self._lock = threading.Lock()

    def add(self, step: StepRecord, prefill_tokens: int, decode_requests: int) -> None:
        # a plain tuple (StepFacts' fields): this runs once per engine step, a NamedTuple costs 4x
        grammar = step.grammar
        facts = (step.step_id, step.start, step.end, step.running, step.waiting, step.preempted,
                 step.queue_blocked, prefill_tokens, decode_requests, step.loras,
                 *(_NO_GRAMMAR if grammar is None or not grammar.seconds else (grammar.seconds, grammar.requests)))
        with self._lock:
            steps = self._engines.get(step.step_id >> 32)
            if steps is None:
                steps = self._new(step.step_id >> 32)
            steps.append(facts)

    def _new(self, engine: int) -> deque[tuple]:
        if len(self._engines) >= 64:  # engines come and go (restarts): forget the oldest
            self._engines.pop(next(iter(self._engines)))
        steps = self._engines[engine] = deque(maxlen=self.size)
        return steps

    def around(self, first_id: int, last_id: int, since: float, context: int = CONTEXT_STEPS,
               facts: bool = True) -> list[StepFacts]:
        """The engine's steps from ``context`` steps before the earliest one that began at or after
        ``since`` (or ``first_id``, if earlier) through ``last_id``, in order. ``facts=False``: as the plain
        tuples the window keeps (``StepFacts``' fields, read by position: no record built per step)."""
        with self._lock:
            steps = self._engines.get(engine_of(first_id))
            if not steps:
                return []
            ids = _Ids(steps)
            lo = bisect.bisect_left(ids, first_id)
            hi = bisect.bisect_right(ids, last_id)
            while lo > 0 and steps[lo - 1][1] >= since:  # [1]: start
                lo -= 1
            lo = max(0, lo - context)
            if not facts:
                return [steps[i] for i in range(lo, hi)]
            return [StepFacts._make(steps[i]) for i in range(lo, hi)]


_NO_GRAMMAR = (0.0, 0)


class _Ids:
    """A deque of steps seen as the sequence of their ids, for ``bisect``."""

    __slots__ = ("_steps",)

    def __init__(self, steps: deque[tuple]) -> None:
        self._steps = steps

    def __len__(self) -> int:
        return len(self._steps)

    def __getitem__(self, i: int) -> int:
        return self._steps[i][0]


@dataclass(frozen=True, slots=True)
class SlowVerdict:
    cause: str
    seconds: dict[str, float] = field(default_factory=dict)  # per cause, over the phases judged

    def attributes(self) -> dict[str, object]:
        out: dict[str, object] = {sc.SLOW_CAUSE: self.cause}
        for cause in NAMES:
            out[BY_NAME[cause].attribute] = round(self.seconds.get(cause, 0.0), 6)
        return out


class _Ledger:
    """Seconds per cause, kept apart for the time before and after the first token."""

    def __init__(self, first_token: float | None) -> None:
        self.first_token = first_token if first_token is not None else float("inf")
        self.before: dict[str, float] = dict.fromkeys(NAMES, 0.0)
        self.after: dict[str, float] = dict.fromkeys(NAMES, 0.0)

    def add(self, cause: str, seconds: float, at: float) -> None:
        if seconds > 0:
            (self.before if at <= self.first_token else self.after)[cause] += seconds

    def add_span(self, cause: str, start: float, end: float) -> None:
        """An interval of time lost to ``cause``, split at the first token."""
        if end <= start:
            return
        cut = self.first_token
        if start < cut:
            self.before[cause] += min(end, cut) - start
        if end > cut:
            self.after[cause] += end - max(start, cut)


class _Baselines:
    """What a step costs when nothing unusual happens, from the steps around the request."""

    def __init__(self, steps: list[StepFacts]) -> None:
        by_batch: dict[int, list[float]] = {}
        plain: dict[int, list[float]] = {}  # the same without a grammar bitmask
        gaps: list[float] = []
        prev: StepFacts | None = None
        for s in steps:
            if s.prefill_tokens == 0 and s.preempted == 0 and s.decode_requests:
                found = by_batch.get(s.decode_requests)
                if found is None:
                    by_batch[s.decode_requests] = found = []
                found.append(s.end - s.start)
                if not s.grammar_s:
                    plain.setdefault(s.decode_requests, []).append(s.end - s.start)
            if prev is not None and s.step_id == prev.step_id + 1:
                gaps.append(max(0.0, s.start - prev.end))
            prev = s
        self._decode = {b: median(d) for b, d in by_batch.items() if len(d) >= MIN_SAMPLES}
        self._plain = {b: median(d) for b, d in plain.items() if len(d) >= MIN_SAMPLES}
        self.gap = median(gaps) if len(gaps) >= MIN_SAMPLES else None
        # what a short prompt costs: a step that computes a few tokens, i.e. the cheapest decode-only step
        self.shortest = min(self._decode.values()) if self._decode else None

    def decode(self, batch: int) -> float | None:
        """Median duration of decode-only steps of this decode batch size, else of the nearest size
        within a quarter of it; ``None`` when there is none to compare with."""
        return _nearest(self._decode, batch)

    def plain(self, batch: int) -> float | None:
        """As ``decode``, over the decode-only steps that computed no grammar bitmask."""
        return _nearest(self._plain, batch)


def prefill_loss(steps: list[StepFacts] | list[tuple], index: int) -> float | None:
    """What each decoding request of ``steps[index]`` (a step that computed prompt tokens) lost to them: the
    step's duration beyond the median decode-only step of its decode batch size among the ``CONTEXT_STEPS``
    steps before it; ``None`` when there is none to compare with. The one baseline of both the verdict's
    ``prefill_interference`` and the interference a prompt caused (engine_time.py): it reads only steps before
    the prefill step, which both the victims and the prompt's own request have seen, so the seconds a prompt
    is charged as caused are those its victims are charged as lost."""
    s = steps[index]
    usual = _decode_median(steps, max(0, index - CONTEXT_STEPS), index, s[DECODE_REQUESTS_AT])
    return None if usual is None else (s[_END_AT] - s[_START_AT]) - usual


# StepFacts' fields by position (the window keeps plain tuples of them: StepWindow.around(facts=False))
_START_AT, _END_AT, _PREEMPTED_AT, PREFILL_TOKENS_AT, DECODE_REQUESTS_AT = (
    StepFacts._fields.index(f) for f in ("start", "end", "preempted", "prefill_tokens", "decode_requests"))


def _decode_median(steps: list[StepFacts], lo: int, hi: int, batch: int) -> float | None:
    """``_Baselines(steps[lo:hi]).decode(batch)``, with medians of only the batch sizes ``_nearest`` may choose
    (a prefill step's baseline is asked once per step and per judged request: no median of the sizes it
    skips). The steps' fields are read by position (``StepFacts`` or the window's plain tuples)."""
    reach = max(1, batch // 4)
    durations: dict[int, list[float]] = {}
    for i in range(lo, hi):
        s = steps[i]
        b = s[DECODE_REQUESTS_AT]
        if b and -reach <= b - batch <= reach and s[PREFILL_TOKENS_AT] == 0 and s[_PREEMPTED_AT] == 0:
            found = durations.get(b)
            if found is None:
                durations[b] = found = []
            found.append(s[_END_AT] - s[_START_AT])
    return _nearest({b: median(d) for b, d in durations.items() if len(d) >= MIN_SAMPLES}, batch)


def _nearest(medians: dict[int, float], batch: int) -> float | None:
    found = medians.get(batch)
    if found is not None:
        return found
    reach = max(1, batch // 4)
    near = [b for b in medians if abs(b - batch) <= reach]
    if not near:
        return None
    return medians[min(near, key=lambda b: (abs(b - batch), b))]


def decide(t: RequestTimeline, window: StepWindow, breached: Iterable[str] = (), slo: Any = None) -> SlowVerdict:
    """The verdict on one finished request. ``breached``: the SLO objectives it missed (ttft, tpot,
    e2e); they choose the phases judged (none: the whole request, as for a slow or failed one).
    ``slo``: its objectives (``core.slo.SLO``: ``e2e``, ``tpot`` in seconds or None), for ``own_length``."""
    breached = tuple(breached)
    phases = [_PHASES[o] for o in breached if o in _PHASES]
    before = any(p[0] for p in phases) if phases else True
    after = any(p[1] for p in phases) if phases else True
    own = t.steps
    first_token = t.token_ts[0] if t.token_ts else None
    ledger = _Ledger(first_token)
    if not own:  # no engine step of it was recorded: nothing to decide with
        return SlowVerdict(sc.SLOW_UNKNOWN, {})
    queued = t.first(QUEUED)
    steps = window.around(own[0], own[-1], queued if queued is not None else float("inf"))
    by_id = {s.step_id: s for s in steps}
    admit = by_id.get(own[0])
    last = by_id.get(own[-1])
    end = t.token_ts[-1] if t.token_ts else (last.end if last is not None else None)
    if admit is None or last is None or end is None:  # its steps fell out of the window
        return SlowVerdict(sc.SLOW_UNKNOWN, {})
    start = queued if queued is not None else admit.start
    base = _Baselines(steps)
    covered = _preemptions(t, ledger, end)
    _kv_transfer(t, window.handoffs, ledger)
    grammar = sc.STRUCTURED_OUTPUT_BACKEND in t.request_attributes
    _queue(steps, admit, start, base, ledger, t.lora_id, window.max_loras, grammar)
    chunks: dict[int, int] = {}
    for c in t.chunks:
        chunks[c.step_id] = chunks.get(c.step_id, 0) + c.tokens
    _running(steps, admit, last, set(own), chunks, covered, base, ledger, grammar)
    h = t.handoff
    if h is not None and h.loaded and h.load_s:  # its KV load ran inside its prefill step: not prompt compute
        ledger.before[sc.SLOW_OWN_PREFILL] = max(0.0, ledger.before[sc.SLOW_OWN_PREFILL] - h.load_s)
    handed, frontend = _frontend(t, queued, window, ledger) if before else (0.0, 0.0)
    # the output side: the first output's delay ends TTFT, the last one's e2e (judged as far as it was charged)
    first_out, last_out = output_delays(t, window)
    late = 0.0
    if "ttft" in breached and first_out is not None:
        late += excess(first_out, window.outputs.usual(FIRST), _FRONTEND_FLOOR)
    if ("e2e" in breached or not phases) and last_out is not None:
        late += excess(last_out, window.outputs.usual(LAST), _FRONTEND_FLOOR)

    seconds = dict.fromkeys(NAMES, 0.0)
    judged = 0.0
    if before:
        # the hand-over counts as far as it was charged: what no comparable request says is usual is not judged
        judged += max(0.0, min(end, ledger.first_token) - start) + frontend
        for k, v in ledger.before.items():
            seconds[k] += v
    if after and first_token is not None:
        judged += max(0.0, end - first_token)
        for k, v in ledger.after.items():
            seconds[k] += v
        if "e2e" in breached and "tpot" not in breached and slo is not None and slo.e2e is not None:
            # its own length: the decode time beyond what the e2e SLO left it after its first token, less
            # what the other causes already explain of that time
            left = max(0.0, slo.e2e - (first_token - (start - handed)))
            others = sum(v for k, v in ledger.after.items() if k != sc.SLOW_UNKNOWN)
            seconds[sc.SLOW_OWN_LENGTH] += max(0.0, (end - first_token) - left - others)
    seconds[sc.SLOW_FRONTEND] += late
    judged += late
    return SlowVerdict(_dominant(seconds, judged), seconds)


def handover(t: RequestTimeline, window: StepWindow, queued: float | None = None) -> float | None:
    """Its frontend's hand-over: arrival (wall clock) to the engine's QUEUED stamp (monotonic), converted
    with ``window.wall_offset``; None without both stamps."""
    if queued is None:
        queued = t.first(QUEUED)
    if queued is None or not t.arrival:
        return None
    return queued - (t.arrival - window.wall_offset())


def output_delays(t: RequestTimeline, window: StepWindow) -> tuple[float | None, float | None]:
    """From the engine's stamp of its first (last) token to its Python frontend's receipt of that output (wall
    clock, converted with ``window.wall_offset``); None where no Python frontend received it or the token's
    stamp is unknown."""
    if not t.token_ts or not (t.first_output or t.last_output):
        return None, None
    offset = window.wall_offset()
    first = t.first_output - offset - t.token_ts[0] if t.first_output else None
    last = t.last_output - offset - t.token_ts[-1] if t.last_output else None
    return first, last


def note_frontend(t: RequestTimeline, window: StepWindow) -> None:
    """Every finished request's hand-over and output delays, the ``frontend`` cause's baselines (after its own
    verdict)."""
    found = handover(t, window)
    if found is not None:
        window.frontend.add(t.input_tokens, found, sc.STRUCTURED_OUTPUT_BACKEND in t.request_attributes)
    first, last = output_delays(t, window)
    if first is not None:
        window.outputs.add(FIRST, first)
    if last is not None:
        window.outputs.add(LAST, last)


_FRONTEND_FLOOR = BY_NAME[sc.SLOW_FRONTEND].floor  # the least excess it is charged for (causes.py says why)


def _frontend(t: RequestTimeline, queued: float | None, window: StepWindow, ledger: _Ledger) -> tuple[float, float]:
    """Its hand-over, arrival (wall) to QUEUED (engine monotonic), beyond comparable requests' usual one:
    charged to ``frontend``. Returns the hand-over's seconds (0 without both stamps) and those charged."""
    took = handover(t, window, queued)
    if took is None or took <= 0:
        return 0.0, 0.0
    usual = window.frontend.usual(t.input_tokens, sc.STRUCTURED_OUTPUT_BACKEND in t.request_attributes)
    charged = excess(took, usual, _FRONTEND_FLOOR)  # over the lower quartile, when beyond jitter and the floor
    if charged:
        ledger.add(sc.SLOW_FRONTEND, charged, queued)
    return took, charged


def _dominant(seconds: dict[str, float], judged: float) -> str:
    known = [(v, k) for k, v in seconds.items() if k != sc.SLOW_UNKNOWN]
    value, cause = max(known)
    if value <= 0 or value < MIN_SHARE * judged or value <= seconds[sc.SLOW_UNKNOWN]:
        return sc.SLOW_UNKNOWN
    return cause


def _preemptions(t: RequestTimeline, ledger: _Ledger, end: float) -> list[tuple[float, float]]:
    """Each preemption costs from the moment it was preempted until its next token (requeue and
    recompute); returns those intervals, which the other causes then leave alone."""
    out = []
    for preempted, rescheduled in t.preemptions():
        caught_up = end
        if rescheduled is not None:
            caught_up = next((ts for ts in t.token_ts if ts >= rescheduled), end)
        if caught_up > preempted:
            ledger.add_span(sc.SLOW_PREEMPTION, preempted, caught_up)
            out.append((preempted, caught_up))
    return out


def _kv_transfer(t: RequestTimeline, history: HandoffHistory, ledger: _Ledger) -> None:
    """A decode instance's KV load (or the wait for it): what it took beyond the median load of
    comparable requests (as many external tokens, to a power of two) on this instance. The load is part
    of the step that computes the rest of its prompt, its own work otherwise."""
    h = t.handoff
    if h is None or not h.loaded or h.load_end is None:
        return
    usual = history.median(h.external_tokens)
    if usual is not None:
        ledger.add(sc.SLOW_KV_TRANSFER, h.load_s - usual, h.load_end)


def _queue(steps: list[StepFacts], admit: StepFacts, queued: float, base: _Baselines, ledger: _Ledger,
           lora_id: int | None = None, max_loras: int | None = None, grammar: bool = False) -> None:
    """The time from QUEUED to the step that first scheduled it: each step it waited through is
    charged to the reason that step's admission stopped (or to the LoRA slot, where its adapter could
    not be loaded in that step; or to its grammar, where it has one and the step left only requests
    waiting for their grammar), with the gap after it up to the median gap; idle time beyond that is
    starvation."""
    waited = [s for s in steps if s.step_id < admit.step_id and s.start >= queued]
    chain = waited + [admit]
    prev = _before(steps, chain[0])
    if prev is None:  # the window does not reach back to its arrival (or the engine just started)
        ledger.add_span(sc.SLOW_UNKNOWN, queued, chain[0].start)
    elif prev.end < chain[0].start:  # the engine was idle when it arrived
        _gap(max(queued, prev.end), chain[0].start, base, ledger, None)
    for s, nxt in zip(waited, chain[1:]):
        if lora_waits(s, lora_id, max_loras):
            cause = sc.SLOW_QUEUE_LORA_SLOT
        elif s.blocked == BLOCKED_STRUCTURED_OUTPUT:  # no limit stopped admission: only grammars kept requests out
            cause = sc.SLOW_QUEUE_STRUCTURED_OUTPUT if grammar else sc.SLOW_UNKNOWN
        else:
            cause = _QUEUE_CAUSE.get(s.blocked, sc.SLOW_UNKNOWN)
        ledger.add_span(cause, s.start, s.end)
        if nxt.step_id != s.step_id + 1:  # steps missing (dropped records): their time is unknown
            ledger.add_span(sc.SLOW_UNKNOWN, s.end, nxt.start)
        else:
            _gap(s.end, nxt.start, base, ledger, cause)


def lora_waits(step: StepFacts, lora_id: int | None, max_loras: int | None) -> bool:
    """Whether a waiting request of adapter ``lora_id`` could not be admitted in ``step`` for want of a
    LoRA slot: the step ran ``max_loras`` adapters and its own was not one of them."""
    loras = step.loras
    return bool(lora_id and max_loras and loras and len(loras) >= max_loras and lora_id not in loras)


def _running(steps: list[StepFacts], admit: StepFacts, last: StepFacts, own: set[int], own_prefill: dict[int, int],
             covered: list[tuple[float, float]], base: _Baselines, ledger: _Ledger, grammar: bool = False) -> None:
    """From the step that first scheduled it to its last: its prompt's steps against a short prompt's
    (a decode-only step), its decode steps against decode-only steps of the same batch size, steps that
    skipped it, and the gaps between steps. ``own_prefill``: the steps that computed its prompt, with
    how many of its prompt tokens each computed."""
    index = {s.step_id: i for i, s in enumerate(steps)}
    span = [s for s in steps if admit.step_id <= s.step_id <= last.step_id]
    first_chunk = min(own_prefill, default=None)
    first_decode = next((s for s in span if s.step_id in own and s.step_id not in own_prefill), None)
    start_batch = base.decode(first_decode.decode_requests) if first_decode is not None else None
    prev: StepFacts | None = None
    for s in span:
        if _overlaps(s, covered):  # preempted: the preemption is charged for this time
            prev = s
            continue
        if prev is not None:
            if s.step_id != prev.step_id + 1:
                ledger.add_span(sc.SLOW_UNKNOWN, prev.end, s.start)
            else:
                _gap(prev.end, s.start, base, ledger, None)
        prev = s
        if s.step_id not in own:  # running, but the step left it out
            ledger.add_span(sc.SLOW_PREFILL_INTERFERENCE if s.prefill_tokens else sc.SLOW_UNKNOWN, s.start, s.end)
            continue
        if s.step_id in own_prefill:  # computing its own prompt: its own work, beyond what a short prompt costs
            usual = base.decode(s.decode_requests) if s.decode_requests else None
            if usual is None:
                usual = base.shortest
            if usual is not None and s.prefill_tokens:
                share = min(1.0, own_prefill[s.step_id] / s.prefill_tokens)
                # a short prompt takes one step: a chunked one's further steps are its own length's, whole
                beyond = s.duration - usual if s.step_id == first_chunk else s.duration
                ledger.add(sc.SLOW_OWN_PREFILL, beyond * share, s.end)
            continue
        if s.prefill_tokens:
            lost = prefill_loss(steps, index[s.step_id])
            if lost is None:  # how much of it was the others' prefill cannot be told
                ledger.add_span(sc.SLOW_UNKNOWN, s.start, s.end)
                continue
            ledger.add(sc.SLOW_PREFILL_INTERFERENCE, lost, s.end)
        usual = base.decode(s.decode_requests)
        if usual is None:
            continue
        if not s.prefill_tokens and s.grammar_s:
            ledger.add(sc.SLOW_GRAMMAR_INTERFERENCE, grammar_wait(s, base.plain(s.decode_requests), grammar), s.end)
        if start_batch is not None and s.decode_requests > first_decode.decode_requests:  # the batch grew
            ledger.add(sc.SLOW_BATCH_GROWTH, usual - start_batch, s.end)


def grammar_wait(s: StepFacts, usual: float | None, grammar: bool) -> float:
    """What a decode step's grammar bitmask cost one of its requests (``grammar``: it has a grammar itself):
    the step's time beyond a comparable step without a bitmask (``usual``), at most the bitmask's own time (vLLM
    computes it while the model runs, so only the part the forward did not hide delays the step), times the
    share of the mask that was other requests' (its own request's mask is its own work); 0 with nothing to
    compare with."""
    if usual is None or s.grammar_s <= 0:
        return 0.0
    k = s.grammar_requests
    share = 1.0 if not grammar else ((k - 1) / k if k > 1 else 0.0)
    return min(s.grammar_s, max(0.0, s.duration - usual)) * share


def _gap(start: float, end: float, base: _Baselines, ledger: _Ledger, usual_cause: str | None) -> None:
    """Engine idle time between two steps: the usual part is part of a step's cost (charged to
    ``usual_cause`` when it was waiting), the rest is starvation."""
    gap = end - start
    if gap <= 0 or (usual_cause is None and base.gap is not None and gap <= base.gap):
        return  # a usual gap while running: part of the step's cost, nothing to charge
    if base.gap is None:
        ledger.add_span(sc.SLOW_UNKNOWN, start, end)
        return
    usual = min(gap, base.gap)
    if usual_cause is not None:
        ledger.add_span(usual_cause, start, start + usual)
    ledger.add_span(sc.SLOW_ENGINE_STARVATION, start + usual, end)


def _before(steps: list[StepFacts], step: StepFacts) -> StepFacts | None:
    for i, s in enumerate(steps):
        if s.step_id == step.step_id:
            prev = steps[i - 1] if i else None
            return prev if prev is not None and prev.step_id == step.step_id - 1 else None
    return None


def _overlaps(s: StepFacts, intervals: list[tuple[float, float]]) -> bool:
    for lo, hi in intervals:
        if s.end > lo and s.start < hi:
            return True
    return False
