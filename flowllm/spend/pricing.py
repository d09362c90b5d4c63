"""What a run cost: token counts times the per-model prices of ``conf/pricing.yaml``.

Usage (flowllm/core/types.py): ``input_tokens`` counts every prompt token, cached or not, so the uncached
part is what is left after the cache reads and writes; counting all three at full price would bill cached
tokens twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # PyYAML comes with hydra-core / omegaconf

from flowllm.core.types import Usage
from flowllm.errors import BuildError

PRICE_FIELDS = ("input", "output", "cache_read", "cache_write")
# Optional: the price of a cache write with Anthropic's one-hour TTL. A model's entry without one bills it at twice
# its input price, as Anthropic does (docs.claude.com/en/docs/build-with-claude/prompt-caching, "Pricing":
# "1-hour cache write tokens are 2 times the base input tokens price", 5-minute writes 1.25 times, reads 0.1 times).
ONE_HOUR_WRITE = "cache_write_1h"
ONE_HOUR_WRITE_FACTOR = 2.0
PER_TOKENS = 1_000_000


class PricingError(BuildError):
    """The price table cannot be read; the message names the file and the entry."""


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float  # a five-minute write (and any write of a provider with one TTL)
    cache_write_1h: float | None = None  # None: ONE_HOUR_WRITE_FACTOR x input

    @property
    def one_hour_write(self) -> float:
        return self.cache_write_1h if self.cache_write_1h is not None else ONE_HOUR_WRITE_FACTOR * self.input

    def cost(self, usage: Usage) -> float:
        return cost_breakdown(usage, self)["total"]


def uncached_input(usage: Usage) -> int:
    return max(usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens, 0)


def write_cost(written: int, written_1h: int, price: Price) -> float:
    """USD for ``written`` cache-write tokens, ``written_1h`` of them with the one-hour TTL."""
    return ((written - written_1h) * price.cache_write + written_1h * price.one_hour_write) / PER_TOKENS


def cost_breakdown(usage: Usage, price: Price) -> dict[str, float]:
    """Cost in USD by kind of token, and the total."""
    parts = {
        "input": uncached_input(usage) * price.input / PER_TOKENS,
        "cache_read": usage.cache_read_tokens * price.cache_read / PER_TOKENS,
        "cache_write": write_cost(usage.cache_write_tokens, usage.cache_write_1h_tokens, price),
        "output": usage.output_tokens * price.output / PER_TOKENS,
    }
    parts["total"] = sum(parts.values())
    return {k: round(v, 6) for k, v in parts.items()}


@dataclass
class PriceTable:
    prices: dict[str, Price] = field(default_factory=dict)
    source: str = "<dict>"
    # Protocol -> the factor a batch API's calls are billed at (``batch_factors:``; 0.5 for half price).
    batch_factors: dict[str, float] = field(default_factory=dict)

    def batch_factor(self, protocol: str) -> float | None:
        """What a batch call of ``protocol`` costs, as a share of a direct call (None: not known)."""
        return self.batch_factors.get(protocol)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<dict>") -> PriceTable:
        models = data.get("models", data) if isinstance(data, Mapping) else None
        if not isinstance(models, Mapping):
            raise PricingError(f"{source}: expected a mapping 'models: {{<model>: {{input: ..., output: ...}}}}'")
        prices: dict[str, Price] = {}
        for model, entry in models.items():
            if not isinstance(entry, Mapping):
                raise PricingError(f"{source}: models.{model} must be a mapping of prices")
            unknown = sorted(set(entry) - {*PRICE_FIELDS, ONE_HOUR_WRITE})
            if unknown:
                raise PricingError(f"{source}: models.{model} has unknown field(s) {', '.join(unknown)}")
            values: dict[str, float] = {}
            for name in (*PRICE_FIELDS, ONE_HOUR_WRITE):
                if name == ONE_HOUR_WRITE and entry.get(name) is None:
                    continue  # the default: twice the input price
                # A model without cache prices bills cached tokens like any input token.
                raw = entry.get(name, entry.get("input") if name.startswith("cache") else None)
                if raw is None:
                    raise PricingError(f"{source}: models.{model} needs '{name}' (USD per million tokens)")
                try:
                    value = float(raw)
                except (TypeError, ValueError):
                    raise PricingError(f"{source}: models.{model}.{name} must be a number, not {raw!r}") from None
                if value < 0:
                    raise PricingError(f"{source}: models.{model}.{name} cannot be negative")
                values[name] = value
            prices[str(model)] = Price(**values)
        factors = data.get("batch_factors") if isinstance(data, Mapping) and "models" in data else None
        if factors is not None and not isinstance(factors, Mapping):
            raise PricingError(f"{source}: batch_factors must map a protocol to a factor (anthropic: 0.5)")
        batch: dict[str, float] = {}
        for protocol, raw in (factors or {}).items():
            if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= 1:
                raise PricingError(f"{source}: batch_factors.{protocol} must be a number in (0, 1], not {raw!r}")
            batch[str(protocol)] = float(raw)
        return cls(prices, source, batch)

    @classmethod
    def load(cls, path: Path | str) -> PriceTable:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PricingError(f"price table '{path}' does not exist (experiment.pricing)") from None
        except yaml.YAMLError as exc:
            raise PricingError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        return cls.from_mapping(data or {}, str(path))

    def lookup(self, model: str | None) -> Price | None:
        """The price of ``model``: exact name, then the longest entry it starts with, also without a router
        prefix (``anthropic/claude-sonnet-4.5``), case-insensitively."""
        if not model:
            return None
        lowered = {k.lower(): v for k, v in self.prices.items()}
        for name in dict.fromkeys([model.lower(), model.rsplit("/", 1)[-1].lower()]):
            if name in lowered:
                return lowered[name]
            prefixes = [k for k in lowered if name.startswith(k)]
            if prefixes:
                return lowered[max(prefixes, key=len)]
        return None


def price_per_million(price: Price) -> dict[str, float]:
    """The prices a summary records: the one-hour write's only when the table sets one (else the default)."""
    prices = {name: getattr(price, name) for name in PRICE_FIELDS}
    if price.cache_write_1h is not None:
        prices[ONE_HOUR_WRITE] = price.cache_write_1h
    return prices


def cost_summary(usage: Usage, model: str | None, table: PriceTable | None) -> dict[str, Any]:
    """The ``cost`` block of a summary: USD by kind and total, or why there is none."""
    if table is None:
        return {"total_usd": None, "model": model, "note": "no price table"}
    price = table.lookup(model)
    if price is None:
        return {"total_usd": None, "model": model, "note": f"no price for '{model}' in {table.source}"}
    parts = cost_breakdown(usage, price)
    return {
        "total_usd": parts["total"],
        "model": model,
        "by_kind_usd": {k: v for k, v in parts.items() if k != "total"},
        "price_per_million": price_per_million(price),
        "estimated_tokens": usage.estimated,
    }
