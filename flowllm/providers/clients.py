"""A provider's SDK clients, made when a call first needs them.

A provider spreads its tasks over several SDK clients (shards), each with its own connection pool: the HTTP pool
scans every connection it holds on each request, which at hundreds of concurrent tasks costs more CPU than
everything else in a turn. Making a client is not free either: the SDK builds its pydantic models the first time,
each client opens an HTTP pool, and the TLS context loads the CA store. A replayed run never sends a request, and a
run of a few tasks needs a few shards, so a shard is made on first use, and the TLS context once for all of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

ClientFactory = Callable[[], Any]


class ClientShards:
    """``size`` SDK clients made by ``make`` on first use; shard ``i`` is always the same client once made."""

    def __init__(self, make: ClientFactory, size: int = 1, *, base_url: str = "") -> None:
        if size < 1:
            raise ValueError("a provider needs at least one client")
        self._make = make
        self._clients: list[Any | None] = [None] * size
        self.base_url = base_url

    @classmethod
    def of(cls, *clients: Any, base_url: str = "") -> ClientShards:
        """Shards over clients that already exist (tests, a caller's own client)."""
        shards = cls(_no_factory, len(clients), base_url=base_url)
        shards._clients = list(clients)
        return shards

    def __len__(self) -> int:
        return len(self._clients)

    def get(self, index: int) -> Any:
        client = self._clients[index]
        if client is None:
            client = self._clients[index] = self._make()
        return client

    def made(self) -> list[Any]:
        """The clients made so far (to close them)."""
        return [client for client in self._clients if client is not None]


def _no_factory() -> Any:  # pragma: no cover - every slot of ClientShards.of is filled
    raise RuntimeError("no client factory")


def once(make: ClientFactory) -> ClientFactory:
    """``make`` called at most once (a TLS context shared by every shard of a provider)."""
    return functools.cache(make)
