"""Named implementations of one kind, chosen by a config value: the one way flowllm registers them.

Runners (``runner=``), wire protocols (``provider.protocol``), dataset adapters (``dataset.adapter``) and
scorers (``dataset.scorer``) each keep a ``Registry``: built-ins are registered where they are defined, a
plug-in adds its own with ``register``, and a config naming none of them gets one line listing the choices.
(Pipeline nodes are chosen differently on purpose: by import path, ``_target_``, so any class can be one.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> implementation, for the config key ``key`` (used in messages)."""

    def __init__(self, key: str, entries: dict[str, T] | None = None) -> None:
        self.key = key
        self._entries: dict[str, T] = dict(entries or {})

    def register(self, name: str, item: T) -> None:
        """Add ``item`` under ``name``; registering the same item again is harmless, another one is refused."""
        current = self._entries.get(name)
        if current is not None and current is not item:
            raise ValueError(f"{self.key}: '{name}' is registered already")
        self._entries[name] = item

    def get(self, name: str) -> T | None:
        return self._entries.get(name)

    def require(self, name: str, error: Callable[[str], Exception]) -> T:
        """The implementation named ``name``; else ``error(message)`` is raised with the choices listed."""
        item = self._entries.get(name)
        if item is None:
            raise error(f"{self.key} must be one of {self.choices()}, not '{name}'")
        return item

    def names(self) -> list[str]:
        return sorted(self._entries)

    def choices(self) -> str:
        """The names in the order they were registered (built-ins first), for messages."""
        return ", ".join(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
