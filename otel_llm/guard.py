"""Telemetry never breaks inference: our errors are caught, logged once per site, and counted."""

from __future__ import annotations

import logging
from collections import Counter

logger = logging.getLogger("otel_llm")


class Guard:
    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()

    def failed(self, site: str, exc: BaseException) -> None:
        """Record an instrumentation error at ``site``; the host's work goes on untouched."""
        first = site not in self.errors
        self.errors[site] += 1
        if first:
            logger.warning("otel-llm: instrumentation error at %s (further ones are counted, not logged): %r",
                           site, exc, exc_info=exc)


GUARD = Guard()
