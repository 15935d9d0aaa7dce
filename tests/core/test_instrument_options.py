"""``otel_llm.instrument(**options)`` takes exactly the rows of the options table (core/config.py OPTIONS),
the table the README prints: one declaration, so the two cannot drift apart again."""

from __future__ import annotations

import pytest

import otel_llm
from otel_llm.core.config import OPTIONS, Config


def test_every_option_of_the_table_is_accepted_by_instrument(otel):
    with otel.instrumented(max_spans_per_request=300, engine_step_service="{service}-steps") as inst:
        config = inst.telemetry.config
        assert (config.max_spans_per_request, config.engine_step_service) == (300, "{service}-steps")
    # and every row of the table is a keyword instrument() takes (here: the default, handed over explicitly)
    given = {o.name: o.default for o in OPTIONS if o.default is not None}
    with otel.instrumented(**given) as inst:
        assert inst.telemetry.config == Config.resolve(given)


def test_an_unknown_option_is_a_clear_error_naming_the_closest_one():
    with pytest.raises(TypeError, match=r"'max_span_per_request' \(did you mean 'max_spans_per_request'\?\)"):
        otel_llm.instrument(max_span_per_request=300)
    assert otel_llm.instrumented() == []  # nothing was instrumented on the way


@pytest.mark.parametrize("name,env,value,replaced", [
    ("token_times", "OTEL_LLM_TOKEN_TIMES", "stamps", "token times come from the engine-step records"),
    ("step_reading", "OTEL_LLM_STEP_READING", "deferred", "deferred reading on a background thread is gone"),
    ("one_path", "OTEL_LLM_ONE_PATH", "1", "the Python frontend enriches each request once"),
])
def test_a_retired_option_is_ignored_with_a_warning_naming_what_replaced_it(caplog, name, env, value, replaced):
    """An old deployment's variable or keyword keeps it serving (the option has no effect any more): the
    warning names the option as it was set and what does its job now; it is no option of the table."""
    assert name not in {o.name for o in OPTIONS} and not hasattr(Config(), name)
    with caplog.at_level("WARNING", logger="otel_llm"):
        assert Config.resolve({name: value}, environ={}) == Config()
    assert f"{name}={value!r} is a retired option and is ignored: " in caplog.text and replaced in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="otel_llm"):
        assert Config.resolve({}, environ={env: value}) == Config()
    assert f"{env}={value} is a retired option and is ignored: " in caplog.text and replaced in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="otel_llm"):
        Config.resolve({}, environ={})
    assert "retired" not in caplog.text
