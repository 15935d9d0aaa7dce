"""The tiny random-weights Llama lives in the package (the demo needs it too): re-exported for tests."""

from otel_llm.demo.tiny_model import MAX_POSITIONS, VOCAB_SIZE, default_dir, ensure_tiny_model

__all__ = ["MAX_POSITIONS", "VOCAB_SIZE", "default_dir", "ensure_tiny_model"]
