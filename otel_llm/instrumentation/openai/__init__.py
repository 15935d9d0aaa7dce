"""OpenTelemetry instrumentation for the ``openai`` Python client: the caller's side of a generation.

Wraps ``chat.completions.create``, ``completions.create``, ``responses.create`` and
``embeddings.create``, sync and async, streaming and not, plain or through ``with_raw_response`` /
``with_streaming_response``; ``chat.completions.parse`` and ``responses.parse`` (which post directly,
not through ``create``); the ``.stream()`` helpers call ``create``, so they are timed there, and
their ``close()`` is wrapped so that leaving their ``with`` block ends the stream as ``closed``. Each call gets a CLIENT span ``{gen_ai.operation.name} {model}``
whose W3C ``traceparent`` travels in the request's headers, so an instrumented server (our
vLLM adapter) makes its request span a child. Streams are timed per chunk on a monotonic
clock (time to the first content chunk, chunk gaps) and end their span exactly once.
Registered under the ``opentelemetry_instrumentor`` entry point as ``otel_llm_openai`` (``openai`` is the upstream
instrumentations' name); beside one of those, each call keeps one span, theirs, with our extras (coexist.py).
"""

from __future__ import annotations

from typing import Any, Collection

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from ...core.client_metrics import ClientMetrics
from ...core.config import Config
from ...core import self_metrics
from ...core.providers import providers_from
from ...guard import GuardOwner
from ...lifecycle import Lifecycle
from ...semconv import SCHEMA_URL
from ...version import __version__
from ..gate import LibraryGate
from ..wraps import Target, WrapTable
from .ops import Chat, Embeddings, Responses, TextCompletion
from .telemetry import ClientState
from .wrappers import OpenAIWrappers

__all__ = ["OpenAIInstrumentor"]


class OpenAIInstrumentor(LibraryGate, GuardOwner, BaseInstrumentor):  # type: ignore[misc]
    """``guard``: this process's errors of the openai instrumentation, kept across instrument cycles."""
    telemetry: ClientState | None = None
    lifecycle: Lifecycle | None = None  # the providers this instrumentation built: shut down at exit or uninstrument

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("openai >= 3.57",)  # the pyproject extra's floor: the oldest release tests/openai passes on

    def _instrument(self, **kwargs: Any) -> None:
        from openai import APIResponse, AsyncAPIResponse, AsyncStream, Stream

        from ._fence import HELPER_CLOSES, legacy_api_response

        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        config = kwargs.pop("config", None) or Config.resolve(kwargs)
        self.lifecycle = owned = Lifecycle(self.guard)
        tp, mp = providers_from(tracer_provider, meter_provider, owned)
        tracer = tp.get_tracer("otel_llm.openai", __version__, schema_url=SCHEMA_URL)
        meter = mp.get_meter("otel_llm.openai", __version__, schema_url=SCHEMA_URL)
        self.telemetry = ClientState(config, tracer, ClientMetrics(meter, config.slo), self.guard)
        self_metrics.register_errors(meter, self.guard)  # its errors, on its own meter (the pipelines do the same)
        w = OpenAIWrappers(self.telemetry, (Stream, AsyncStream), legacy_api_response(),
                           (APIResponse, AsyncAPIResponse))
        chat, completions, responses, embeddings = (
            "openai.resources.chat.completions.completions", "openai.resources.completions",
            "openai.resources.responses.responses", "openai.resources.embeddings")
        self._table = WrapTable([
            Target(chat, "Completions.create", w.sync(Chat)),
            Target(chat, "AsyncCompletions.create", w.asynchronous(Chat)),
            Target(chat, "Completions.parse", w.sync(Chat, "parse")),
            Target(chat, "AsyncCompletions.parse", w.asynchronous(Chat, "parse")),
            Target(completions, "Completions.create", w.sync(TextCompletion)),
            Target(completions, "AsyncCompletions.create", w.asynchronous(TextCompletion)),
            Target(responses, "Responses.create", w.sync(Responses)),
            Target(responses, "AsyncResponses.create", w.asynchronous(Responses)),
            Target(responses, "Responses.parse", w.sync(Responses, "parse")),
            Target(responses, "AsyncResponses.parse", w.asynchronous(Responses, "parse")),
            Target(embeddings, "Embeddings.create", w.sync(Embeddings)),
            Target(embeddings, "AsyncEmbeddings.create", w.asynchronous(Embeddings)),
        ] + [Target(module, name, w.helper_close(asynchronous)) for module, name, asynchronous in HELPER_CLOSES],
            self.guard)
        self._table.wrap()

    def _uninstrument(self, **kwargs: Any) -> None:
        self._table.unwrap()
        self.telemetry = None
        if self.lifecycle is not None:
            self.lifecycle.close_all()
            self.lifecycle = None
