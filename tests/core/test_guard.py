"""The guard owns the once-only warnings too: a feature we had to turn off is said once, not per request."""

from __future__ import annotations

import logging

from otel_llm.guard import Guard


def test_a_warning_is_given_once_per_key_and_guards_keep_their_own(caplog):
    guard, other = Guard(), Guard()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        assert guard.warn_once("feature", "otel-llm: %s is off", "feature")
        assert not guard.warn_once("feature", "otel-llm: %s is off", "feature")
        assert guard.warn_once("another", "otel-llm: another is off")
        assert other.warn_once("feature", "otel-llm: %s is off", "feature")  # its own record of what it told
    assert [r.getMessage() for r in caplog.records] == ["otel-llm: feature is off", "otel-llm: another is off",
                                                        "otel-llm: feature is off"]
