"""One CLIENT span per call beside an upstream openai instrumentation: theirs, with our extras on it.

``opentelemetry-instrumentation-openai-v2`` (OpenTelemetry contrib) and OpenLLMetry's
``opentelemetry-instrumentation-openai`` wrap the same ``create`` methods, and ``opentelemetry-bootstrap``
installs the former wherever ``openai`` is. Where one of them wraps a method we wrap, we defer: their span
is the call's span, their ``gen_ai.client.*`` metrics its metrics; we start no span, record none of our
metrics for that call, and add only what they lack (``llm.client.*`` and the time to the first chunk) onto
their span, and the call's ``traceparent`` (theirs), so a server's span still joins the client's.

The order the two were wrapped in is the launcher's entry-point order, which nobody controls, so both are
handled: theirs above ours (we run inside their span: it is the current span), or ours above theirs (we call
their wrapper with our deferred call as what it wraps, so again we run inside their span). Which wrapper is
theirs is read from wrapt's ``FunctionWrapper`` (``_self_wrapper``: the wrapper function, whose module names
the package); ``tests/openai/test_coexist.py`` checks that reading, and without it we fall back to a span of
our own (two spans, as before), never to none.
"""

from __future__ import annotations

import inspect
from typing import Any

# openai-v2 lives in ``opentelemetry.instrumentation.openai_v2``, OpenLLMetry's in ``...openai``
UPSTREAM_PREFIX = "opentelemetry.instrumentation.openai"
OURS = __name__.rsplit(".", 1)[0] + ".wrappers"


def _wrapper_module(fn: Any) -> str:
    wrapper = getattr(fn, "_self_wrapper", None)  # wrapt: a FunctionWrapper's wrapper function
    return getattr(wrapper, "__module__", None) or ""


def is_upstream(fn: Any) -> bool:
    """``fn`` is a wrapt wrapper of an upstream openai instrumentation."""
    return _wrapper_module(fn).startswith(UPSTREAM_PREFIX)


def upstream_above(instance: Any, method: str) -> bool:
    """An upstream wrapper sits above ours on ``type(instance).method``: we are called inside its span."""
    seen = inspect.getattr_static(type(instance), method, None)
    for _ in range(32):  # a chain of wrappers, top down, to ours
        if seen is None:
            return False
        module = _wrapper_module(seen)
        if module.startswith(UPSTREAM_PREFIX):
            return True
        if module == OURS:
            return False
        seen = getattr(seen, "__wrapped__", None)
    return False


def call_through_upstream(wrapped: Any, instance: Any, args: tuple, kwargs: dict, ours: Any) -> Any:
    """Ours above theirs (``wrapped`` is their bound wrapper): their wrapper runs with ``ours(original, instance,
    args, kwargs)`` as what it wraps, so our deferred call runs inside their span."""
    theirs = wrapped._self_wrapper
    original = wrapped.__wrapped__
    return theirs(lambda *a, **kw: ours(original, instance, a, kw), instance, args, kwargs)
