"""The write-ahead log of received batches the tail sampler has not decided yet (``tail_sampling.storage``).

A batch is written (``storage.DurableLog``) before the receiver acknowledges it, and remembered with the
trace ids it left buffered in the sampler. The log is acknowledged up to the newest batch such that it and
every older one hold no trace still buffered: by then each of their traces was decided, and what a policy
kept was handed to the exporters' queues, which are durable too (the config insists), under the same
pipeline lock. At start the batches not acknowledged are read back through the whole pipeline before the
receivers open: the policies run again on what was logged (a trace's decision waits start again from the
restart), so a trace that was decided and exported before the crash but shares a batch with one that was
not is exported again - at least once; every replayed batch is counted (``storage_records{outcome="replayed"}``).
The decision caches are not logged: a span arriving after the restart for a trace decided before it is
decided afresh, as a new trace.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Iterator

from .storage import DurableLog, Position

STORAGE = "tail_sampling"  # the ``storage`` label of its counters


class ReceivedLog:
    def __init__(self, log: DurableLog) -> None:
        self.log = log
        # (position, trace ids still buffered) per logged batch not yet acknowledged, oldest first
        self._held: deque[tuple[Position, list[bytes]]] = deque()

    def append(self, raw: bytes) -> Position:
        """Write a received batch (``storage.StorageFull`` when the disk budget is spent: nothing written)."""
        return self.log.append(raw)

    def hold(self, position: Position, trace_ids: Iterable[bytes], buffered: Callable[[bytes], bool]) -> None:
        """The batch at ``position`` is processed; the traces of it still ``buffered`` hold it in the log."""
        self._held.append((position, [t for t in set(trace_ids) if buffered(t)]))

    def advance(self, buffered: Callable[[bytes], bool]) -> int:
        """Acknowledge the oldest batches whose traces are all decided; returns how many."""
        last, done = None, 0
        while self._held:
            position, ids = self._held[0]
            left = [t for t in ids if buffered(t)]
            if left:
                if len(left) < len(ids):
                    self._held[0] = (position, left)  # checked again only for what is left
                break
            self._held.popleft()
            last, done = position, done + 1
        if last is not None:
            self.log.ack(last)
        return done

    def replay(self) -> Iterator[tuple[Position, bytes]]:
        return self.log.replay()

    @property
    def waiting(self) -> int:
        """Logged batches not acknowledged yet."""
        return len(self._held)

    def close(self) -> None:
        self.log.close()
