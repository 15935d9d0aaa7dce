"""The client span holds only what the trace contract's client row declares (core/trace_contract.py,
the README's trace-contract table): every recorded exchange, streamed or not, plain or raw, with and
without content capture. A new attribute needs its entry in the row, so the README stays the truth."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from otel_llm.core.trace_contract import CLIENT_SPAN
from replay_calls import call
from replay_server import ReplayServer, all_names, load


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as s:
        yield s


@pytest.mark.parametrize("capture", [False, True])
def test_client_spans_carry_only_the_contracts_attributes(client: Any, replay: ReplayServer, capture: bool) -> None:
    client.reinstrument(capture_content=capture)
    try:
        for name in all_names():
            call("sync", replay.base_url(name), load(name))
        spans = client.finished()
    finally:
        client.reinstrument()
    assert len(spans) == len(all_names())  # one span a call (so the check below saw them all)
    declared = set(CLIENT_SPAN.attribute_names())
    seen: set[str] = set()
    for span in spans:
        extra = set(span.attributes) - declared
        assert not extra, f"{span.name} carries {sorted(extra)}: add them to CLIENT_SPAN in core/trace_contract.py"
        assert not span.events
        seen |= set(span.attributes)
    assert len(seen) > 20  # the recordings exercise most of the row
