"""Structured-output facts from the EngineCore (instrumentation/vllm/grammar.py, step_hooks.py): the grammar
bitmask's time per step and each request's cache hit, on the step record's wire and through the scheduler hooks
(the C methods hand such steps to the Python ones), the grammar waits through vLLM 0.28's queue, and the
backend on the request span through the contract's fallbacks. No engine is started."""

from __future__ import annotations

import itertools
import types

import pytest

from otel_llm import semconv as sc
from otel_llm.core.timeline import StepGrammar
from otel_llm.instrumentation.vllm import contract, grammar, step_hooks, step_wire

IDS = [f"cmpl-{i:032x}-0" for i in range(6)]


def _payload(n: int = 4, extras: step_wire.Extras | None = None, g: StepGrammar | None = None) -> tuple:
    shares = (IDS[:n], None, [9] * n, (), (), (), ())
    payload = (7 << 32 | 3, 1.0, 2.0, n, 0, 0, 0.5, shares, 0, 0.1, 0.8, 0.1, None, None)
    if extras is not None or g is not None:
        payload += (extras,)
    if g is not None:
        payload += (g,)
    return payload


@pytest.mark.parametrize("extras", [None, step_wire.Extras([1], [2], [1], (3,))])
@pytest.mark.parametrize("g", [StepGrammar(0.004, 3, (1,), (2, 3)), StepGrammar(None, 0, (), (0,))])
def test_the_grammar_block_round_trips_on_every_encoder_and_decoder(extras, g):
    data = step_wire.encode_py(_payload(extras=extras, g=g))
    assert step_wire.encode(_payload(extras=extras, g=g)) == data  # the C encoder hands it to Python
    for decode in (step_wire.decode_py, step_wire.decode):
        step = decode(data)
        assert step.grammar == g and tuple(step.grammar.hit_at) == g.hit_at
        assert (step.loras == (3,)) == (extras is not None)
    in_process = step_hooks.decode(_payload(extras=extras, g=g))
    assert in_process.grammar == g


def test_a_step_without_grammar_facts_has_none_on_every_decoder():
    data = step_wire.encode(_payload())
    assert step_wire.decode(data).grammar is None and step_wire.decode_py(data).grammar is None
    assert step_hooks.decode(_payload()).grammar is None


@pytest.mark.parametrize("g", [StepGrammar(0.1, 1, (4,), ()), StepGrammar(0.1, 1, (), (9,))])
def test_grammar_shares_beyond_the_step_are_refused(g):
    with pytest.raises(step_wire.WireError):
        step_wire.encode_py(_payload(g=g))
    good = step_wire.encode_py(_payload(g=StepGrammar(0.1, 1, (3,), ())))
    bad = bytearray(good)
    at = step_wire.HEADER.size + 4 * 4 + step_wire._GRAMMAR_COUNTS.size  # after the counts: the hit index
    bad[at:at + 4] = (40).to_bytes(4, "little")
    with pytest.raises(step_wire.WireError):
        step_wire.decode_py(bytes(bad))
    with pytest.raises(step_wire.WireError, match="grammar block"):
        step_wire.decode_py(good[:step_wire.HEADER.size + 4 * 4 + 10])


class _Key:
    def __init__(self, spec: str) -> None:
        self.structured_output_key = ("json", spec)


def _request(rid: str, spec: str, backend: str = "xgrammar") -> types.SimpleNamespace:
    return types.SimpleNamespace(request_id=rid, structured_output_request=_Key(spec),
                                 sampling_params=types.SimpleNamespace(
                                     structured_outputs=types.SimpleNamespace(_backend=backend)))


def test_a_grammar_is_a_hit_where_its_key_compiled_before_on_a_caching_backend():
    cache = grammar.GrammarCache()
    compiled = []

    def create(request):
        compiled.append(request.request_id)
        if request.request_id == "fails":
            raise ValueError("bad schema")
        return "grammar"

    for rid, spec, backend in (("a", "S", "xgrammar"), ("b", "S", "xgrammar"), ("c", "T", "xgrammar"),
                               ("d", "T", "guidance"), ("e", "U", "outlines"), ("f", "U", "outlines")):
        assert cache.compile(create, None, (_request(rid, spec, backend),), {}) == "grammar"
    with pytest.raises(ValueError):
        cache.compile(create, None, (_request("fails", "V"),), {})
    with pytest.raises(ValueError):  # a key whose compile failed was never compiled: still a miss
        cache.compile(create, None, (_request("fails", "V"),), {})
    assert cache.compile(create, None, (), {"request": _request("g", "V")}) == "grammar"
    taken = {rid: cache.take(rid) for rid in "abcdefg"}
    assert taken == {"a": False, "b": True, "c": False, "d": False, "e": False, "f": True, "g": False}
    assert cache.take("a") is None and "fails" not in cache.pending  # once; nothing for a failed compile


def test_the_notes_are_bounded(monkeypatch):
    monkeypatch.setattr(grammar, "SEEN", 3)
    monkeypatch.setattr(grammar, "PENDING", 2)
    cache = grammar.GrammarCache()
    for i in range(5):
        cache.compile(lambda r: None, None, (_request(f"r{i}", f"S{i}"),), {})
    assert len(cache.seen) == 3 and list(cache.pending) == ["r3", "r4"]
    cache.compile(lambda r: None, None, (_request("again", "S0"),), {})  # forgotten: a miss
    assert cache.take("again") is False


def test_another_vllms_request_gets_no_fact_and_compiles_all_the_same():
    cache = grammar.GrammarCache()
    assert cache.compile(lambda r: "g", None, (object(),), {}) == "g"
    assert cache.pending == {}


def _hooks(monkeypatch) -> tuple[step_hooks.StepHooks, list]:
    hooks = step_hooks.StepHooks()
    sent: list = []
    hooks.sink = sent.append
    ticks = itertools.count()
    monkeypatch.setattr(step_hooks, "perf_counter", lambda: next(ticks) * 0.5)
    return hooks, sent


def test_the_bitmask_hook_times_a_mask_and_keeps_it_with_its_step(monkeypatch):
    hooks, _ = _hooks(monkeypatch)
    out, plain = object(), object()
    hooks.pending[id(out)] = tuple(range(10))
    hooks.pending[id(plain)] = tuple(range(10))
    mask = types.SimpleNamespace(structured_output_request_ids=IDS[:3])
    assert hooks.grammar_bitmask(lambda o: mask, None, (out,), {}) is mask
    assert hooks.grammar_bitmask(lambda o: None, None, (plain,), {}) is None  # no structured request
    assert hooks.pending[id(out)][10] == [0.5, 3, (), ()]
    assert len(hooks.pending[id(plain)]) == 10  # stays a plain step (the C path's)
    hooks.pending[id(out)] = tuple(range(10)) + ([None, 0, [4], []],)  # new requests' facts kept by schedule()
    hooks.grammar_bitmask(lambda scheduler_output: mask, None, (), {"scheduler_output": out})
    assert hooks.pending[id(out)][10] == [0.5, 3, [4], []]
    hooks.sink = None  # disarmed: nothing timed
    assert hooks.grammar_bitmask(lambda o: mask, None, (object(),), {}) is mask
    assert hooks.guard.errors == {}


def test_schedule_takes_the_new_requests_hits_and_misses(monkeypatch):
    hooks, _ = _hooks(monkeypatch)
    hooks.grammars.pending.update({"new1": True, "new2": False})
    new = [types.SimpleNamespace(req_id=r) for r in ("plain", "new1", "new2")]
    entry = hooks._grammar_facts(tuple(range(10)), new, 6)  # the step's 6 shares: the new ones last
    assert entry[10] == [None, 0, [4], [5]] and hooks.grammars.pending == {}
    assert hooks._grammar_facts(tuple(range(10)), new, 6) == tuple(range(10))  # nothing noted: unchanged


def test_grammar_waits_are_read_from_vllm_028s_queue_too():
    grammar_wait = types.SimpleNamespace(status=types.SimpleNamespace(name="WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR"))
    other = types.SimpleNamespace(status=types.SimpleNamespace(name="WAITING_FOR_REMOTE_KVS"))
    assert step_hooks._grammar_waits(types.SimpleNamespace(deferred_waiting=[other, grammar_wait]))
    assert not step_hooks._grammar_waits(types.SimpleNamespace(deferred_waiting=[other]))
    assert step_hooks._grammar_waits(types.SimpleNamespace(skipped_waiting=[other, grammar_wait]))  # vLLM 0.28
    assert not step_hooks._grammar_waits(types.SimpleNamespace())


def test_the_backend_attribute_through_the_contract_and_its_fallbacks():
    fence = contract.Contract()
    params = types.SimpleNamespace(structured_outputs=types.SimpleNamespace(_backend="guidance"))
    assert grammar.backend_attribute(params, fence) == "guidance"
    assert grammar.backend_attribute(types.SimpleNamespace(structured_outputs=types.SimpleNamespace(_backend=None)),
                                     fence) == "auto"
    assert grammar.backend_attribute(types.SimpleNamespace(structured_outputs=None), fence) is None
    fence.missing["StructuredOutputsParams._backend"] = "missing"  # a release without the private field
    assert grammar.backend_attribute(params, fence) == "auto"
    fence.missing["SamplingParams.structured_outputs"] = "missing"
    assert grammar.backend_attribute(params, fence) is None


def test_the_step_anatomy_carries_the_bitmask_time():
    from otel_llm.core.diagnosis.anatomy import StepDiagnosis

    step = step_wire.decode_py(step_wire.encode_py(_payload(g=StepGrammar(0.004, 3, (), ()))))
    attrs = StepDiagnosis().attributes(step)
    assert attrs[sc.STEP_GRAMMAR_TIME] == 0.004 and attrs[sc.STEP_GRAMMAR_REQUESTS] == 3
    for g in (None, StepGrammar(None, 0, (1,), ())):  # no mask computed: no bitmask time
        step.grammar = g
        assert sc.STEP_GRAMMAR_TIME not in StepDiagnosis().attributes(step)
