"""The batch APIs, emulated: Anthropic's Message Batches (below) and OpenAI's Batch API (``OpenAIBatches``:
files upload and content, batches create, retrieve, list, cancel, output and error files as JSONL).

    POST /v1/messages/batches                {"requests": [{"custom_id": ..., "params": {<a Messages request>}}]}
    GET  /v1/messages/batches                list, newest first ({"data", "has_more", "first_id", "last_id"})
    GET  /v1/messages/batches/{id}           the batch (processing_status in_progress | canceling | ended)
    POST /v1/messages/batches/{id}/cancel    ends it: its unprocessed items are ``canceled``
    GET  /v1/messages/batches/{id}/results   one JSON line per item: succeeded | errored | canceled | expired

Each item is answered as ``POST /v1/messages`` answers the same body. The task, agent and turn an item belongs to
(which the script's replies are keyed on) are not in the request, as with a real provider: an emulator a run
starts for itself is handed the run's map ``{custom_id: (task, agent, turn)}`` (``batch_routes``); an item it
does not know is answered with the script's default replies, at the turn its messages count.

The script's ``batches:`` section scripts the service's behaviour:

    batches:
      polls: 2              # retrieves that still find a batch in_progress before it has ended (default 1)
      errored: [TASK]       # the first item of each of these tasks ends errored (its retry succeeds)
      expired: [TASK]       # ... ends expired
      cancel: [2]           # the n-th batch created (1-based) is cancelled by the service: all its items canceled
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from flowllm.emulator import anthropic_wire, openai_chat_wire, openai_responses_wire
from flowllm.emulator.common import RequestError, plan_reply, request_image_digests
from flowllm.emulator.prompt_cache import PromptCache, cache_owner
from flowllm.emulator.script import Script, ScriptError

BATCH_KEYS = frozenset({"polls", "errored", "expired", "cancel"})


@dataclass(frozen=True)
class BatchScript:
    polls: int = 1
    errored: frozenset[str] = frozenset()
    expired: frozenset[str] = frozenset()
    cancel: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, raw: Any, where: str = "batches") -> BatchScript:
        if not raw:
            return cls()
        if not isinstance(raw, dict) or set(raw) - BATCH_KEYS:
            raise ScriptError(f"{where}: expected a mapping of {', '.join(sorted(BATCH_KEYS))}")
        polls = raw.get("polls", 1)
        if not isinstance(polls, int) or isinstance(polls, bool) or polls < 0:
            raise ScriptError(f"{where}.polls must be a whole number >= 0")
        return cls(
            polls=polls,
            errored=frozenset(str(t) for t in raw.get("errored") or []),
            expired=frozenset(str(t) for t in raw.get("expired") or []),
            cancel=frozenset(int(n) for n in raw.get("cancel") or []),
        )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Batch:
    id: str
    number: int
    created_at: str
    results: list[dict[str, Any]]  # one per item, in request order
    polls_left: int
    status: str = "in_progress"
    ended_at: str | None = None
    cancel_initiated_at: str | None = None
    base_url: str = ""
    retrieved: int = field(default=0)

    def end(self, canceled: bool = False) -> None:
        if self.status == "ended":
            return
        if canceled:
            self.results = [{"custom_id": r["custom_id"], "result": {"type": "canceled"}} for r in self.results]
        self.status = "ended"
        self.ended_at = _now()

    def counts(self) -> dict[str, int]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if self.status != "ended":
            counts["processing"] = len(self.results)
            return counts
        for item in self.results:
            counts[item["result"]["type"]] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.status,
            "request_counts": self.counts(),
            "created_at": self.created_at,
            "expires_at": self.created_at,
            "ended_at": self.ended_at,
            "archived_at": None,
            "cancel_initiated_at": self.cancel_initiated_at,
            "results_url": f"{self.base_url}/v1/messages/batches/{self.id}/results" if self.status == "ended" else None,
        }


class AnthropicBatches:
    """The batches of one emulator (in memory: a restarted emulator has none, like an expired batch)."""

    def __init__(
        self,
        script: Script,
        raw_batches: Any,
        routes: Mapping[str, Sequence[Any]] | None = None,
        cache: PromptCache | None = None,
    ) -> None:
        self.script = script
        # Message Batches read and write the prompt cache like direct calls ("Prompt caching ... with the Message
        # Batches API", docs.claude.com/en/docs/build-with-claude/batch-processing; hits are best effort there,
        # here they follow the same rules as a direct call): an item bills what the same call made directly would.
        self.cache = cache
        self.behaviour = BatchScript.parse(raw_batches)
        self.known: Mapping[str, Sequence[Any]] = routes if routes is not None else {}
        self.batches: dict[str, _Batch] = {}
        self._numbers = itertools.count(1)
        self._failed_once: set[str] = set()  # tasks whose scripted item failure already happened

    def routes(self) -> list[Route]:
        return [
            Route("/v1/messages/batches", self._create, methods=["POST"]),
            Route("/v1/messages/batches", self._list, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}", self._retrieve, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}/cancel", self._cancel, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}/results", self._results, methods=["GET"]),
        ]

    # ----- answering one item ------------------------------------------------------------------------------
    def _answer(self, custom_id: str, params: Any, wire: Any = anthropic_wire, key: str = "") -> dict[str, Any]:
        task, agent, turn = [*self.known.get(custom_id, ()), None, None, None][:3]
        failure = self._scripted_failure(task)
        if failure is not None:
            return {"custom_id": custom_id, "result": failure}
        try:
            parsed = wire.parse_request(params)
            if parsed.stream:
                raise RequestError("stream is not allowed in a batch request", param="stream")
        except RequestError as err:
            body = wire.error_body(err, f"req_{custom_id}")
            return {"custom_id": custom_id, "result": {"type": "errored", "error": body}}
        number = int(turn) if isinstance(turn, int) or (isinstance(turn, str) and turn.isdigit()) else parsed.turn
        reply = self.script.reply(
            self.script.key(task, agent), number, parsed.tool_results, tuple(request_image_digests(params))
        )
        if wire is anthropic_wire:
            owner = cache_owner(key, str(task or ""), str(agent or ""))
            cache = self.cache.anthropic(owner, parsed.model, parsed.units) if self.cache is not None else None
            plan = plan_reply(parsed, reply, call_prefix="toolu_", cache=cache)
            return {
                "custom_id": custom_id,
                "result": {"type": "succeeded", "message": anthropic_wire.message_json(plan)},
            }
        plan = plan_reply(parsed, reply, call_prefix="call_")
        body = (
            openai_chat_wire.completion_json(plan, parsed)
            if wire is openai_chat_wire
            else openai_responses_wire.response_json(plan, parsed)
        )
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": body}}

    def _scripted_failure(self, task: Any) -> dict[str, Any] | None:
        if task is None or str(task) in self._failed_once:
            return None
        if str(task) in self.behaviour.errored:
            self._failed_once.add(str(task))
            error = {"type": "api_error", "message": "scripted batch item error"}
            return {"type": "errored", "error": {"type": "error", "error": error}}
        if str(task) in self.behaviour.expired:
            self._failed_once.add(str(task))
            return {"type": "expired"}
        return None

    # ----- endpoints ---------------------------------------------------------------------------------------
    async def _create(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _error(f"There was an error parsing the body: {exc}")
        items = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            return _error("requests: a non-empty list is required")
        ids = [i.get("custom_id") if isinstance(i, dict) else None for i in items]
        if any(not isinstance(c, str) or not c for c in ids) or len(set(ids)) != len(ids):
            return _error("requests: every item needs a unique custom_id")
        number = next(self._numbers)
        cancelled = number in self.behaviour.cancel  # its items are never processed (no scripted failure used)
        answers = [
            {"custom_id": str(i["custom_id"]), "result": {"type": "canceled"}}
            if cancelled
            else self._answer(str(i["custom_id"]), i.get("params"), key=_sender_key(request))
            for i in items
        ]
        batch = _Batch(
            id=f"msgbatch_{number:04d}{int(time.time() * 1000) % 10**8:08d}",
            number=number,
            created_at=_now(),
            results=answers,
            polls_left=self.behaviour.polls,
            base_url=str(request.base_url).rstrip("/"),
        )
        if cancelled:
            batch.cancel_initiated_at = _now()
            batch.end(canceled=True)
        self.batches[batch.id] = batch
        return JSONResponse(batch.to_json())

    def _find(self, request: Request) -> _Batch | None:
        return self.batches.get(str(request.path_params["batch_id"]))

    async def _retrieve(self, request: Request) -> Response:
        batch = self._find(request)
        if batch is None:
            return _error("batch not found", status=404, kind="not_found_error")
        if batch.status == "in_progress":
            if batch.polls_left <= 0:
                batch.end()
            else:
                batch.polls_left -= 1
        return JSONResponse(batch.to_json())

    async def _list(self, request: Request) -> Response:
        data = [b.to_json() for b in sorted(self.batches.values(), key=lambda b: b.number, reverse=True)]
        return JSONResponse(
            {
                "data": data,
                "has_more": False,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )

    async def _cancel(self, request: Request) -> Response:
        batch = self._find(request)
        if batch is None:
            return _error("batch not found", status=404, kind="not_found_error")
        if batch.status != "ended":
            batch.cancel_initiated_at = _now()
            batch.end(canceled=True)
        return JSONResponse(batch.to_json())

    async def _results(self, request: Request) -> Response:
        batch = self._find(request)
        if batch is None:
            return _error("batch not found", status=404, kind="not_found_error")
        if batch.status != "ended":
            return _error(f"batch {batch.id} has not ended yet", status=400)
        lines = "".join(json.dumps(item) + "\n" for item in batch.results)
        return Response(lines, media_type="application/binary")


def _sender_key(request: Request) -> str:
    """The key the batch was sent with (whose prompt cache its items use; never logged)."""
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")


def _error(message: str, *, status: int = 400, kind: str = "invalid_request_error") -> Response:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


OPENAI_WIRES = {"/v1/chat/completions": openai_chat_wire, "/v1/responses": openai_responses_wire}
_ITEM_CODES = {"expired": "batch_expired", "canceled": "batch_cancelled"}


class OpenAIBatches:
    """OpenAI's Batch API: ``POST /v1/files`` (purpose batch), ``GET /v1/files/{id}/content``, ``POST /v1/batches``,
    ``GET /v1/batches[/{id}]``, ``POST /v1/batches/{id}/cancel``; the output and error files as JSONL. Items are
    answered by the same script, with the same ``batches:`` behaviour, as the Message Batches."""

    def __init__(self, anthropic: AnthropicBatches) -> None:
        self.items = anthropic  # answers items and holds the scripted behaviour
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._polls: dict[str, int] = {}
        self._outputs: dict[str, list[dict[str, Any]]] = {}
        self._numbers = itertools.count(1)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self._upload, methods=["POST"]),
            Route("/v1/files/{file_id}/content", self._content, methods=["GET"]),
            Route("/v1/batches", self._create, methods=["POST"]),
            Route("/v1/batches", self._list, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self._retrieve, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self._cancel, methods=["POST"]),
        ]

    def _file(self, data: bytes, purpose: str, name: str) -> dict[str, Any]:
        file_id = f"file-{len(self.files) + 1:06d}"
        self.files[file_id] = data
        return {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": name, "purpose": purpose, "status": "processed"}  # fmt: skip

    async def _upload(self, request: Request) -> Response:
        form = await request.form()
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            return _openai_error("file: a file is required")
        return JSONResponse(self._file(await upload.read(), str(form.get("purpose") or ""), upload.filename or ""))

    async def _content(self, request: Request) -> Response:
        data = self.files.get(str(request.path_params["file_id"]))
        if data is None:
            return _openai_error("No such File object", status=404)
        return Response(data, media_type="application/octet-stream")

    async def _create(self, request: Request) -> Response:
        body = json.loads(await request.body())
        wire = OPENAI_WIRES.get(str(body.get("endpoint")))
        data = self.files.get(str(body.get("input_file_id")))
        if wire is None or data is None:
            return _openai_error("endpoint must be /v1/chat/completions or /v1/responses, with an uploaded file")
        number = next(self._numbers)
        cancelled = number in self.items.behaviour.cancel
        lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        answers = [
            {"custom_id": str(item["custom_id"]), "result": {"type": "canceled"}}
            if cancelled
            else self.items._answer(str(item["custom_id"]), item.get("body"), wire)
            for item in lines
        ]
        batch_id = f"batch_{number:04d}{int(time.time() * 1000) % 10**8:08d}"
        self._outputs[batch_id] = answers
        self._polls[batch_id] = self.items.behaviour.polls
        self.batches[batch_id] = {
            "id": batch_id, "object": "batch", "endpoint": body["endpoint"], "errors": None,
            "input_file_id": body["input_file_id"], "completion_window": body.get("completion_window", "24h"),
            "status": "in_progress", "output_file_id": None, "error_file_id": None, "created_at": int(time.time()),
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0}, "metadata": body.get("metadata"),
        }  # fmt: skip
        if cancelled:
            self._end(batch_id, "cancelled")
        return JSONResponse(self.batches[batch_id])

    def _end(self, batch_id: str, status: str) -> None:
        batch = self.batches[batch_id]
        if batch["status"] in ("completed", "cancelled", "expired", "failed"):
            return
        ok, failed = [], []
        for answer in self._outputs[batch_id]:
            result, custom = answer["result"], answer["custom_id"]
            if status == "cancelled":
                result = {"type": "canceled"}
            if result["type"] == "succeeded":
                response = {"status_code": 200, "request_id": f"req_{custom}", "body": result["message"]}
                ok.append({"id": f"batch_req_{custom}", "custom_id": custom, "response": response, "error": None})
                continue
            code = _ITEM_CODES.get(result["type"], "server_error")
            message = ((result.get("error") or {}).get("error") or {}).get("message") or result["type"]
            failed.append({"id": f"batch_req_{custom}", "custom_id": custom, "response": None,
                           "error": {"code": code, "message": message}})  # fmt: skip
        batch["status"] = status
        if ok:
            batch["output_file_id"] = self._file(
                b"".join(json.dumps(x).encode() + b"\n" for x in ok), "batch_output", "output.jsonl"
            )["id"]
        if failed:
            batch["error_file_id"] = self._file(
                b"".join(json.dumps(x).encode() + b"\n" for x in failed), "batch_output", "errors.jsonl"
            )["id"]
        batch["request_counts"] = {"total": len(ok) + len(failed), "completed": len(ok), "failed": len(failed)}

    async def _retrieve(self, request: Request) -> Response:
        batch_id = str(request.path_params["batch_id"])
        if batch_id not in self.batches:
            return _openai_error("No such Batch object", status=404)
        if self.batches[batch_id]["status"] == "in_progress":
            if self._polls[batch_id] <= 0:
                self._end(batch_id, "completed")
            else:
                self._polls[batch_id] -= 1
        return JSONResponse(self.batches[batch_id])

    async def _list(self, request: Request) -> Response:
        data = list(reversed(self.batches.values()))
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return JSONResponse({"object": "list", "data": data, "has_more": False, "first_id": first, "last_id": last})

    async def _cancel(self, request: Request) -> Response:
        batch_id = str(request.path_params["batch_id"])
        if batch_id not in self.batches:
            return _openai_error("No such Batch object", status=404)
        self._end(batch_id, "cancelled")
        return JSONResponse(self.batches[batch_id])


def _openai_error(message: str, *, status: int = 400) -> Response:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": None}}, status_code=status
    )
