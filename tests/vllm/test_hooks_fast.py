"""The scheduler hooks' C methods (``_hooks_fast.c``): on x86-64 they must be built (else CI would test only the
Python hooks), and on every step they must leave what the Python methods leave: the same records to the sink,
the same state kept between calls, the same errors counted. Two stand-in schedulers run the same steps, one
wrapped by the C methods, one by the Python ones; the C side also counts the steps it handed to Python, so a
test also shows which steps the C path takes itself (the steady ones) and which it hands on."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import platform
import sys
import types
from typing import Any, Callable

import pytest

from otel_llm.instrumentation.vllm import step_hooks
from otel_llm.instrumentation.vllm.model_timing import MODEL_TIME_ATTR
from otel_llm.instrumentation.vllm.worker_facts import WORKER_FACTS_ATTR
from otel_llm.instrumentation.wraps import WrapTable

X86_64 = platform.machine() in ("x86_64", "AMD64")
fast = pytest.mark.skipif(step_hooks.fast_methods() is None, reason=f"no C hook methods: {step_hooks.FAST_REASON}")


def test_the_c_methods_are_built_on_x86_64():
    """`pip install -e .` (setup.py) builds them wherever there is a compiler, like the step encoder."""
    if X86_64:
        from otel_llm.instrumentation.vllm import _hooks_fast  # ImportError here: build it (pip install -e .)

        assert step_hooks.fast_methods() is _hooks_fast and step_hooks.FAST_REASON is None


class Counting(step_hooks.StepHooks):
    """StepHooks that count the steps the C methods hand to the Python ones (the Python methods call them too:
    the Python side's hooks are plain StepHooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[str] = []

    def scheduled(self, *a: Any) -> None:
        self.handed.append("scheduled")
        super().scheduled(*a)

    def updated(self, *a: Any) -> None:
        self.handed.append("updated")
        super().updated(*a)

    def update_from_output(self, *a: Any) -> Any:
        self.handed.append("update_from_output")
        return super().update_from_output(*a)


class Waiting(list):
    def peek_request(self) -> Any:
        return self[0]


_made = itertools.count()


class Engine:
    """A stand-in ``Scheduler`` class in a module of its own, its two methods wrapped by one StepHooks, through
    the C methods (``c``) or the Python ones; each step's scheduler output and outputs are set before the call."""

    def __init__(self, c: bool) -> None:
        from vllm.v1.core.sched.output import CachedRequestData

        self.cached_type = CachedRequestData
        name = f"_hooks_fast_stand_in_{next(_made)}"
        module = types.ModuleType(name)
        engine = self

        class Scheduler:
            def schedule(self) -> Any:
                if engine.raise_in_schedule:
                    raise RuntimeError("vLLM's own")
                return engine.out

            def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
                engine.seen.append((scheduler_output, model_runner_output))
                return engine.result

        Scheduler.__module__ = name
        module.Scheduler = Scheduler
        sys.modules[name] = module
        self.cls, self.original = Scheduler, Scheduler.__dict__["schedule"]
        self.hooks = hooks = Counting() if c else step_hooks.StepHooks()
        ticks = itertools.count(1)
        hooks.clock = lambda: next(ticks) * 0.25  # the same times on both sides
        self.records: list = []
        hooks.sink = self.records.append
        hooks.prefix = 7 << 32
        targets = hooks.targets(name)
        if not c:
            targets = [dataclasses.replace(t, method=None) for t in targets]
        self.table = WrapTable(targets, hooks.guard)
        self.table.wrap()
        self.scheduler = Scheduler()
        self.scheduler.__dict__.update(
            requests={}, running=[], waiting=Waiting(), lora_config=None, block_size=16,
            kv_cache_manager=types.SimpleNamespace(usage=0.5, block_pool=types.SimpleNamespace(
                get_num_free_blocks=lambda: 4)),
            max_num_running_reqs=256, max_num_active_reqs=256, max_num_scheduled_tokens=8192,
            num_sampled_tokens_per_step=1)
        self.out: Any = None
        self.result: Any = None
        self.seen: list = []
        self.raise_in_schedule = False

    def output(self, ids: list[str], computed: list[int], outputs: list[int], scheduled: dict | None = None,
               new: tuple = (), resumed: tuple = (), preempted: tuple = (), spec: dict | None = None) -> Any:
        cached = self.cached_type.make_empty()
        cached.req_ids, cached.num_computed_tokens, cached.num_output_tokens = list(ids), list(computed), list(outputs)
        cached.resumed_req_ids = set(resumed)
        scheduled = dict.fromkeys(ids, 1) if scheduled is None else scheduled
        return types.SimpleNamespace(
            num_scheduled_tokens=scheduled, preempted_req_ids=set(preempted), finished_req_ids=set(),
            total_num_scheduled_tokens=sum(scheduled.values()), scheduled_cached_reqs=cached,
            scheduled_spec_decode_tokens=spec or {}, num_invalid_spec_tokens=None, scheduled_new_reqs=list(new))

    def step(self, out: Any, result: Any = "stamp", model_output: Any = None, schedule_only: bool = False) -> None:
        self.out = out
        self.result = {0: types.SimpleNamespace(timestamp=1e6)} if result == "stamp" else result
        mo = types.SimpleNamespace() if model_output is None else model_output
        assert self.scheduler.schedule() is out
        if not schedule_only:
            assert self.scheduler.update_from_output(out, mo) is self.result

    def state(self) -> dict:
        h = self.hooks
        return {"records": self.records, "pending": sorted(map(_plain, h.pending.values())), "last_end": h.last_end,
                "recompute": dict(h.recompute), "model": sorted(h.model.values(), key=repr),
                "errors": dict(h.guard.errors)}


def _plain(entry: tuple) -> tuple:
    return tuple(tuple(x) if isinstance(x, (list, tuple)) else x for x in entry)


def both(steps: Callable[[Engine], None]) -> tuple[Engine, Engine]:
    """The same steps on a C-wrapped and a Python-wrapped stand-in: their records and state must be equal."""
    c, py = Engine(True), Engine(False)
    steps(c)
    steps(py)
    assert c.state() == py.state()
    return c, py


IDS = [f"cmpl-{i:032x}-0" for i in range(64)]


@fast
def test_the_c_methods_stand_in_the_class():
    c = Engine(True)
    method = c.cls.__dict__["schedule"]
    assert type(method).__name__ == "HookMethod" and method.__wrapped__ is c.original
    assert method.__name__ == "schedule" and method.__qualname__ == c.original.__qualname__
    assert "engine.out" in inspect.getsource(c.cls.schedule)  # inspect follows __wrapped__
    c.table.unwrap()
    assert c.cls.__dict__["schedule"] is c.original


@fast
def test_a_steady_decode_batch_is_kept_and_sent_in_c():
    def steps(e: Engine) -> None:
        e.scheduler.running = list(range(64))
        for n in range(5):
            e.step(e.output(IDS, [100 + n] * 64, [5 + n] * 64))

    c, _ = both(steps)
    assert c.hooks.handed == ["scheduled"]  # the first step picks the readers, in Python
    assert len(c.records) == 5 and c.records[-1][0] == (7 << 32) + 5
    assert c.records[1][12] == 0.25  # idle: from the last step's end to this one's start


@fast
def test_chunks_idle_outputs_waiting_and_preempted_steps_match():
    """Shares with several tokens (vLLM's dict in the ids' order and not), shares with no output yet, a queue
    behind the batch (each of _queue_blocked's answers), a preemption: all taken in C."""
    def steps(e: Engine) -> None:
        s = e.scheduler
        s.running = list(range(8))
        ids = IDS[:8]
        e.step(e.output(ids, [10] * 8, [1] * 8))
        e.step(e.output(ids, [10] * 8, [1] * 8, scheduled={r: 1 + i for i, r in enumerate(ids)}))
        e.step(e.output(ids, [10] * 8, [1] * 8, scheduled={r: 2 for r in reversed(ids)}))
        e.step(e.output(ids, [10] * 8, [0, 1, 0, 1, 1, 1, 1, 0]))
        s.waiting = Waiting([types.SimpleNamespace(num_tokens=100, num_computed_tokens=0)])
        e.step(e.output(ids, [10] * 8, [1] * 8))  # the head needs 7 blocks, 4 are free
        s.max_num_scheduled_tokens = 8
        e.step(e.output(ids, [10] * 8, [1] * 8))  # the token budget
        s.max_num_active_reqs = 8
        e.step(e.output(ids, [10] * 8, [1] * 8))  # max seqs
        e.step(e.output(ids, [10] * 8, [1] * 8, preempted=(ids[0],)))
        s.waiting = Waiting()
        e.step(e.output(ids, [10] * 8, [1] * 8, preempted=(ids[0],)))

    c, _ = both(steps)
    assert c.hooks.handed == ["scheduled"]  # the readers
    assert [r[8] for r in c.records][4:8] == [step_hooks.BLOCKED_KV_CACHE, step_hooks.BLOCKED_TOKEN_BUDGET,
                                             step_hooks.BLOCKED_MAX_SEQS, step_hooks.BLOCKED_KV_CACHE]


@fast
def test_steps_with_prompt_entries_lora_or_drafts_go_to_python():
    """New, resumed and recomputing requests, an engine with LoRA adapters, a verify step: the Python methods'."""
    def steps(e: Engine) -> None:
        s = e.scheduler
        ids = IDS[:4]
        s.requests = {r: types.SimpleNamespace(num_prompt_tokens=20, lora_request=None) for r in ids}
        e.step(e.output(ids, [30] * 4, [3] * 4))
        new = types.SimpleNamespace(req_id="new", num_computed_tokens=0, prompt_len=20, prefill_token_ids=None)
        e.step(e.output(ids, [30] * 4, [3] * 4, new=(new,), scheduled={**dict.fromkeys(ids, 1), "new": 20}))
        e.step(e.output(ids, [0, 30, 30, 30], [3] * 4, resumed=(ids[0],), scheduled={ids[0]: 8, **dict.fromkeys(ids[1:], 1)}))
        e.step(e.output(ids, [8, 30, 30, 30], [3] * 4, scheduled={ids[0]: 14, **dict.fromkeys(ids[1:], 1)}))  # recomputing
        e.step(e.output(ids, [30] * 4, [4] * 4))  # done recomputing: steady again
        e.hooks.spec_on = True
        e.step(e.output(ids, [30] * 4, [4] * 4, spec={r: [9, 9] for r in ids},
                        scheduled=dict.fromkeys(ids, 3)),
               model_output=types.SimpleNamespace(sampled_token_ids=[[7, 7]] * 4,
                                                  req_id_to_index={r: i for i, r in enumerate(ids)}))
        e.hooks.spec_on = False
        e.hooks.lora_on = True
        s.lora_config = types.SimpleNamespace(max_loras=2)
        e.step(e.output(ids, [31] * 4, [5] * 4))  # no request with an adapter: the record is sent in C
        s.requests[ids[1]].lora_request = types.SimpleNamespace(lora_int_id=3, lora_name="a")
        e.step(e.output(ids, [32] * 4, [6] * 4))

    c, _ = both(steps)
    # the readers (a steady step); a new request, a resumed one, its recompute: schedule() in Python, the record
    # sent in C; the steady step after: all in C; the verify step: its update_from_output in Python; the LoRA
    # engine: schedule() in Python, and with an adapter in the batch its record too
    assert c.hooks.handed == ["scheduled", "scheduled", "scheduled", "scheduled", "update_from_output", "updated",
                              "scheduled", "scheduled", "updated"]
    assert c.records[5][14].spec_at == [0, 1, 2, 3] and c.records[-1][14].loras == (3,)  # drafts, the adapter
    assert c.hooks.guard.errors == {}


@fast
def test_model_times_worker_facts_and_stamps_match():
    def steps(e: Engine) -> None:
        ids = IDS[:3]
        e.step(e.output(ids, [5] * 3, [1] * 3))
        e.step(e.output(ids, [5] * 3, [1] * 3), model_output=types.SimpleNamespace(**{MODEL_TIME_ATTR: 0.125}))
        out = e.output(ids, [5] * 3, [1] * 3)
        e.hooks.model[id(out)] = 0.375  # the in-process timer's, under the step's key
        e.step(out)
        out = e.output(ids, [5] * 3, [1] * 3)
        e.hooks.model[id(out) + 1] = 0.5  # another step's: stays
        e.step(out)
        e.step(e.output(ids, [5] * 3, [1] * 3), model_output=types.SimpleNamespace(**{WORKER_FACTS_ATTR: {"version": 1, "draft_s": 0.01}}))
        for result in (None, {}, {0: types.SimpleNamespace(timestamp=0.0)}, {0: types.SimpleNamespace(timestamp=0.1)}):
            e.step(e.output(ids, [5] * 3, [1] * 3), result=result)
        e.hooks.model.clear()

    c, py = both(steps)
    assert c.hooks.handed == ["scheduled", "updated"]  # the readers; the worker's facts
    assert [r[13] for r in c.records][:4] == [None, 0.125, 0.375, None]
    assert c.hooks.model == {} and len(c.records) == 9
    # no result, no outputs, a zero stamp, a stamp before the call: the hook's own end (its clock after the
    # call, the step's last tick: schedule_s, execute_s and output_s tile start..end in quarters)
    for r in c.records[-4:]:
        assert r[2] == r[1] + r[9] + r[10] + r[11] and r[11] == 0.25
    assert c.records[0][2] == 1e6


@fast
def test_errors_are_counted_alike_and_never_reach_the_engine():
    def steps(e: Engine) -> None:
        ids = IDS[:3]
        e.step(e.output(ids, [5] * 3, [1] * 3))
        manager = e.scheduler.kv_cache_manager
        del e.scheduler.kv_cache_manager  # schedule()'s hook fails: no record for this step
        e.step(e.output(ids, [5] * 3, [1] * 3))
        e.scheduler.kv_cache_manager = manager
        e.hooks.sink = _broken_sink  # the sink fails: counted, the engine's result still returned
        e.step(e.output(ids, [5] * 3, [1] * 3))
        e.hooks.sink = e.records.append
        e.raise_in_schedule = True
        with pytest.raises(RuntimeError, match="vLLM's own"):
            e.scheduler.schedule()
        e.raise_in_schedule = False
        e.step(e.output(ids, [5] * 3, [1] * 3))

    c, _ = both(steps)
    assert c.hooks.guard.errors == {"scheduler.schedule hook": 1, "scheduler.update_from_output hook": 1}
    assert len(c.records) == 2


def _broken_sink(payload: Any) -> None:
    raise OSError("full")


@fast
def test_pending_stays_bounded_and_a_disarmed_or_unwrapped_hook_calls_through():
    def steps(e: Engine) -> None:
        ids = IDS[:2]
        e.step(e.output(ids, [5] * 2, [1] * 2))
        for _ in range(70):  # update_from_output never comes
            e.step(e.output(ids, [5] * 2, [1] * 2), schedule_only=True)
        assert len(e.hooks.pending) <= 65
        e.hooks.pending.clear()
        e.step(e.output(ids, [5] * 2, [1] * 2))
        e.hooks.sink = None
        e.step(e.output(ids, [5] * 2, [1] * 2))
        e.hooks.sink = e.records.append
        e.table._active = False
        e.step(e.output(ids, [5] * 2, [1] * 2))
        e.table._active = True

    c, _ = both(steps)
    assert len(c.records) == 2 and len(c.seen) == 4


@fast
def test_keyword_calls_go_to_python():
    def steps(e: Engine) -> None:
        ids = IDS[:2]
        e.step(e.output(ids, [5] * 2, [1] * 2))
        out = e.output(ids, [5] * 2, [1] * 2)
        e.out, e.result = out, {}
        e.scheduler.schedule()
        e.scheduler.update_from_output(scheduler_output=out, model_runner_output=types.SimpleNamespace())

    c, _ = both(steps)
    assert c.hooks.handed == ["scheduled", "update_from_output", "updated"] and len(c.records) == 2


@fast
def test_a_step_with_a_grammar_bitmask_or_new_grammars_goes_to_python(monkeypatch):
    """A step whose bitmask was timed (grammar.py) or whose new requests' grammars were noted: the pending entry
    carries the facts, so the C method hands its record to the Python one, which sends them as the 16th item;
    a step whose scheduler returned no mask stays the C path's steady step."""
    ticks = itertools.count()
    monkeypatch.setattr(step_hooks, "perf_counter", lambda: next(ticks) * 0.5)  # the same times on both sides
    mask = types.SimpleNamespace(structured_output_request_ids=IDS[:2])

    def steps(e: Engine) -> None:
        ids = IDS[:4]
        e.step(e.output(ids, [5] * 4, [1] * 4))  # the readers
        for made in (mask, None):
            out = e.output(ids, [6] * 4, [2] * 4)
            e.step(out, schedule_only=True)
            assert e.hooks.grammar_bitmask(lambda o: made, e.scheduler, (out,), {}) is made
            e.scheduler.update_from_output(out, types.SimpleNamespace())
        e.hooks.grammars.pending["new"] = False  # its grammar was compiled anew
        new = types.SimpleNamespace(req_id="new", num_computed_tokens=0, prompt_len=20, prefill_token_ids=None)
        e.step(e.output(ids, [7] * 4, [3] * 4, new=(new,), scheduled={**dict.fromkeys(ids, 1), "new": 20}))

    c, _ = both(steps)
    assert c.hooks.handed == ["scheduled", "updated", "scheduled", "updated"]
    assert c.records[1][15] == step_hooks.StepGrammar(0.5, 2, (), ()) and c.records[1][14] is None
    assert len(c.records[2]) == 14  # no mask: a plain step, sent in C
    assert c.records[3][15] == step_hooks.StepGrammar(None, 0, (), (4,))
    assert c.hooks.guard.errors == {}
