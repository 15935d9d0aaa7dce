"""The frozen state every wrapper closes over, built once at ``instrument()`` (its own module so that
``record``, ``stream`` and ``wrappers`` all import it and none imports another in a circle)."""

from __future__ import annotations

from opentelemetry.trace import Tracer

from ...core.client_metrics import ClientMetrics
from ...core.config import Config
from ...guard import Guard

PROVIDER = "openai"


class ClientState:
    provider = PROVIDER

    def __init__(self, config: Config, tracer: Tracer, metrics: ClientMetrics, guard: Guard) -> None:
        self.config = config
        self.guard = guard  # the instrumentor's: every wrapper, record and stream proxy counts its errors there
        self.tracer = tracer
        self.metrics = metrics
