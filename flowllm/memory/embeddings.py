"""Embedding functions for long-term memory.

* ``HashingEmbedder`` (the default): offline, no download, deterministic. Words (lower-cased, with a light
  suffix strip so "rivers" meets "river"), word pairs and character trigrams are hashed into a fixed number of
  signed buckets, weighted sub-linearly and L2-normalised. It finds memories that share vocabulary with the
  task, which is what an offline default can honestly promise.
* ``OpenAIEmbedder``: any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, vLLM, Ollama, TEI...) through
  the official SDK; the key comes from the variable named by ``api_key_env``.

Every embedder has a ``name`` that identifies its vector space: the store only compares vectors of one name.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
from collections import Counter
from typing import Any, Protocol

from flowllm.errors import ConfigError

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SUFFIXES = ("ing", "ies", "es", "ed", "ly", "s")


class Embedder(Protocol):
    name: str

    async def embed(self, texts: list[str]) -> list[list[float]]: ...


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def _features(text: str) -> Counter[str]:
    words = [_stem(w) for w in _WORD.findall(text.lower())]
    feats: Counter[str] = Counter()
    for w in words:
        feats[f"w:{w}"] += 2  # whole words weigh most
        padded = f"#{w}#"
        for i in range(len(padded) - 2):
            feats[f"c:{padded[i : i + 3]}"] += 1
    for a, b in itertools.pairwise(words):
        feats[f"b:{a} {b}"] += 1
    return feats


def normalize(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


class HashingEmbedder:
    """Feature hashing into ``dim`` signed buckets (see the module doc)."""

    def __init__(self, dim: int = 512) -> None:
        if dim < 16:
            raise ConfigError(f"memory.embedding.dim must be at least 16, not {dim}")
        self.dim = dim
        self.name = f"hashing-v1-{dim}"

    def embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dim
        for feature, count in _features(text).items():
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            sign = 1.0 if digest[4] & 1 else -1.0
            vector[bucket] += sign * (1.0 + math.log(count))
        return normalize(vector)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_one(t) for t in texts]


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint, through the ``openai`` SDK."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = None,
        dimensions: int | None = None,
        timeout_s: float = 30.0,
        http_client: Any = None,
    ) -> None:
        from openai import AsyncOpenAI

        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not key:
            raise ConfigError(f"memory.embedding.api_key_env names {api_key_env}, which is not set")
        self.model = model
        self.dimensions = dimensions
        self.name = f"openai:{model}" + (f":{dimensions}" if dimensions else "")
        # Local servers (vLLM, Ollama) want no key, but the SDK insists on one.
        self.client = AsyncOpenAI(
            api_key=key or "not-needed",
            base_url=base_url,
            timeout=timeout_s,
            max_retries=2,
            http_client=http_client,
        )

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        kwargs: dict[str, Any] = {"model": self.model, "input": texts}
        if self.dimensions:
            kwargs["dimensions"] = self.dimensions
        reply = await self.client.embeddings.create(**kwargs)
        ordered = sorted(reply.data, key=lambda d: d.index)
        return [normalize(list(d.embedding)) for d in ordered]


def make_embedder(cfg: Any) -> Embedder:
    """The embedder a ``memory.embedding`` config (mapping or dataclass) describes."""
    get = cfg.get if isinstance(cfg, dict) else lambda key, default=None: getattr(cfg, key, default)
    kind = str(get("kind", "hashing"))
    if kind == "hashing":
        return HashingEmbedder(int(get("dim", 512)))
    if kind == "openai":
        return OpenAIEmbedder(
            model=str(get("model", "text-embedding-3-small")),
            base_url=get("base_url"),
            api_key_env=get("api_key_env"),
            dimensions=get("dimensions"),
            timeout_s=float(get("timeout_s", 30.0)),
        )
    raise ConfigError(f"memory.embedding.kind must be hashing or openai, not '{kind}'")
