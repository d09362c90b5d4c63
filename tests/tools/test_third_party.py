"""The pool against real MCP servers nobody here wrote: PyPI ``mcp-server-time`` and npm
``@modelcontextprotocol/server-everything`` (stdio, and its streamable-HTTP mode on 127.0.0.1), by
configuration alone, through both tool protocols. Each server starts once for the module."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from flowllm.nodes.dispatch import results_message
from flowllm.tools import ToolCatalog, ToolPool, format_tool_result, open_tool_catalog, open_tool_pool
from tests.compat.server import stop_process
from tests.tools.helpers import LOOPBACK_PRELOAD, alive, descendants, everything_or_skip, needs_proc

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIME = {"command": "python", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"], "scope": "run"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_everything() -> Iterator[str]:
    """server-everything's streamable-HTTP mode, bound to 127.0.0.1; yields its URL."""
    entry = everything_or_skip()
    port = free_port()
    proc = subprocess.Popen(
        ["node", "-r", str(LOOPBACK_PRELOAD), str(entry), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the server says when it listens; a hang guard is the test timeout
            if "listening on port" in line:
                break
        else:
            pytest.fail("server-everything's HTTP mode exited before listening")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def tools_cfg(http_everything: str) -> dict[str, Any]:
    entry = everything_or_skip()
    return {
        "name": "third-party",
        "servers": {
            "time": TIME,
            "everything": {"command": "node", "args": [str(entry), "stdio"], "timeout_s": 60},
            "remote": {"url": http_everything, "headers": {"X-Flowllm-Test": "FLOWLLM_TEST_HEADER"}},
            "down": {"url": f"http://127.0.0.1:{free_port()}/mcp"},
        },
        "max_result_chars": 5000,
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def catalog(tools_cfg: dict[str, Any]) -> AsyncIterator[ToolCatalog]:
    before = descendants()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWLLM_TEST_HEADER", "yes")
        async with open_tool_catalog(tools_cfg) as opened:
            started = descendants() - before
            yield opened
    # The run-scoped servers (time) stop with the run's catalog.
    assert started and alive(started) == set()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(
    tools_cfg: dict[str, Any], catalog: ToolCatalog, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ToolPool]:
    workspace = tmp_path_factory.mktemp("third-party") / "workspace"
    workspace.mkdir()
    async with open_tool_pool(tools_cfg, workspace, catalog=catalog) as opened:
        yield opened


async def call(pool: ToolPool, server: str | None, name: str, arguments: dict[str, Any], timeout_s: float = 60):
    return await pool.call(server, name, arguments, call_id=f"id-{name}", timeout_s=timeout_s)


async def test_listing_schemas_and_instructions(pool: ToolPool) -> None:
    tools = {(t["server"], t["name"]): t for t in await pool.list_tools()}
    current = tools[("time", "get_current_time")]
    assert "timezone" in current["input_schema"]["required"]
    assert tools[("everything", "echo")]["input_schema"]["properties"]["message"]["type"] == "string"
    assert ("remote", "echo") in tools
    # server-everything declares resources: the pool offers the model a reader for them.
    assert ("everything", "read_resource") in tools
    first = next(t for t in tools.values() if t["server"] == "everything")
    assert first.get("server_instructions"), "server-everything sends instructions: they join the tool manual"
    assert len(first["server_instructions"]) <= 2000 + 40


async def test_an_error_from_a_real_server_reads_as_an_error_in_both_protocols(pool: ToolPool) -> None:
    bad = await call(pool, "time", "get_current_time", {"timezone": "Mars/Olympus_Mons"})
    assert bad.is_error
    assert format_tool_result(bad).startswith('<tool_result server="time" tool="get_current_time" is_error="true">')
    native = results_message([bad], native=True)["content"][0]
    assert native["is_error"] is True
    good = await call(pool, "time", "get_current_time", {"timezone": "Europe/Paris"})
    assert not good.is_error and "Europe/Paris" in good.content
    assert "is_error" not in format_tool_result(good)


async def test_schema_errors_name_the_expected_arguments(pool: ToolPool) -> None:
    result = await call(pool, "everything", "echo", {"text": "hi"})
    assert result.is_error and "invalid arguments for everything.echo" in result.content
    assert "message: string (required)" in result.content


async def test_an_image_keeps_its_place_between_the_texts_in_both_protocols(pool: ToolPool) -> None:
    result = await call(pool, "everything", "get-tiny-image", {})
    assert [p["type"] for p in result.parts] == ["text", "image", "text"]
    assert result.images and result.images[0]["media_type"] == "image/png"
    native = results_message([result], native=True)["content"][0]["content"]
    assert [b["type"] for b in native] == ["text", "image", "text"]
    text = results_message([result], native=False)["content"]
    assert "[image 1 of this result, attached below]" in text[0]["text"]
    assert [b["type"] for b in text] == ["text", "image"]


async def test_resources_embedded_and_read_through_the_offered_tool(pool: ToolPool) -> None:
    ref = await call(pool, "everything", "get-resource-reference", {"resourceType": "Text", "resourceId": 2})
    assert not ref.is_error and "demo://resource/dynamic/text/2" in ref.content
    read = await call(pool, "everything", "read_resource", {"uri": "demo://resource/dynamic/text/2"})
    assert not read.is_error and "2" in read.content
    missing = await call(pool, "everything", "read_resource", {"uri": "demo://nothing/here"})
    assert missing.is_error and "demo://nothing/here" in missing.content


async def test_structured_content_is_kept(pool: ToolPool) -> None:
    result = await call(pool, "everything", "get-structured-content", {"location": "Chicago"})
    assert isinstance(result.structured, dict) and {"temperature", "conditions"} <= set(result.structured)
    assert result.to_dict()["structured"] == result.structured


async def test_progress_notifications_are_recorded_with_the_result(pool: ToolPool) -> None:
    result = await call(pool, "everything", "trigger-long-running-operation", {"duration": 0.3, "steps": 3})
    assert not result.is_error
    assert [p["progress"] for p in result.progress] == [1, 2, 3]
    assert all(p["total"] == 3 for p in result.progress)


async def test_a_timeout_abandons_the_call_and_the_server_still_answers(pool: ToolPool) -> None:
    slow = await call(pool, "everything", "trigger-long-running-operation", {"duration": 60, "steps": 2}, 0.5)
    assert slow.is_error and "did not finish within 0.5 s" in slow.content
    echo = await call(pool, "everything", "echo", {"message": "still here"})
    assert not echo.is_error and "still here" in echo.content


async def test_cancelling_a_call_propagates_and_the_server_still_answers(pool: ToolPool) -> None:
    running = asyncio.create_task(
        call(pool, "everything", "trigger-long-running-operation", {"duration": 60, "steps": 60})
    )
    await asyncio.sleep(0.5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    echo = await call(pool, "everything", "echo", {"message": "after cancel"})
    assert not echo.is_error and "after cancel" in echo.content


async def test_roots_are_the_task_workspace(pool: ToolPool) -> None:
    # server-everything registers get-roots-list after the handshake and announces it with tools/list_changed.
    async with asyncio.timeout(30):
        while ("everything", "get-roots-list") not in {(t["server"], t["name"]) for t in await pool.list_tools()}:
            await asyncio.sleep(0.1)
    result = await call(pool, "everything", "get-roots-list", {})
    assert not result.is_error
    # The workspace's path is scrubbed to '.' in results; its file URI names the folder.
    assert "file://" in result.content and "workspace" in result.content


async def test_remote_streamable_http_server_with_headers_and_one_connection_per_run(
    pool: ToolPool, catalog: ToolCatalog, tools_cfg: dict[str, Any], tmp_path: Path
) -> None:
    echo = await call(pool, "remote", "echo", {"message": "over http"})
    assert not echo.is_error and "over http" in echo.content
    remote, clock = catalog.shared["remote"], catalog.shared["time"]
    async with open_tool_pool(tools_cfg, tmp_path, catalog=catalog) as second:
        assert not (await call(second, "time", "get_current_time", {"timezone": "UTC"})).is_error
        assert second._handles["remote"] is remote and second._handles["time"] is clock
    assert (remote.generation, clock.generation) == (1, 1), "scope=run: one connection for every task"
    assert not (await call(pool, "remote", "echo", {"message": "still connected"})).is_error


async def test_an_unreachable_remote_server_is_one_line_and_calls_are_not_rerouted(pool: ToolPool) -> None:
    reason = pool.unavailable["down"]
    assert "cannot be reached" in reason and "\n" not in reason and len(reason) < 400
    result = await call(pool, "down", "echo", {"message": "x"})
    assert result.is_error and "cannot be reached" in result.content
    assert "also offered by 'everything', 'remote'" in result.content


@needs_proc
async def test_no_process_is_left_after_a_task(catalog: ToolCatalog, tools_cfg: dict[str, Any], tmp_path: Path) -> None:
    before = descendants()
    async with open_tool_pool(tools_cfg, tmp_path, catalog=catalog) as task_pool:
        assert not (await call(task_pool, "everything", "echo", {"message": "x"})).is_error
        started = descendants() - before
    assert started, "a task-scoped server is a child process of its task's pool"
    assert alive(started) == set()
