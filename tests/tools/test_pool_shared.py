"""Pool behaviour that leaves the server healthy, checked against one shared real stdio server (a server
costs about a second to start, so these tests share it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from flowllm.core.interfaces import ToolBackend
from flowllm.tools import ToolPool, open_tool_pool
from tests.tools.helpers import flaky_config

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ToolPool]:
    root = tmp_path_factory.mktemp("shared-pool")
    (root / "ws").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLAKY_KEY", "from-env")
        cfg = flaky_config(root, blacklist=["secret"], requires_env=["FLAKY_KEY"])
        async with open_tool_pool(cfg, root / "ws") as opened:
            yield opened


async def call(pool: ToolPool, name: str, arguments: dict, *, server: str | None = "flaky", timeout_s: float = 30):
    return await pool.call(server, name, arguments, call_id=f"id-{name}", timeout_s=timeout_s)


async def test_lists_the_servers_own_tools_minus_the_blacklist(pool: ToolPool) -> None:
    assert isinstance(pool, ToolBackend)
    tools = await pool.list_tools()
    names = [t["name"] for t in tools]
    assert "sleep" in names and "pick" in names
    assert "secret" not in names
    assert all(t["server"] == "flaky" for t in tools)
    pick = next(t for t in tools if t["name"] == "pick")
    assert pick["description"] == "Echo a validated choice."
    assert pick["input_schema"]["required"] == ["color", "count"]

    hidden = await call(pool, "secret", {})
    assert hidden.is_error and "disabled" in hidden.content
    assert "should never be seen" not in hidden.content


async def test_the_server_gets_the_workspace_and_its_key_and_results_hide_the_path(pool: ToolPool) -> None:
    result = await call(pool, "where", {})
    assert not result.is_error
    # The server printed the absolute workspace path; the pool shows it as '.'.
    assert result.content.startswith(". pid=")
    assert result.content.endswith("key=from-env")
    assert str(pool.workspace) not in result.content


async def test_routing_corrects_a_wrong_server_and_reports_unknown_tools(pool: ToolPool) -> None:
    fixed = await call(pool, "sleep", {"seconds": 0}, server="tool-flaky")
    assert (fixed.is_error, fixed.server, fixed.content) == (False, "flaky", "slept 0")
    missing_server = await call(pool, "sleep", {"seconds": 0}, server=None)
    assert (missing_server.is_error, missing_server.server) == (False, "flaky")

    unknown = await call(pool, "fly", {})
    assert unknown.is_error
    assert "unknown tool 'fly'" in unknown.content and "flaky: sleep, block" in unknown.content
    assert unknown.call_id == "id-fly"


async def test_arguments_are_checked_against_the_schema_before_the_call(pool: ToolPool) -> None:
    good = await call(pool, "pick", {"color": "red", "count": 2, "tags": ["a"]})
    assert (good.is_error, good.content) == (False, "2 red ['a']")

    bad = await call(pool, "pick", {"color": "blue", "count": "2"})
    assert bad.is_error
    assert 'argument \'color\' must be one of "red", "green"' in bad.content
    assert "argument 'count' must be integer, got string" in bad.content
    assert "Expected: color:" in bad.content

    missing = await call(pool, "pick", {"color": "red"})
    assert missing.is_error and "missing required argument 'count' (integer)" in missing.content

    not_an_object = await pool.call("flaky", "pick", ["red", 2], call_id="x", timeout_s=5)  # type: ignore[arg-type]
    assert not_an_object.is_error and "must be a JSON object" in not_an_object.content


async def test_a_slow_tool_times_out_and_the_server_keeps_serving(pool: ToolPool) -> None:
    slow = await call(pool, "sleep", {"seconds": 30}, timeout_s=0.5)
    assert slow.is_error and "did not finish within 0.5 s" in slow.content
    after = await call(pool, "sleep", {"seconds": 0, "label": "after"})
    assert (after.is_error, after.content) == (False, "slept 0 after")


async def test_parallel_calls_all_come_back_with_their_own_ids(pool: ToolPool) -> None:
    labels = ["c", "a", "b"]
    results = await asyncio.gather(
        *(pool.call("flaky", "sleep", {"seconds": 1, "label": x}, call_id=x, timeout_s=30) for x in labels)
    )
    assert {r.call_id: r.content for r in results} == {x: f"slept 1 {x}" for x in labels}


async def test_one_failing_call_does_not_lose_the_others(pool: ToolPool) -> None:
    results = await asyncio.gather(
        pool.call("flaky", "sleep", {"seconds": 20}, call_id="slow", timeout_s=0.5),
        pool.call("flaky", "sleep", {"seconds": 0.2, "label": "ok"}, call_id="ok", timeout_s=30),
        pool.call("flaky", "pick", {"color": 1}, call_id="bad", timeout_s=30),
    )
    by_id = {r.call_id: r for r in results}
    assert by_id["slow"].is_error and "did not finish" in by_id["slow"].content
    assert (by_id["ok"].is_error, by_id["ok"].content) == (False, "slept 0.2 ok")
    assert by_id["bad"].is_error and "invalid arguments" in by_id["bad"].content


async def test_long_results_are_cut_with_a_note(pool: ToolPool) -> None:
    result = await call(pool, "big", {"chars": 50_000})
    small = await call(pool, "big", {"chars": 2000})
    assert result.content.startswith("x" * 2000)
    assert "48,000 of 50,000 characters cut" in result.content
    assert len(result.content) < 2200
    assert small.content == "x" * 2000


async def test_same_call_same_result(pool: ToolPool, tmp_path: Path) -> None:
    first = await call(pool, "pick", {"color": "green", "count": 3})
    second = await call(pool, "pick", {"color": "green", "count": 3})
    assert first.to_dict() == second.to_dict()
