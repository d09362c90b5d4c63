"""``experiment.coordination=redis://...``: the state that processes of one run share when they share no folder.

Processes of one run on one machine share their rate limits' 429 pauses through small files and their spend
through the run's ledger (flowllm/providers/limiter.py, flowllm/spend/spending.py). Shards of a run on several
machines (``experiment.shard=I/N``) share nothing of the kind, so each would hold the provider's limits and the
run's budget alone. With a Redis URL they keep them in Redis instead, under one namespace per run:

* ``RedisBucket``: a leaky bucket per provider and kind (requests, tokens) with the same rate and burst as the
  local one (``aiolimiter``), kept by one Lua script that reads Redis' own clock, so N processes together are
  admitted at the provider's rate, not N times it;
* ``RedisPause``: a 429's pause, a key whose time to live is the pause, lengthened and never shortened;
* ``RedisSpend``: the run's billed spend, each ledger line counted once (by its digest) whichever process
  reads it, so the budget is the run's, not the process's.

Credentials are the URL's (or the client's defaults); the URL is never written to the run with its password.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis

from flowllm.errors import ConfigError

__all__ = ["Coordination", "RedisBucket", "RedisPause", "RedisSpend", "SpendEntry", "connect"]

SCHEMES = ("redis", "rediss", "unix")
CONNECT_TIMEOUT_S = 5.0
KEY_TTL_S = 7 * 24 * 3600  # a run's keys outlive its longest session by far, then go

# A leaky bucket: ``level`` drains at ``rate`` per second; a request of ``amount`` is admitted while the level
# stays within ``burst``; else the seconds to wait are returned (as text: Lua numbers become integers).
_BUCKET = """
local rate, burst, amount = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local level = tonumber(redis.call('HGET', KEYS[1], 'level') or '0')
local stamp = tonumber(redis.call('HGET', KEYS[1], 'stamp') or tostring(now))
level = math.max(0, level - (now - stamp) * rate)
local wait = 0
if level + amount <= burst then level = level + amount else wait = (level + amount - burst) / rate end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'stamp', tostring(now))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return tostring(wait)
"""
# A pause only grows: the key's time to live is set when the new pause ends later than the one it holds.
_PAUSE = """
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], '1', 'PX', ARGV[1]) end
return 0
"""
# Each ledger line is counted once, whichever process reads it first (workers of one shard read one ledger).
_SPEND = """
for i = 2, #ARGV, 5 do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then
    redis.call('HINCRBY', KEYS[2], 'tokens', ARGV[i + 1])
    redis.call('HINCRBY', KEYS[2], 'output_tokens', ARGV[i + 2])
    redis.call('HINCRBYFLOAT', KEYS[2], 'cost_usd', ARGV[i + 3])
    redis.call('HINCRBY', KEYS[2], 'unpriced_calls', ARGV[i + 4])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return redis.call('HGETALL', KEYS[2])
"""


def shown_url(url: str) -> str:
    """The URL without its password (what messages and the run's records may show)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class Coordination:
    """A reachable Redis and the run's namespace in it (``run`` of the URL's query, else the run's fingerprint)."""

    url: str
    namespace: str

    def key(self, *parts: str) -> str:
        return ":".join([self.namespace, *parts])

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=30)

    def async_client(self) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=30)


def connect(url: str, default_run: str) -> Coordination:
    """``experiment.coordination`` checked to answer (one PING); ``ConfigError`` naming the URL when it does not."""
    text = str(url).strip()
    if urlsplit(text).scheme not in SCHEMES:
        raise ConfigError(f"experiment.coordination must be a redis:// (rediss://, unix://) URL, not {text!r}")
    run = (parse_qs(urlsplit(text).query).get("run") or [default_run])[0]
    plain = urlunsplit(urlsplit(text)._replace(query=""))
    coordination = Coordination(plain, f"flowllm:{run}")
    client = coordination.client()
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"experiment.coordination: cannot reach Redis at {shown_url(text)}: {detail}") from None
    finally:
        client.close()
    return coordination


@dataclass
class RedisBucket:
    """The run's one bucket for a provider's requests or tokens: ``acquire`` as ``aiolimiter.AsyncLimiter``'s."""

    client: aioredis.Redis
    key: str
    max_rate: float  # the burst
    time_period: float  # seconds to drain a full bucket
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep

    async def acquire(self, amount: float = 1) -> None:
        rate = self.max_rate / self.time_period
        while True:
            wait = float(await self.client.eval(_BUCKET, 1, self.key, rate, self.max_rate, amount, KEY_TTL_S))
            if wait <= 0:
                return
            await self.sleep(wait)


@dataclass
class RedisPause:
    """A provider's 429 pause, shared by every process of the run."""

    client: aioredis.Redis
    key: str
    _pending: set[asyncio.Task[Any]] = field(default_factory=set)

    async def left(self) -> float:
        ms = int(await self.client.pttl(self.key))
        return ms / 1000.0 if ms > 0 else 0.0

    def extend(self, seconds: float) -> None:
        """Lengthen the pause to ``seconds`` from now (sent in the background: called from the limiter's sync
        ``back_off``; a task that waits next reads it)."""
        ms = max(int(seconds * 1000), 1)
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(self._send(ms))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, ms: int) -> None:
        await self.client.eval(_PAUSE, 1, self.key, ms)


@dataclass(frozen=True)
class SpendEntry:
    """One billed ledger line: its digest (so it is counted once) and what it cost."""

    digest: str
    tokens: int
    output_tokens: int
    cost_usd: float
    unpriced: bool

    @staticmethod
    def digest_of(raw: bytes) -> str:
        return hashlib.sha256(raw).hexdigest()[:32]


class RedisSpend:
    """The run's spend in Redis: ``add`` counts new billed lines (each once) and returns the run's totals."""

    def __init__(self, coordination: Coordination) -> None:
        self._client = coordination.client()
        self._url = shown_url(coordination.url)
        self._keys = (coordination.key("spend", "seen"), coordination.key("spend", "total"))

    def add(self, entries: Sequence[SpendEntry]) -> dict[str, float]:
        args: list[Any] = [KEY_TTL_S]
        for e in entries:
            args += [e.digest, e.tokens, e.output_tokens, repr(float(e.cost_usd)), int(e.unpriced)]
        try:
            raw = self._client.eval(_SPEND, 2, *self._keys, *args)
        except redis.RedisError as exc:  # the server went away: OSError, as every Redis reader here says it
            raise OSError(f"Redis at {self._url} cannot be read: {exc}") from exc
        pairs = [x.decode() if isinstance(x, bytes) else str(x) for x in raw]
        return {pairs[i]: float(pairs[i + 1]) for i in range(0, len(pairs), 2)}

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError, OSError):
            self._client.close()


@dataclass
class RedisText:
    """One short value of the run in Redis (``SharedText`` of the adaptive limits): a blocking GET or SET of a
    few bytes, made at most every few hundred milliseconds by its reader."""

    client: redis.Redis
    key: str

    def get(self) -> str | None:
        try:
            raw = self.client.get(self.key)
        except redis.RedisError as exc:
            raise OSError(str(exc)) from exc
        return raw.decode() if isinstance(raw, bytes) else None

    def set(self, text: str) -> None:
        try:
            self.client.set(self.key, text)
        except redis.RedisError as exc:
            raise OSError(str(exc)) from exc


class RedisLimits:
    """The rate-limit state of every provider of the run in one Redis (``SharedLimits`` of the limiter)."""

    def __init__(self, coordination: Coordination) -> None:
        self.coordination = coordination
        self._client: aioredis.Redis | None = None
        self._sync: redis.Redis | None = None

    def _async(self) -> aioredis.Redis:
        if self._client is None:  # made in the event loop that uses it
            self._client = self.coordination.async_client()
        return self._client

    def bucket(self, provider: str, kind: str, max_rate: float, time_period: float) -> RedisBucket:
        return RedisBucket(self._async(), self.coordination.key("rate", provider, kind), max_rate, time_period)

    def pause(self, provider: str) -> RedisPause:
        return RedisPause(self._async(), self.coordination.key("pause", provider))

    def value(self, name: str) -> RedisText:
        """A shared value of the run (the adaptive limit of a provider and model)."""
        if self._sync is None:
            self._sync = self.coordination.client()
        return RedisText(self._sync, self.coordination.key(name))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._sync is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                self._sync.close()
            self._sync = None
