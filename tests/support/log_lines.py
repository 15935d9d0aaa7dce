"""The ``otel_llm`` logger's records, kept as (level, message) pairs, for child-process test scripts that
report what a user would have read in their log."""

from __future__ import annotations

import logging


class LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))


def capture_otel_llm_log() -> LogLines:
    """Attach a ``LogLines`` to the ``otel_llm`` logger, at INFO, and return it."""
    log = LogLines()
    logger = logging.getLogger("otel_llm")
    logger.addHandler(log)
    logger.setLevel(logging.INFO)
    return log
