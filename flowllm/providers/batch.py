"""Batch mode (``provider.batch``): model calls of every running task sent through the provider's batch API.

Anthropic: Message Batches (``client.messages.batches``). OpenAI, for Chat Completions and Responses: the Batch API
(the calls as a JSONL file through ``client.files``, then ``client.batches``; results in the output and error
files). A call waits in a queue; the queue goes out as one batch when it holds ``max_size`` calls or
``max_wait_s`` after its first call came. The batch is polled every ``poll_s`` until it has ended, then its
results go back to the calls, each as the body a direct call would have returned, with the batch's id under
``BATCH_KEY``: the turn goes on as after a direct call (parsing, repair, tools, recording), and the ledger prices
the attempt at the batch factor.

An item that errored, expired or was canceled (the service cancelled its batch) fails that call only, as a
``ProviderCallError`` the retry policy acts on (a retry goes into the next batch); fallbacks, key pools and the
breaker see it like any failed attempt.

Every batch created is written to ``batches.jsonl`` beside the usage ledger (its id and its items' custom ids)
before anything waits on it. A custom id is a digest of the call (task, epoch, attempt, agent, scope, turn,
request): each epoch and attempt of a task is its own request, and a run resumed after a kill that sends the same
call again finds the batch that already holds it and takes its result instead of paying twice. The journal also
notes each batch whose results were read (``collected``): a result a session already read (and billed in the
ledger) is marked ``billed_before`` and counts no tokens again; one that no session read yet (the kill came
first) is billed once, when it is read.

Which task, agent and turn a custom id stands for stays on this side (``BatchRoutes``): nothing but the requests
goes to the provider. The emulator a run starts for itself is handed the same map to pick its scripted replies.

Each batch API has its limits (``BATCH_LIMITS``): ``provider.batch.max_size`` above the protocol's count is
refused before the first task, and a queue whose requests would pass the byte limit goes out as several batches.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from flowllm.core.interfaces import CallContext
from flowllm.providers.errors import ProviderCallError, ProviderConfigError, classify_exception
from flowllm.rundir.attempts import current_attempt
from flowllm.rundir.epochs import current_epoch

if TYPE_CHECKING:
    from flowllm.config.provider_schema import ProviderConfig
    from flowllm.providers.base import BaseProvider

log = logging.getLogger(__name__)

BATCH_KEY = "_flowllm_batch"  # in a raw reply: {"id": <batch id>, "reused": bool, "billed_before": bool}
JOURNAL_FILE = "batches.jsonl"
# custom id -> (task, agent, turn): what each batched call stands for, kept by the run (never sent).
BatchRoutes = dict[str, tuple[str, str, int]]


class BatchApi(StrEnum):
    anthropic = "anthropic"  # Message Batches
    openai = "openai"  # the Batch API


@dataclass(frozen=True)
class BatchLimits:
    """What one batch of a batch API may hold (the providers' documented limits)."""

    requests: int
    bytes: int


BATCH_LIMITS = {
    BatchApi.anthropic: BatchLimits(requests=100_000, bytes=256 * 1024 * 1024),  # per batch
    BatchApi.openai: BatchLimits(requests=50_000, bytes=200 * 1024 * 1024),  # per input file
}


@dataclass(frozen=True)
class BatchSettings:
    """``provider.batch`` (checked by the provider config checks), and the byte limit of one batch."""

    max_size: int = 100
    max_wait_s: float = 2.0
    poll_s: float = 5.0
    max_bytes: int = BATCH_LIMITS[BatchApi.openai].bytes


def custom_id(context: CallContext, request: dict[str, Any]) -> str:
    """The call's id within a batch: the same call (a task rerun after a kill) gets the same id; another epoch
    or attempt of the task is another call."""
    who = [context.task_id, current_epoch(), current_attempt(), context.agent, context.scope, context.turn]
    blob = json.dumps([*who, request], sort_keys=True, default=str)
    return "c" + hashlib.sha256(blob.encode()).hexdigest()[:40]


class BatchJournal:
    """``batches.jsonl``: the batches a run created, so a resumed run finds their results."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.items: dict[str, str] = {}  # custom id -> batch id (the latest batch that holds it)
        self.collected: set[str] = set()  # batches whose results an earlier session read (and billed)
        if path is not None and path.is_file():
            for raw in path.read_bytes().splitlines():
                try:
                    entry = orjson.loads(raw)
                except orjson.JSONDecodeError:  # a line cut by a kill: that batch is submitted again
                    continue
                if entry.get("collected"):
                    self.collected.add(str(entry["collected"]))
                    continue
                for item in entry.get("items") or []:
                    self.items[str(item)] = str(entry["batch"])

    def record(self, batch_id: str, items: list[str]) -> None:
        for item in items:
            self.items[item] = batch_id
        if self.path is None:
            return
        with self.path.open("ab") as out:
            out.write(orjson.dumps({"batch": batch_id, "items": items}) + b"\n")
            out.flush()

    def note_collected(self, batch_id: str) -> None:
        if self.path is not None:
            with self.path.open("ab") as out:
                out.write(orjson.dumps({"collected": batch_id}) + b"\n")

    def forget(self, item: str, batch_id: str) -> None:
        """The item's result in ``batch_id`` was not an answer: the next call for it goes into a new batch."""
        if self.items.get(item) == batch_id:
            del self.items[item]


@dataclass
class _Waiting:
    item: str
    params: dict[str, Any]
    future: asyncio.Future[tuple[str, dict[str, Any]]] = field(repr=False)


def split_by_bytes(waiting: list[_Waiting], sizes: list[int], limit: int) -> list[list[_Waiting]]:
    """``waiting`` in order, cut where the next item would take a part past ``limit`` bytes (an item over the
    limit on its own goes alone: the provider refuses it, and only its call fails)."""
    parts: list[list[_Waiting]] = []
    used = 0
    for w, size in zip(waiting, sizes, strict=True):
        if not parts or used + size > limit:
            parts.append([])
            used = 0
        parts[-1].append(w)
        used += size
    return parts


class Batcher:
    """One SDK client's batch queue (a provider with a key pool has one per key); subclasses speak one batch API
    (``_submit``, ``_ended``, ``_read``: results as Anthropic's, ``{"type": succeeded | errored | expired |
    canceled, "message": <the reply body>, "error": {"error": {"type", "message"}}}``)."""

    def __init__(
        self,
        client: Any,
        settings: BatchSettings,
        *,
        provider: str,
        journal: BatchJournal,
        routes: BatchRoutes | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.settings = settings
        self.provider = provider
        self.journal = journal
        self.routes: BatchRoutes = routes if routes is not None else {}
        self.sleep = sleep
        self._queue: list[_Waiting] = []
        self._timer: asyncio.Task[None] | None = None
        self._results: dict[str, asyncio.Task[dict[str, Any]]] = {}  # batch id -> its results by custom id
        self._tasks: set[asyncio.Task[Any]] = set()
        self._created: set[str] = set()  # batches this process created (others are an earlier session's)

    async def call(self, request: dict[str, Any], context: CallContext) -> dict[str, Any]:
        """The reply body to ``request`` (a Messages request), answered through a batch."""
        item = custom_id(context, request)
        known = self.journal.items.get(item)
        if known is not None:
            found = await self._take(known, item, reused=known not in self._created)
            if found is not None:
                return found
        future: asyncio.Future[tuple[str, dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self.routes[item] = (context.task_id, context.agent, context.turn)
        self._queue.append(_Waiting(item, request, future))
        if len(self._queue) >= self.settings.max_size:
            self._spawn(self._flush())
        elif self._timer is None:
            self._timer = self._spawn(self._flush_later())
        batch_id, _ = await asyncio.shield(future)
        found = await self._take(batch_id, item, reused=False)
        assert found is not None  # _take raises for an item that did not succeed
        return found

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _flush_later(self) -> None:
        await self.sleep(self.settings.max_wait_s)
        self._timer = None
        await self._flush()

    async def _flush(self) -> None:
        waiting, self._queue = self._queue[: self.settings.max_size], self._queue[self.settings.max_size :]
        if self._timer is not None and not self._queue:
            self._timer.cancel()
            self._timer = None
        if not waiting:
            return
        sizes = [self._item_bytes(w) for w in waiting]
        for part in split_by_bytes(waiting, sizes, self.settings.max_bytes):
            await self._send(part)

    async def _send(self, waiting: list[_Waiting]) -> None:
        """One batch of ``waiting``: created, journaled, and each call told its batch (or the error)."""
        try:
            batch_id = await self._submit(waiting)
        except Exception as exc:
            error = classify_exception(exc, provider=self.provider)
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(error)
            return
        self._created.add(batch_id)
        self.journal.record(batch_id, [w.item for w in waiting])
        log.debug("batch %s: %d calls", batch_id, len(waiting))
        for w in waiting:
            if not w.future.done():
                w.future.set_result((batch_id, w.params))

    async def _take(self, batch_id: str, item: str, *, reused: bool) -> dict[str, Any] | None:
        """The item's answer from ``batch_id``; None when an earlier session's batch cannot be read (then the
        call is sent again). An item that did not succeed raises (and is forgotten, so its retry is new)."""
        task = self._results.get(batch_id)
        if task is None:
            task = self._results[batch_id] = asyncio.ensure_future(self._collect(batch_id))
        try:
            results = await asyncio.shield(task)
        except ProviderCallError as exc:
            if reused:  # an earlier session's batch the service no longer has: send the call again
                log.warning(
                    "batch %s of an earlier session cannot be read (%s); its calls are sent again", batch_id, exc
                )
                self.journal.forget(item, batch_id)
                return None
            raise
        result = results.get(item)
        if result is None and reused:
            self.journal.forget(item, batch_id)
            return None
        kind = (result or {}).get("type")
        if kind == "succeeded":
            body: dict[str, Any] = dict(result["message"])  # type: ignore[index]
            body[BATCH_KEY] = {"id": batch_id, "reused": reused, "billed_before": batch_id in self.journal.collected}
            return body
        self.journal.forget(item, batch_id)
        if reused:
            return None
        if kind == "expired":
            raise ProviderCallError(
                f"batch {batch_id}: the item expired before it was processed", kind="timeout", provider=self.provider
            )
        if kind == "canceled":
            raise ProviderCallError(f"batch {batch_id} was canceled", kind="server", provider=self.provider)
        error = ((result or {}).get("error") or {}).get("error") or {}
        raise ProviderCallError(
            f"batch {batch_id}: the item errored: {error.get('message') or result}",
            kind="server",
            provider=self.provider,
            error_type=error.get("type"),
        )

    async def _collect(self, batch_id: str) -> dict[str, dict[str, Any]]:
        """Poll until the batch has ended, then read its results: custom id -> result."""
        try:
            while not await self._ended(batch_id):
                await self.sleep(self.settings.poll_s)
            results = await self._read(batch_id)
            self.journal.note_collected(batch_id)
            return results
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise classify_exception(exc, provider=self.provider) from exc

    async def aclose(self) -> None:
        for task in [*self._tasks, *self._results.values()]:
            task.cancel()

    # ----- one batch API ----------------------------------------------------------------------------------
    def _item_bytes(self, waiting: _Waiting) -> int:
        """What one call adds to a batch's size (its request as the batch API carries it)."""
        raise NotImplementedError

    async def _submit(self, waiting: list[_Waiting]) -> str:
        raise NotImplementedError

    async def _ended(self, batch_id: str) -> bool:
        raise NotImplementedError

    async def _read(self, batch_id: str) -> dict[str, dict[str, Any]]:
        raise NotImplementedError


class AnthropicBatcher(Batcher):
    """Anthropic's Message Batches (``client.messages.batches``)."""

    def _item_bytes(self, waiting: _Waiting) -> int:
        return len(orjson.dumps(_anthropic_item(waiting))) + 1  # and its comma in the body's list

    async def _submit(self, waiting: list[_Waiting]) -> str:
        batch = await self.client.messages.batches.create(requests=[_anthropic_item(w) for w in waiting])
        return str(batch.id)

    async def _ended(self, batch_id: str) -> bool:
        batch = await self.client.messages.batches.retrieve(batch_id)
        return bool(batch.processing_status == "ended")

    async def _read(self, batch_id: str) -> dict[str, dict[str, Any]]:
        results: dict[str, dict[str, Any]] = {}
        async for entry in await self.client.messages.batches.results(batch_id):
            results[entry.custom_id] = entry.result.model_dump(mode="json")
        return results


def _anthropic_item(waiting: _Waiting) -> dict[str, Any]:
    return {"custom_id": waiting.item, "params": waiting.params}


# OpenAI's Batch API: a batch ends in one of these; its unfinished items are in the error file with these codes.
OPENAI_DONE = ("completed", "failed", "expired", "cancelled")
OPENAI_ITEM_KINDS = {"batch_expired": "expired", "batch_cancelled": "canceled"}


class OpenAIBatcher(Batcher):
    """OpenAI's Batch API (``client.files`` + ``client.batches``) for Chat Completions or Responses."""

    def __init__(self, client: Any, settings: BatchSettings, *, endpoint: str, **kwargs: Any) -> None:
        super().__init__(client, settings, **kwargs)
        self.endpoint = endpoint  # /v1/chat/completions | /v1/responses
        self._files: dict[str, tuple[str | None, str | None, str]] = {}  # batch -> output, error file, status

    def _line(self, waiting: _Waiting) -> bytes:
        return orjson.dumps({"custom_id": waiting.item, "method": "POST", "url": self.endpoint, "body": waiting.params})

    def _item_bytes(self, waiting: _Waiting) -> int:
        return len(self._line(waiting)) + 1

    async def _submit(self, waiting: list[_Waiting]) -> str:
        lines = b"".join(self._line(w) + b"\n" for w in waiting)
        upload = await self.client.files.create(file=("batch.jsonl", lines, "application/jsonl"), purpose="batch")
        batch = await self.client.batches.create(
            input_file_id=upload.id, endpoint=self.endpoint, completion_window="24h"
        )
        return str(batch.id)

    async def _ended(self, batch_id: str) -> bool:
        batch = await self.client.batches.retrieve(batch_id)
        if batch.status not in OPENAI_DONE:
            return False
        self._files[batch_id] = (batch.output_file_id, batch.error_file_id, str(batch.status))
        return True

    async def _read(self, batch_id: str) -> dict[str, dict[str, Any]]:
        output, errors, status = self._files[batch_id]
        results: dict[str, dict[str, Any]] = {}
        for file_id in (output, errors):
            if not file_id:
                continue
            content = await self.client.files.content(file_id)
            for raw in content.content.splitlines():
                if raw.strip():
                    entry = orjson.loads(raw)
                    results[str(entry["custom_id"])] = _openai_result(entry)
        if not results and status != "completed":
            raise ProviderCallError(f"batch {batch_id} {status}", kind="server", provider=self.provider)
        return results


def _openai_result(entry: dict[str, Any]) -> dict[str, Any]:
    """One line of an OpenAI batch's output or error file, as an Anthropic batch result."""
    response = entry.get("response") or {}
    if response.get("status_code") == 200 and not entry.get("error"):
        return {"type": "succeeded", "message": response.get("body") or {}}
    error = entry.get("error") or ((response.get("body") or {}).get("error")) or {}
    code = str(error.get("code") or error.get("type") or "")
    if code in OPENAI_ITEM_KINDS:
        return {"type": OPENAI_ITEM_KINDS[code]}
    return {"type": "errored", "error": {"error": {"type": code, "message": error.get("message") or str(error)}}}


# Protocols whose official SDK flowllm drives through a batch API, and the OpenAI endpoint each batches.
OPENAI_ENDPOINTS = {"openai_chat": "/v1/chat/completions", "openai_responses": "/v1/responses"}
BATCH_PROTOCOLS = ("anthropic", *OPENAI_ENDPOINTS)


def batch_api(protocol: str) -> BatchApi:
    return BatchApi.openai if protocol in OPENAI_ENDPOINTS else BatchApi.anthropic


def check_batch_config(cfg: ProviderConfig) -> None:
    """``provider.batch``: one line for a setting that cannot work (before the first task)."""
    batch = cfg.batch
    if not batch.enabled:
        return
    if cfg.protocol not in BATCH_PROTOCOLS:
        raise ProviderConfigError(
            f"provider '{cfg.name}': provider.batch needs a batch API (protocol anthropic, openai_chat or "
            f"openai_responses), not protocol {cfg.protocol}"
        )
    if cfg.stream:
        raise ProviderConfigError(f"provider '{cfg.name}': provider.batch cannot stream; set provider.stream=false")
    api = batch_api(cfg.protocol)
    most = BATCH_LIMITS[api].requests
    if isinstance(batch.max_size, bool) or not 1 <= int(batch.max_size) <= most:
        raise ProviderConfigError(
            f"provider.batch.max_size must be from 1 to {most} ({api.value}'s batch limit), not {batch.max_size}"
        )
    for name in ("max_wait_s", "poll_s"):
        value = float(getattr(batch, name))
        if not (value > 0 and math.isfinite(value)):
            raise ProviderConfigError(f"provider.batch.{name} must be a positive number of seconds, not {value}")


def batch_journal(cfg: ProviderConfig, ledger_path: Path | None) -> BatchJournal | None:
    """The run's batch journal (beside its ledger) when ``cfg`` has batch mode on; None otherwise."""
    if not cfg.batch.enabled:
        return None
    return BatchJournal(ledger_path.parent / JOURNAL_FILE if ledger_path is not None else None)


def open_batcher(
    provider: BaseProvider,
    cfg: ProviderConfig,
    journal: BatchJournal,
    sleep: Callable[[float], Awaitable[Any]],
    routes: BatchRoutes | None = None,
) -> Batcher:
    settings = BatchSettings(
        max_size=int(cfg.batch.max_size),
        max_wait_s=float(cfg.batch.max_wait_s),
        poll_s=float(cfg.batch.poll_s),
        max_bytes=BATCH_LIMITS[batch_api(cfg.protocol)].bytes,
    )
    common: dict[str, Any] = {"provider": provider.name, "journal": journal, "routes": routes, "sleep": sleep}
    if cfg.protocol in OPENAI_ENDPOINTS:
        return OpenAIBatcher(provider.client, settings, endpoint=OPENAI_ENDPOINTS[cfg.protocol], **common)
    return AnthropicBatcher(provider.client, settings, **common)
