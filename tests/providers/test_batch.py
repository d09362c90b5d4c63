"""Batch mode against the emulator's Message Batches API, through the official anthropic SDK.

The emulator's batch endpoints are driven as the SDK documents them; the batcher's queue, its handling of
errored, expired and canceled items, its journal (a resumed run takes an earlier batch's results) and the
ledger's batch pricing are checked through ``open_provider`` as a run uses them.
"""

from __future__ import annotations

import asyncio
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import httpx2
import orjson
import pytest
import yaml
from anthropic import AsyncAnthropic

from flowllm.config.provider_schema import BatchConfig, ProviderConfig, RetryConfig
from flowllm.core.interfaces import CallContext
from flowllm.core.types import Usage
from flowllm.emulator import Emulator
from flowllm.providers import UsageLedger, check_provider_config, open_provider
from flowllm.providers.batch import (
    BATCH_KEY,
    OPENAI_ENDPOINTS,
    AnthropicBatcher,
    Batcher,
    BatchJournal,
    BatchRoutes,
    BatchSettings,
    OpenAIBatcher,
    custom_id,
)
from flowllm.providers.errors import ProviderConfigError
from flowllm.run.budget_report import batch_cost
from flowllm.setup.preflight import ProviderTarget, check_providers
from flowllm.spend.pricing import PriceTable
from tests.loopback import serve_http

MODEL = "flowllm-emulator"
PRICES = PriceTable.from_mapping(
    {
        "batch_factors": {"anthropic": 0.5, "openai_chat": 0.5, "openai_responses": 0.5},
        "models": {MODEL: {"input": 2.0, "output": 10.0}},
    }
)
REPLIES = {f"t{n}": [{"text": f"answer \\boxed{{{n}}}"}] for n in range(1, 7)}


def params(text: str = "hi") -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


async def instant(_: float) -> None:
    await asyncio.sleep(0)


def test_the_emulator_speaks_message_batches_through_the_sdk() -> None:
    script = {"tasks": REPLIES, "batches": {"polls": 2, "errored": ["t2"], "expired": ["t3"]}}

    async def scenario() -> None:
        routes = {"a": ["t1", "main", 1], "b": ["t2", "main", 1], "c": ["t3", "main", 1]}
        with Emulator(script, batch_routes=routes) as emu:  # the run's own map, handed over: nothing sent
            client = AsyncAnthropic(base_url=emu.base_url, api_key="x", max_retries=0)
            batch = await client.messages.batches.create(
                requests=[{"custom_id": cid, "params": params()} for cid in routes]
            )
            assert batch.processing_status == "in_progress" and batch.request_counts.processing == 3
            statuses = []
            while (batch := await client.messages.batches.retrieve(batch.id)).processing_status != "ended":
                statuses.append(batch.processing_status)
            assert statuses == ["in_progress", "in_progress"], "scripted: two polls before it ends"
            counts = batch.request_counts
            assert (counts.succeeded, counts.errored, counts.expired, counts.processing) == (1, 1, 1, 0)
            results = {r.custom_id: r.result async for r in await client.messages.batches.results(batch.id)}
            assert results["a"].type == "succeeded" and results["a"].message.content[0].text == "answer \\boxed{1}"
            assert results["b"].type == "errored" and results["c"].type == "expired"

            other = await client.messages.batches.create(requests=[{"custom_id": "d", "params": params()}])
            cancelled = await client.messages.batches.cancel(other.id)
            assert cancelled.processing_status == "ended" and cancelled.cancel_initiated_at is not None
            assert [r.result.type async for r in await client.messages.batches.results(other.id)] == ["canceled"]
            listed = await client.messages.batches.list()
            assert [b.id for b in listed.data] == [other.id, batch.id]

    asyncio.run(scenario())


def write_script(tmp_path: Path, batches: dict[str, Any]) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump({"tasks": REPLIES, "batches": batches}))
    return str(path)


PROTOCOLS = ("anthropic", "openai_chat", "openai_responses")


def batch_config(script: str, protocol: str = "anthropic", **batch: Any) -> ProviderConfig:
    settings = {"enabled": True, "max_size": 2, "max_wait_s": 0.05, "poll_s": 0.01, **batch}
    return ProviderConfig(
        name="emu",
        protocol=protocol,
        model=MODEL,
        emulator_script=script,
        batch=BatchConfig(**settings),
        retry=RetryConfig(base_delay_s=0.0),
    )


async def ask_all(cfg: ProviderConfig, ledger: UsageLedger, tasks: list[str]) -> dict[str, dict[str, Any]]:
    async with open_provider(cfg, ledger=ledger, sleep=instant) as provider:

        async def one(task: str) -> dict[str, Any]:
            request = provider.build_request(
                system=[], messages=[{"role": "user", "content": [{"type": "text", "text": task}]}], tools=[]
            )
            return await provider.send(request, context=CallContext(task_id=task, turn=1))

        replies = await asyncio.gather(*(one(t) for t in tasks))
        for task, raw in zip(tasks, replies, strict=True):
            assert provider.normalize(raw).text == f"answer \\boxed{{{task[1:]}}}"
        return dict(zip(tasks, replies, strict=True))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_calls_of_concurrent_tasks_share_batches_priced_at_the_batch_factor(tmp_path: Path, protocol: str) -> None:
    ledger_path = tmp_path / "usage.jsonl"
    cfg = batch_config(write_script(tmp_path, {}), protocol)
    with UsageLedger(ledger_path, prices=PRICES) as ledger:
        replies = asyncio.run(ask_all(cfg, ledger, ["t1", "t2", "t3", "t4"]))
    batch_ids = {raw[BATCH_KEY]["id"] for raw in replies.values()}
    assert len(batch_ids) == 2, "four calls, max_size 2: two batches"
    lines = [json.loads(line) for line in (tmp_path / "batches.jsonl").read_text().splitlines()]
    journal = [entry for entry in lines if "batch" in entry]
    assert {entry["collected"] for entry in lines if "collected" in entry} == batch_ids, "results read: noted"
    assert {entry["batch"] for entry in journal} == batch_ids and sum(len(e["items"]) for e in journal) == 4
    attempts = [line for line in UsageLedger.read(ledger_path).attempts()]
    assert len(attempts) == 4 and all(a["batch"]["id"] in batch_ids for a in attempts)
    for line in attempts:
        usage = line["usage"]
        full = usage["input_tokens"] * 2.0 + usage["output_tokens"] * 10.0  # cache tokens at the input price here
        assert line["cost_usd"] == pytest.approx(full / 1e6 * 0.5), "half the direct price"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_errored_expired_and_cancelled_items_fail_only_their_calls_and_are_retried(
    tmp_path: Path, protocol: str
) -> None:
    script = write_script(tmp_path, {"errored": ["t1"], "expired": ["t4"], "cancel": [2]})
    ledger_path = tmp_path / "usage.jsonl"
    with UsageLedger(ledger_path, prices=PRICES) as ledger:
        asyncio.run(ask_all(batch_config(script, protocol), ledger, ["t1", "t2", "t3", "t4"]))
    attempts = UsageLedger.read(ledger_path).attempts()
    failed = {(a["task_id"], a["outcome"]) for a in attempts if a["outcome"] != "ok"}
    assert ("t1", "server") in failed and ("t4", "timeout") in failed
    cancelled = [a for a in attempts if "canceled" in (a["error"] or "")]
    assert cancelled and all(a["outcome"] == "server" for a in cancelled)
    assert len({a["task_id"] for a in cancelled}) <= 2, "the cancelled batch failed its own items only"
    ok = {a["task_id"]: a for a in attempts if a["outcome"] == "ok"}
    assert set(ok) == {"t1", "t2", "t3", "t4"}, "every call answered in a later batch"
    for task in ("t1", "t4"):
        first = next(a for a in attempts if a["task_id"] == task and a["outcome"] != "ok")
        assert first["cost_usd"] == 0.0 and ok[task]["attempt"] > first["attempt"]


def test_a_resumed_run_takes_an_earlier_batchs_results_instead_of_paying_twice(tmp_path: Path) -> None:
    journal_path = tmp_path / "batches.jsonl"
    settings = BatchSettings(max_size=10, max_wait_s=0.01, poll_s=0.01)

    async def scenario() -> None:
        routes: BatchRoutes = {}
        with Emulator({"tasks": REPLIES}, batch_routes=routes) as emu:
            client = AsyncAnthropic(base_url=emu.base_url, api_key="x", max_retries=0)
            context = CallContext(task_id="t5", turn=1)
            first = AnthropicBatcher(
                client, settings, provider="emu", journal=BatchJournal(journal_path), routes=routes
            )
            body = await first.call(params("five"), context)
            assert body[BATCH_KEY]["reused"] is False
            await first.aclose()
            # A new process (a rerun after SIGKILL) reads the journal and asks the same call again.
            again = AnthropicBatcher(
                client, settings, provider="emu", journal=BatchJournal(journal_path), routes=routes
            )
            reused = await again.call(params("five"), context)
            assert reused[BATCH_KEY] == {"id": body[BATCH_KEY]["id"], "reused": True, "billed_before": True}
            assert reused["content"] == body["content"]
            assert len((await client.messages.batches.list()).data) == 1, "no second batch was created"
            other = await again.call(params("six"), CallContext(task_id="t6", turn=1))
            assert other[BATCH_KEY]["reused"] is False and len((await client.messages.batches.list()).data) == 2
            await again.aclose()

    asyncio.run(scenario())


def test_a_reused_result_is_not_billed_again(tmp_path: Path) -> None:
    with UsageLedger(tmp_path / "usage.jsonl", prices=PRICES) as ledger:
        line = ledger.attempt(
            call=1, provider="emu", protocol="anthropic", model=MODEL, task_id="t", agent="main", turn=1,
            attempt=1, key=None, started=0.0, latency_s=0.1,
            batch={"id": "msgbatch_1", "reused": True, "billed_before": True},
        )  # fmt: skip
    assert line.cost_usd == 0.0 and line.usage == Usage().to_dict() and line.batch is not None
    assert line.batch["reused"] is True


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stream": True}, "provider.batch cannot stream"),
    ],
)
def test_batch_mode_without_a_batch_api_is_one_config_error(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    cfg = batch_config(write_script(tmp_path, {}))
    for key, value in change.items():
        setattr(cfg, key, value)
    with pytest.raises(ProviderConfigError, match=message):
        check_provider_config(cfg)


def test_a_batch_the_service_lost_is_sent_again(tmp_path: Path) -> None:
    journal_path = tmp_path / "batches.jsonl"
    journal_path.write_text(json.dumps({"batch": "msgbatch_gone", "items": ["ignored"]}) + "\n")

    async def scenario() -> None:
        with Emulator({"tasks": REPLIES}) as emu:
            client = AsyncAnthropic(base_url=emu.base_url, api_key="x", max_retries=0)
            journal = BatchJournal(journal_path)
            batcher = AnthropicBatcher(
                client, BatchSettings(max_wait_s=0.01, poll_s=0.01), provider="emu", journal=journal
            )
            context = CallContext(task_id="t1", turn=1)
            journal.items[custom_id(context, params())] = "msgbatch_gone"  # a batch an earlier emulator held
            body = await batcher.call(params(), context)
            assert body[BATCH_KEY]["reused"] is False and body[BATCH_KEY]["id"] != "msgbatch_gone"
            await batcher.aclose()

    asyncio.run(scenario())


class _NoBatches(BaseHTTPRequestHandler):
    """A compatible server: a models listing, no batch API."""

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"data": [{"id": "m", "type": "model"}], "has_more": False}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def test_the_preflight_refuses_batch_mode_on_a_server_without_a_batch_api() -> None:
    with serve_http(_NoBatches) as url:
        batched = ProviderConfig(name="local", model="m", base_url=url, batch=BatchConfig(enabled=True))
        direct = ProviderConfig(name="direct", model="m", base_url=url)
        problems = asyncio.run(
            check_providers([ProviderTarget("local", batched), ProviderTarget("direct", direct)], timeout_s=10)
        )
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"provider 'local' at {url}: provider.batch is on but it has no batch API")
    assert "HTTP 404" in problems[0]


def test_the_emulator_speaks_openais_batch_api_through_the_sdk() -> None:
    from openai import AsyncOpenAI

    script = {"tasks": REPLIES, "batches": {"polls": 1, "errored": ["t2"], "expired": ["t3"]}}

    async def scenario() -> None:
        routes = {"a": ["t1", "main", 1], "b": ["t2", "main", 1], "c": ["t3", "main", 1]}
        with Emulator(script, batch_routes=routes) as emu:
            client = AsyncOpenAI(base_url=emu.openai_base_url, api_key="x", max_retries=0)
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            lines = "".join(
                json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"
                for c in routes
            )
            upload = await client.files.create(file=("in.jsonl", lines.encode(), "application/jsonl"), purpose="batch")
            assert upload.purpose == "batch" and upload.bytes == len(lines.encode())
            batch = await client.batches.create(
                input_file_id=upload.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            assert batch.status == "in_progress" and batch.request_counts.total == 3
            assert (await client.batches.retrieve(batch.id)).status == "in_progress"  # one scripted poll
            batch = await client.batches.retrieve(batch.id)
            assert batch.status == "completed" and batch.request_counts.completed == 1
            assert batch.output_file_id and batch.error_file_id
            output = [json.loads(x) for x in (await client.files.content(batch.output_file_id)).text.splitlines()]
            assert output[0]["custom_id"] == "a" and output[0]["response"]["status_code"] == 200
            assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "answer \\boxed{1}"
            errors = {
                e["custom_id"]: e["error"]["code"]
                for e in map(json.loads, (await client.files.content(batch.error_file_id)).text.splitlines())
            }
            assert errors == {"b": "server_error", "c": "batch_expired"}
            other = await client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            assert (await client.batches.cancel(other.id)).status == "cancelled"
            assert [b.id async for b in client.batches.list()] == [other.id, batch.id]

    asyncio.run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_thousand_batched_calls_send_the_provider_nothing_but_their_requests(protocol: str) -> None:
    """What each custom id stands for stays with the run: no header grows with the batch (task ids never leave),
    and the emulator the run started answers each call from the run's own map."""
    from openai import AsyncOpenAI

    tasks = [f"t{n}" for n in range(1000)]
    script = {"tasks": {t: [{"text": f"answer {t}"}] for t in tasks}}
    sent: list[dict[str, str]] = []

    async def keep(request: Any) -> None:
        sent.append(dict(request.headers))

    async def scenario() -> list[dict[str, Any]]:
        routes: BatchRoutes = {}
        settings = BatchSettings(max_size=1000, max_wait_s=0.5, poll_s=0.01)
        with Emulator(script, batch_routes=routes) as emu:
            common: dict[str, Any] = {"provider": "emu", "journal": BatchJournal(None), "routes": routes}
            batcher: Batcher
            if protocol == "anthropic":  # each SDK with the HTTP package it is built on
                hooks: Any = httpx2.AsyncClient(event_hooks={"request": [keep]})
                client: Any = AsyncAnthropic(base_url=emu.base_url, api_key="x", max_retries=0, http_client=hooks)
                batcher = AnthropicBatcher(client, settings, **common)
            else:
                hooks = httpx.AsyncClient(event_hooks={"request": [keep]})
                client = AsyncOpenAI(base_url=emu.openai_base_url, api_key="x", max_retries=0, http_client=hooks)
                batcher = OpenAIBatcher(client, settings, endpoint=OPENAI_ENDPOINTS[protocol], **common)
            body = params() if protocol != "openai_responses" else {"model": MODEL, "input": "hi"}
            replies = await asyncio.gather(*(batcher.call(body, CallContext(task_id=t, turn=1)) for t in tasks))
            await batcher.aclose()
            return replies

    replies = asyncio.run(scenario())
    assert len({r[BATCH_KEY]["id"] for r in replies}) == 1
    for task, reply in zip(tasks, replies, strict=True):
        assert f"answer {task}" in json.dumps(reply), "each call answered as its own task"
    assert sent and not [name for headers in sent for name in headers if name.startswith("x-flowllm")]


@pytest.mark.parametrize(
    ("protocol", "most"), [("anthropic", 100_000), ("openai_chat", 50_000), ("openai_responses", 50_000)]
)
def test_a_batch_size_over_the_providers_limit_is_refused_at_start(tmp_path: Path, protocol: str, most: int) -> None:
    script = write_script(tmp_path, {})
    check_provider_config(batch_config(script, protocol, max_size=most))
    with pytest.raises(ProviderConfigError, match=f"provider.batch.max_size must be from 1 to {most} "):
        check_provider_config(batch_config(script, protocol, max_size=most + 1))


def test_a_queue_past_the_byte_limit_goes_out_as_several_batches() -> None:
    one = len(orjson.dumps({"custom_id": "c" + "0" * 40, "params": params("t1")})) + 1
    settings = BatchSettings(max_size=10, max_wait_s=0.05, poll_s=0.01, max_bytes=2 * one)  # two calls a batch

    async def scenario() -> None:
        routes: BatchRoutes = {}
        with Emulator({"tasks": REPLIES}, batch_routes=routes) as emu:
            client = AsyncAnthropic(base_url=emu.base_url, api_key="x", max_retries=0)
            batcher = AnthropicBatcher(client, settings, provider="emu", journal=BatchJournal(None), routes=routes)
            tasks = ["t1", "t2", "t3", "t4", "t5"]
            replies = await asyncio.gather(*(batcher.call(params(t), CallContext(task_id=t, turn=1)) for t in tasks))
            await batcher.aclose()
            assert [r["content"][0]["text"] for r in replies] == [f"answer \\boxed{{{t[1:]}}}" for t in tasks]
            assert len({r[BATCH_KEY]["id"] for r in replies}) == 3, "five calls, two a batch by size"
            assert len((await client.messages.batches.list()).data) == 3

    asyncio.run(scenario())


@pytest.mark.parametrize(("empty_reply_batched", "factor"), [(True, 0.5), (False, None)])
def test_the_summary_claims_the_batch_price_only_when_every_billed_call_was_batched(
    tmp_path: Path, empty_reply_batched: bool, factor: float | None
) -> None:
    """An empty reply is billed though it is retried: when it went out directly, not every billed call got the
    batch price, and the summary's cost says no batch factor."""
    batch = {"id": "msgbatch_1", "item": "c1"}
    lines = [
        {
            "type": "attempt",
            "task_id": "t",
            "outcome": "empty_reply",
            "cost_usd": 0.001,
            "batch": batch if empty_reply_batched else None,
        },
        {"type": "attempt", "task_id": "t", "outcome": "ok", "cost_usd": 0.002, "batch": batch},
        {"type": "attempt", "task_id": "t", "outcome": "rate_limited", "cost_usd": 0.0, "batch": None},  # not billed
    ]
    (tmp_path / "usage.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    prices = PriceTable(batch_factors={"anthropic": 0.5})
    assert batch_cost({"total_usd": 0.003}, prices, "anthropic", tmp_path).get("batch_factor") == factor
