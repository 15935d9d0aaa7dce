"""Token times from engine steps (core/step_tokens.py): which of a request's steps produced an output."""

from otel_llm.core.step_tokens import TokenWindow, output_times, token_times
from otel_llm.core.timeline import StepRecord


def _step(n: int, end: float, ids: list[str], tokens: list[int] | None = None, prefill_at: tuple = (),
          contexts: list[int] | None = None) -> StepRecord:
    step = StepRecord.of_lists(n, end - 0.001, end, ids, tokens, list(prefill_at))
    step.contexts = contexts if contexts is not None else [0] * len(ids)
    return step


def test_chunked_prefill_then_decodes():
    steps = [
        _step(1, 1.0, ["a", "b"], [1, 6], prefill_at=(1,), contexts=[20, 0]),  # b's first chunk: 6 of 10
        _step(2, 2.0, ["a", "b"], [1, 4], prefill_at=(1,), contexts=[21, 6]),  # completes: b's first token
        _step(3, 3.0, ["a", "b"], contexts=[22, 10]),
        _step(4, 4.0, ["b"], contexts=[11]),
    ]
    assert token_times("b", steps, TokenWindow(2.0, 4.0, 3, 10)) == [2.0, 3.0, 4.0]


def test_steps_after_the_last_token_and_before_the_first_do_not_count():
    # a step in flight when the frontend let it go (a stop string, async scheduling) produced nothing it saw
    steps = [_step(1, 0.5, ["a"], [8], (0,), [0]), _step(2, 1.0, ["a"]), _step(3, 2.0, ["a"]),
             _step(4, 3.0, ["a"])]
    assert token_times("a", steps, TokenWindow(1.0, 2.0, 2, 8)) == [1.0, 2.0]


def test_a_recompute_after_a_preemption_outputs_when_it_has_recomputed_its_outputs_too():
    steps = [
        _step(1, 1.0, ["a"], [4], (0,), [0]),  # prompt of 4: first token
        _step(2, 2.0, ["a"], contexts=[4]),  # second token
        # preempted; recomputes prompt + 2 outputs = 6 tokens in chunks of 3
        _step(3, 3.0, ["a"], [3], (0,), [0]),
        _step(4, 4.0, ["a"], [3], (0,), [3]),  # 3 + 3 >= 4 + 2: the third token
        _step(5, 5.0, ["a"], contexts=[6]),
    ]
    assert token_times("a", steps, TokenWindow(1.0, 5.0, 4, 4)) == [1.0, 2.0, 4.0, 5.0]


def test_steps_that_do_not_add_up_to_vllms_count_give_nothing():
    steps = [_step(1, 1.0, ["a"], [4], (0,), [0]), _step(3, 3.0, ["a"], contexts=[5])]  # step 2 lost
    assert token_times("a", steps, TokenWindow(1.0, 3.0, 3, 4)) is None
    assert token_times("a", [], TokenWindow(1.0, 1.0, 1, 4)) is None


def _served(rng, rid: str, prompt: int, outputs: int) -> list[StepRecord]:
    """A request's steps as a scheduler makes them: prompt chunks (from a cached context), decodes, now and
    then a preemption that recomputes the prompt and its outputs, and a step past its last output."""
    steps, end, context, made = [], 1.0, rng.choice((0, 0, 16)), 0
    while made < outputs + 1:
        end += rng.uniform(0.01, 0.03)
        others = [f"x{k}" for k in range(rng.randint(0, 3))]
        ids = others[:1] + [rid] + others[1:]
        i = ids.index(rid)
        tokens = [1] * len(ids)
        if context < prompt + made:  # a prompt chunk (or a recompute's)
            tokens[i] = chunk = min(rng.randint(1, 24), prompt + made - context)
            step = _step(len(steps) + 1, end, ids, tokens, (i,), [7] * len(ids))
            step.contexts[i] = context
            context += chunk
            made += context >= prompt + made
        else:
            step = _step(len(steps) + 1, end, ids, None, (), [7] * len(ids))
            step.contexts[i] = context
            context += 1
            made += 1
        steps.append(step)
        if made and made < outputs and rng.random() < 0.05:  # preempted: everything computed again
            context = 0
    return steps


def test_outputs_placed_once_are_what_the_window_rule_places():
    """The one placement (``output_times``: the engine's count bounds it) gives, for every request, the token
    times the frontend's window rule gives over the window its own first, last and count make: the agent
    places an engine-sourced request's outputs once and the pipeline takes them as they are."""
    import random

    rng = random.Random(7)
    for _ in range(500):
        prompt, outputs = rng.randint(1, 60), rng.randint(1, 12)
        steps = _served(rng, "r", prompt, outputs)
        times, cached = output_times("r", steps, prompt, outputs)
        assert len(times) == outputs
        assert cached == (steps[0].contexts[steps[0].ids.index("r")] if steps[0].prefill_at else None)
        assert token_times("r", steps, TokenWindow(times[0], times[-1], outputs, prompt)) == times
        fewer = rng.randint(1, outputs)  # the frontend's count, where a stop string ended it early
        assert output_times("r", steps, prompt, fewer).times == times[:fewer]
    assert output_times("r", [], 4, 3) == ([], None)
