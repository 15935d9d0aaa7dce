"""A background thread that turns finished requests into spans, off the engine's output path.

A kept request's spans cost in proportion to its length: at full detail a long answer is a span
per token, built in one go (benchmarks/decode_detail.py measures it by length). Done where the
request finished, that stalls the engine's output processing for every other request (a p99
inter-token spike caused by the telemetry measuring it). Here it runs on its own thread: the GIL
still shares the CPU, but the engine's thread gets it back every switch interval
(``sys.getswitchinterval()``) instead of after the burst.
The queue is bounded: a full queue refuses work, and the caller falls back to what is
cheap (metrics) and counts the spans it dropped. Never blocks the caller. What is queued at exit
is built by the owner's flush (the pipeline's, run by its instrumentor's ``Lifecycle``).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Callable

from ..guard import Guard


class Materializer:
    def __init__(self, work: Callable[[Any], None], guard: Guard, max_jobs: int = 4096,
                 name: str = "otel-llm-spans") -> None:
        self._work = work
        self._guard = guard  # its owner's: a job that raises is counted there
        self._max = max_jobs
        self._name = name
        self._jobs: collections.deque[Any] = collections.deque()
        self._cv = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False
        self.refused = 0

    def submit(self, job: Any) -> bool:
        """Queue one job; False (and counted) when the queue is full or closed."""
        with self._cv:
            if self._closed or len(self._jobs) >= self._max:
                self.refused += 1
                return False
            self._jobs.append(job)
            if self._thread is None or self._pid != os.getpid():  # first use, or after a fork
                self._start()
            self._cv.notify()
        return True

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every queued job is done; False if that took longer than ``timeout``."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def close(self, timeout: float = 5.0) -> bool:
        done = self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        return done

    def _start(self) -> None:
        self._pid = os.getpid()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        clock = time.perf_counter
        since = clock()  # when this thread last let go of the GIL on purpose
        while True:
            with self._cv:
                self._busy = False
                self._cv.notify_all()  # flush() waiters
                if not self._jobs:  # waiting lets go of the GIL (and costs nothing while nothing is submitted)
                    self._cv.wait_for(lambda: self._jobs or self._closed)
                    since = clock()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._work(job)
            except Exception as exc:  # a bug of ours costs this request's spans, nothing more
                self._guard.failed("span materializer", exc)
            # Between jobs, the engine's thread gets the GIL back (see spans.yield_gil) once a slice of work
            # ran since the last offer: offering it after every job (most are small) cost two thread
            # switches a finished request when the engine's thread was busy, more CPU than the job itself
            if clock() - since >= _YIELD_AFTER_S:
                time.sleep(0)
                since = clock()


_YIELD_AFTER_S = 3e-4  # the work between offers of the GIL: short against the switch interval (as spans._YIELD_EVERY)
