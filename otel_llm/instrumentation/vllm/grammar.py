"""Structured-output grammars in vLLM: the backend on the request span (frontend), and in the EngineCore
whether each request's grammar was compiled anew or reused from the backend's cache.

vLLM says nothing per request about its grammar compilation. What the EngineCore can tell cheaply: the
structured-output manager compiles each request's grammar once, in ``StructuredOutputManager._create_grammar``
(a thread of its executor), from the request's key (``StructuredOutputRequest.structured_output_key``: the
kind of constraint and its spec, the JSON schema text). The rule, per request (O(1): one hash of the key,
which Python caches on the spec string, and two dict operations):

* **hit**: a grammar of the same key compiled successfully in this EngineCore before its own compile began,
  and the backend keeps compiled grammars (xgrammar's ``GrammarCompiler`` cache, outlines' index cache):
  the backend handed back what it had;
* **miss**: otherwise, and always under guidance and lm-format-enforcer, which build every request's
  grammar anew.

What it cannot see: a grammar the backend evicted from its cache (xgrammar keeps
``VLLM_XGRAMMAR_CACHE_MB``, 512 MB by default; we remember the last ``SEEN`` keys) is still called a hit,
and two requests of one new key compiled at the same moment on two executor threads are both misses.
The facts ride on the step that first schedules the request (``core.timeline.StepGrammar``), so they reach
every frontend the step records reach.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from . import contract

CACHING_BACKENDS = frozenset({"xgrammar", "outlines"})  # backends that reuse a compiled grammar of the same key
SEEN = 4096  # keys remembered (least recently compiled forgotten first)
PENDING = 4096  # requests whose fact waits for their first scheduling (more: the oldest are dropped)


def backend_attribute(params: Any, fence: contract.Contract) -> str | None:
    """The structured-output backend of a request's ``SamplingParams`` (``auto`` until vLLM's input processor
    resolved it), or None for a request without a grammar."""
    structured = fence.reader("SamplingParams.structured_outputs")(params)
    if structured is None:
        return None
    backend = fence.reader("StructuredOutputsParams._backend")(structured)
    return str(backend) if backend else "auto"


class GrammarCache:
    """The EngineCore's notes of compiled grammar keys, and of each request's hit or miss until its first
    scheduling takes it (``take``). Written from the structured-output manager's executor threads."""

    __slots__ = ("seen", "pending", "_lock")

    def __init__(self) -> None:
        self.seen: dict[int, None] = {}  # hash of a key that compiled -> None, oldest first
        self.pending: dict[str, bool] = {}  # request id -> its grammar was a cache hit
        self._lock = threading.Lock()

    def compile(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """``StructuredOutputManager._create_grammar(request)``, noting whether its key compiled before."""
        key = rid = None
        hit = False
        try:
            request = args[0] if args else kwargs["request"]
            rid = request.request_id
            key = hash(request.structured_output_request.structured_output_key)
            backend = request.sampling_params.structured_outputs._backend
            hit = backend in CACHING_BACKENDS and key in self.seen
        except Exception:  # another vLLM's request: no fact for it, the compile goes on
            key = None
        grammar = wrapped(*args, **kwargs)  # a failed compile raises: nothing noted
        if key is not None:
            with self._lock:
                seen = self.seen
                seen.pop(key, None)
                seen[key] = None
                if len(seen) > SEEN:
                    del seen[next(iter(seen))]
                pending = self.pending
                if len(pending) >= PENDING:  # requests aborted before their first step: forget the oldest
                    del pending[next(iter(pending))]
                pending[rid] = hit
        return grammar

    def take(self, request_id: str) -> bool | None:
        """The request's hit (True) or miss (False), once; None where no compile of it was noted."""
        with self._lock:
            return self.pending.pop(request_id, None)

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()
            self.pending.clear()
