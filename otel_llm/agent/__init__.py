"""The agent process: the telemetry's work, off vLLM's frontend process.

vLLM's frontend (the ``LLM`` process, or each ``vllm serve`` API server) is the first bottleneck at high
token rates, and shares its GIL with everything running in it. With an agent, the frontend only hands
each request's start and finish to it (``link.AgentLink``: two small packets); the agent reads the
EngineCore's step records itself, and does the rest — token times from the steps, the tail decision, the
slow-cause verdict, metrics, spans and export — on another core (``process.Agent``).

Used where it can stand in exactly (``destinations``: the providers are OTLP as ``OTEL_*`` configures
them) and the engine allows it (spawned EngineCore, token times from steps); the option ``agent``
(``OTEL_LLM_AGENT=off``) keeps everything in the frontend. See docs/design/off-process.md.
"""
