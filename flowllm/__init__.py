"""flowllm: a declarative pipeline engine for LLM agents."""

__version__ = "0.1.0"
