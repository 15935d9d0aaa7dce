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
