"""Reading an OpenTelemetry SDK reader's collected metrics back by name: the demo's own reader, for tests."""

from otel_llm.demo.console import points_by_name

__all__ = ["points_by_name"]
