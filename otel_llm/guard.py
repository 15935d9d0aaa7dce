"""Telemetry never breaks inference: our errors are caught, logged once per site, and counted.

A ``Guard`` belongs to an owner, never to the module: each frontend instrumentor holds one (``GuardOwner``;
the instrumentor is a singleton, so one per process and kind), as does the object the vLLM plugin makes in a
spawned EngineCore or worker (``plugin.EngineSide``). The owner hands it by constructor to what it builds;
``otel_llm.stats()`` sums the guards of the owners alive in the process (``total``).
"""

from __future__ import annotations

import logging
from collections import Counter
from functools import cached_property
from typing import Callable, Iterable

logger = logging.getLogger("otel_llm")


class Guard:
    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()
        self.told: set[str] = set()  # the warnings given once (``warn_once``)
        # told after each error is counted: a vLLM worker's relay to the frontend (engine_errors.worker_errors)
        self.listeners: list[Callable[[], None]] = []

    def warn_once(self, key: str, message: str, *args: object) -> bool:
        """Log ``message`` as a warning the first time ``key`` is told; True then. A feature we had to turn
        off is said once per owner (an instrumentor: once per process), not per request."""
        if key in self.told:
            return False
        self.told.add(key)
        logger.warning(message, *args)
        return True

    def failed(self, site: str, exc: BaseException) -> None:
        """Record an instrumentation error at ``site``; the host's work goes on untouched."""
        first = site not in self.errors
        self.errors[site] += 1
        if first:
            logger.warning("otel-llm: instrumentation error at %s (further ones are counted, not logged): %r",
                           site, exc, exc_info=exc)
        for listener in self.listeners:
            try:
                listener()
            except Exception:  # a listener's failure is no reason to fail the host's work
                pass


class GuardOwner:
    """Mixin for an owner made once and kept (a ``BaseInstrumentor``, a singleton, has no ``__init__`` of
    its own to make it in): its guard, made on first use and kept for the owner's life."""

    @cached_property
    def guard(self) -> Guard:
        return Guard()


def total(guards: Iterable[Guard]) -> dict[str, int]:
    """The errors of several guards, summed site by site: what ``otel_llm.stats()["errors"]`` shows."""
    out: Counter[str] = Counter()
    for guard in guards:
        out.update(guard.errors)
    return dict(out)
