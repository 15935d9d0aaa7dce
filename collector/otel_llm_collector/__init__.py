"""otel-llm collector: an OTLP gateway that derives LLM latency metrics from spans and tail-samples traces."""

__version__ = "0.1.0"
