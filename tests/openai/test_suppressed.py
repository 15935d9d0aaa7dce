"""Inside OpenTelemetry's suppress-instrumentation context a call is the caller's alone: no span, no points."""

from __future__ import annotations

from typing import Any, Iterator

import openai
import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

from replay_server import ReplayServer, load


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as s:
        yield s


def test_a_suppressed_call_makes_no_span_and_sends_no_traceparent(client: Any, replay: ReplayServer) -> None:
    api = openai.OpenAI(base_url=replay.base_url("chat_text"), api_key="test", max_retries=0)
    replay.take()
    with suppress_instrumentation():
        api.chat.completions.create(**load("chat_text").request)
    assert client.finished() == []
    (received,) = replay.take()
    assert "traceparent" not in {k.lower() for k, _ in received.headers}
    api.chat.completions.create(**load("chat_text").request)  # and outside it, as always
    assert len(client.finished()) == 1
