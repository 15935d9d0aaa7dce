"""What one owner closes at exit: one exit hook per owner, closing what it holds in a stated order.

The owners are the instrumentors in a frontend process (a spawned EngineCore's or worker's sockets go
with the process: the plugin's ``EngineSide`` registers none). Nothing else registers an exit hook: a pipeline, a socket or a provider we built is handed
to its owner's ``Lifecycle``, which closes them stage by stage (``STAGES``): the telemetry is flushed
before the providers it sends through shut down, and sockets close before their directory goes.
"""

from __future__ import annotations

import atexit
from typing import Callable

from .guard import Guard

# The stages an owner closes things in, first to last (within a stage: the order they were added).
TELEMETRY, PROVIDERS, SOCKETS, DIRECTORIES = STAGES = range(4)


class Lifecycle:
    """Named closers, run in order at exit (one ``atexit`` hook for all of them) or earlier, by name."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard  # the owner's: a closer that fails is counted there
        self._closers: dict[str, tuple[int, Callable[[], object]]] = {}  # name -> (stage, closer)
        self._hooked = False

    def add(self, what: str, close: Callable[[], object], stage: int) -> None:
        """Close ``what`` with ``close()`` at exit, in ``stage``; a closer of the same name is replaced."""
        if stage not in STAGES:
            raise ValueError(f"stage {stage} is none of {list(STAGES)}")
        self._closers.pop(what, None)
        self._closers[what] = (stage, close)
        if not self._hooked:
            atexit.register(self.close_all)
            self._hooked = True

    def __contains__(self, what: str) -> bool:
        return what in self._closers

    def discard(self, what: str) -> None:
        """Forget ``what`` without closing it (its owner closed it another way)."""
        self._closers.pop(what, None)
        self._unhook_if_empty()

    def close(self, what: str) -> None:
        """Close ``what`` now (guarded) and forget it."""
        held = self._closers.pop(what, None)
        self._unhook_if_empty()
        if held is not None:
            self._run(what, held[1])

    def close_all(self) -> None:
        """Close everything, in order, and remove the exit hook (what runs at exit)."""
        closers, self._closers = self._closers, {}
        self._unhook_if_empty()
        for what, (_, close) in sorted(closers.items(), key=lambda item: item[1][0]):  # a stable sort
            self._run(what, close)

    def _unhook_if_empty(self) -> None:
        if self._hooked and not self._closers:
            atexit.unregister(self.close_all)
            self._hooked = False

    def _run(self, what: str, close: Callable[[], object]) -> None:
        try:
            close()
        except Exception as exc:  # one closer failing leaves the others to run
            self.guard.failed(f"closing {what}", exc)
