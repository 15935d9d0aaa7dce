"""Fixtures for the collector tests: a fake clock and a gateway on loopback port 0."""

from __future__ import annotations

from typing import Iterator

import pytest

from collector_testkit import FakeClock, loopback_config
from otel_llm_collector.gateway import Gateway


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def gateway(clock: FakeClock) -> Iterator[Gateway]:
    """A gateway on loopback with the default policies, decisions driven by ``clock``."""
    g = Gateway(loopback_config(), clock=clock, manual_ticks=True).start()
    yield g
    g.shutdown()


