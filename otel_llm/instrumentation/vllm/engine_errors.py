"""Errors caught in a spawned EngineCore, counted where the user looks: the frontend's ``otel_llm.stats()``.

Our hooks in the EngineCore catch their own errors (``GUARD``) so that vLLM runs on; but that process's
counts are invisible to the frontend, and a step whose hook failed sends no step record, so the loss would
be silent. The EngineCore therefore sends a **control record** on the step socket whenever its counts
change (at most every ``ErrorReporter.MIN_INTERVAL_S``; a change held back is sent at the next record or
the sink's once-a-second rescan): its pid and its cumulative count per site, JSON after one marker byte
that no step record starts with (step_wire's first byte is its version, a small number). The frontend
(``ErrorRelay``) adds each site's increase to its own ``GUARD.errors`` as ``EngineCore: <site>``, so it
shows in ``otel_llm.stats()["errors"]`` and the ``otel_llm.errors`` counter. JSON, never pickle: a
frontend executes nothing that arrives on its socket; an unreadable control record is counted as malformed.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

from ...guard import GUARD

CONTROL = 0xC0  # the first byte of a control record (step records start with step_wire.VERSION)
MAX_SITES = 64  # sites per record, and per EngineCore in the frontend: bounded whatever a sender says
MAX_SITE_LEN = 200
# the EngineCore's own contract check: the frontend checks the same installation itself (contract.py)
_NOT_RELAYED = "vllm contract"
PREFIX = "EngineCore: "


def encode(pid: int, errors: dict[str, int]) -> bytes:
    sites = {k[:MAX_SITE_LEN]: int(v) for k, v in list(errors.items())[:MAX_SITES] if not k.startswith(_NOT_RELAYED)}
    return bytes((CONTROL,)) + json.dumps({"pid": pid, "errors": sites}).encode()


class ErrorReporter:
    """EngineCore side: sends this process's error counts through ``send`` when they changed."""

    MIN_INTERVAL_S = 0.5

    def __init__(self, send: Callable[[bytes], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.send = send
        self.clock = clock
        self.sent: dict[str, int] = {}
        self.last = float("-inf")

    def changed(self) -> None:
        """Called after an error was caught (and at the sink's rescans): send if due."""
        errors = {k: v for k, v in GUARD.errors.items() if not k.startswith(_NOT_RELAYED)}
        if errors == self.sent:
            return
        now = self.clock()
        if now - self.last < self.MIN_INTERVAL_S:
            return  # held back: the next error after the interval or the next rescan sends it
        self.last = now
        try:
            self.send(encode(os.getpid(), errors))
            self.sent = errors
        except Exception:  # the frontend may be gone; nothing here may reach vLLM
            pass


class ErrorRelay:
    """Frontend side: each EngineCore's cumulative counts, their increases added to ``GUARD.errors``."""

    MAX_ENGINES = 16

    def __init__(self) -> None:
        self.seen: dict[int, dict[str, int]] = {}  # EngineCore pid -> the counts it last reported

    def take(self, data: bytes) -> None:
        """A control record (raises ValueError on a malformed one: the receiver counts it)."""
        record = json.loads(data[1:].decode())
        pid, errors = int(record["pid"]), record["errors"]
        if not isinstance(errors, dict):
            raise ValueError("control record without an errors map")
        before = self.seen.get(pid)
        if before is None:
            while len(self.seen) >= self.MAX_ENGINES:
                self.seen.pop(next(iter(self.seen)))
            before = {}
        now = {}
        for site, count in list(errors.items())[:MAX_SITES]:
            site, count = str(site)[:MAX_SITE_LEN], int(count)
            now[site] = count
            if count > before.get(site, 0):
                GUARD.errors[PREFIX + site] += count - before.get(site, 0)
        self.seen[pid] = now
