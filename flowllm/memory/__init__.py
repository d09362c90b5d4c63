"""Long-term memory: a persistent store of facts from earlier tasks, recalled into the system prompt."""

from flowllm.memory.embeddings import Embedder, HashingEmbedder, OpenAIEmbedder, make_embedder
from flowllm.memory.store import Memory, MemoryStore

__all__ = ["Embedder", "HashingEmbedder", "Memory", "MemoryStore", "OpenAIEmbedder", "make_embedder"]
