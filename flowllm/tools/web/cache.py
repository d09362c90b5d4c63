"""The run's web cache: what search and browse fetched, saved in the run directory and served again.

A result is stored under the SHA-256 of its request (the tool and its canonical JSON arguments) in
``<run dir>/web_cache/<2 hex>/<hash>.json``, written atomically, with the request beside the answer (a page's
text or the error the tool gave). A resumed run, another pass@k attempt and every task asking the same thing
read it instead of calling the network again. A replay (``provider=replay``) opens the replayed run's cache
read-only: what the old run fetched is served as it was, and a request that run never made is an error, never
a live call (``replay.tools=live`` fetches live instead).

The folder and the mode reach the tool servers in ``$FLOWLLM_WEB_CACHE`` and ``$FLOWLLM_WEB_CACHE_MODE``
(flowllm/setup/webconf.py); hits and misses are counted in ``stats`` and appended to ``web_cache/stats.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

CACHE_ENV = "FLOWLLM_WEB_CACHE"
CACHE_MODE_ENV = "FLOWLLM_WEB_CACHE_MODE"
STATS_FILE = "stats.jsonl"  # hits and misses, one line per process, inside the cache folder


class CacheMode(Enum):
    READ_WRITE = "rw"  # serve what is there, fetch and save what is not
    REPLAY = "replay"  # serve what is there; anything else is an error, never a live call


class CachedError(Exception):
    """A tool error that was cached (a 404 stays a 404 on resume and replay)."""


class TransientError(Exception):
    """A failure that says nothing about the request (a provider's 5xx, a rate limit): never cached."""


class ReplayMiss(Exception):
    """A replay asked for something the replayed run never fetched."""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    saved: int = 0


def request_key(tool: str, args: Mapping[str, Any]) -> str:
    canonical = json.dumps(
        {"tool": tool, "args": dict(args)}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass
class WebCache:
    folder: Path | None
    mode: CacheMode = CacheMode.READ_WRITE
    stats: CacheStats = field(default_factory=CacheStats)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> WebCache:
        environ = os.environ if environ is None else environ
        folder = environ.get(CACHE_ENV)
        mode = CacheMode(environ.get(CACHE_MODE_ENV) or CacheMode.READ_WRITE.value)
        return cls(Path(folder) if folder else None, mode)

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.json"

    async def get(self, tool: str, args: Mapping[str, Any], fetch: Callable[[], Awaitable[str]]) -> str:
        """The cached answer to ``tool(args)``, else ``fetch()``'s (saved). Raises ``CachedError`` for a
        cached tool error, ``ReplayMiss`` in a replay that never made this request."""
        if self.folder is None:
            return await fetch()
        key = request_key(tool, args)
        path = self._path(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entry = None  # absent, or cut by a crash mid-write (writes are atomic, but be safe): fetch again
        if entry is not None:
            self._count("hit", tool, key)
            if entry.get("error") is not None:
                raise CachedError(str(entry["error"]))
            return str(entry["result"])
        if self.mode is CacheMode.REPLAY:
            self._count("miss", tool, key)
            raise ReplayMiss(
                f"{tool} was not called with these arguments in the replayed run, and a replay makes no network "
                "call (replay.tools=live fetches live)"
            )
        self._count("miss", tool, key)
        try:
            result = await fetch()
        except CachedError:
            raise
        except Exception as exc:
            if _cacheable(exc):
                self._save(path, {"tool": tool, "args": dict(args), "result": None, "error": str(exc)})
            raise
        self._save(path, {"tool": tool, "args": dict(args), "result": result, "error": None})
        return result

    def _save(self, path: Path, entry: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(entry, fh, ensure_ascii=False)
        os.replace(tmp, path)
        self.stats.saved += 1

    def _count(self, event: str, tool: str, key: str) -> None:
        if event == "hit":
            self.stats.hits += 1
        else:
            self.stats.misses += 1
        if self.folder is None or self.mode is CacheMode.REPLAY:
            return  # a replay leaves the replayed run's folder as it was
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / STATS_FILE).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": event, "tool": tool, "key": key, "mode": self.mode.value}) + "\n")


def _cacheable(exc: Exception) -> bool:
    """An answer about the page (404, too large, binary) is kept; a timeout or a dropped connection is not."""
    if isinstance(exc, TransientError):
        return False
    text = str(exc)
    return not any(word in text for word in ("gave up after", "did not answer", "could not fetch", "could not reach"))


def read_stats(folder: Path) -> CacheStats:
    """Hits and misses recorded in a cache folder (all servers, all sessions)."""
    stats = CacheStats()
    path = folder / STATS_FILE
    if not path.exists():
        return stats
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line).get("event")
        except ValueError:
            continue
        if event == "hit":
            stats.hits += 1
        elif event == "miss":
            stats.misses += 1
    return stats
