"""The library gate every instrumentor of ours has: nothing happens where its library is absent.

``opentelemetry-instrument`` checks an instrumentation's dependencies per distribution, through its
``instruments`` extra, and then calls ``instrument(skip_dep_check=True)``. ``otel-llm`` ships three
instrumentors in one distribution, and an ``instruments`` extra naming vLLM, TensorRT-LLM and openai would
both skip all three unless all were installed and install every engine with ``pip install otel-llm[instruments]``.
So each instrumentor checks its own ``instrumentation_dependencies()`` when the launcher skipped the check:
with its library not installed it returns before building anything (no provider, no thread, no wrapper) and
logs one debug line. A version outside the range is left to the instrumentation's own fence (vLLM's contract
warns by name), as before.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.instrumentation.dependencies import get_dependency_conflicts

logger = logging.getLogger("otel_llm")


class LibraryGate:
    """Mixed in before ``BaseInstrumentor``: its ``instrument`` does nothing while the library is absent."""

    def instrument(self, **kwargs: Any) -> Any:
        if kwargs.get("skip_dep_check") and not self.is_instrumented_by_opentelemetry:  # type: ignore[attr-defined]
            conflict = get_dependency_conflicts(self.instrumentation_dependencies())  # type: ignore[attr-defined]
            if conflict is not None and not getattr(conflict, "found", None) and not getattr(conflict, "found_any", None):
                logger.debug("otel-llm: %s not instrumented: %s", type(self).__name__, conflict)
                return None
        return super().instrument(**kwargs)  # type: ignore[misc]
