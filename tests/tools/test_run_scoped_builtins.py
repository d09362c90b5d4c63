"""The built-in servers run once per run and serve every task's folder, each call in the folder it names.

One tool-python and one tool-files process (``scope: run`` in ``conf/tools/default.yaml``) serve two tasks at
once through real stdio MCP sessions: each task sees its own files and only those, what one task's code writes
the other cannot see, and no task starts a server of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from flowllm.tools import ToolCatalog, ToolPool, open_tool_catalog, open_tool_pool
from flowllm.tools.client.settings import Scope, load_settings
from tests.tools.test_builtin_servers import compose_tools

on_shared_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def catalog() -> AsyncIterator[ToolCatalog]:
    async with open_tool_catalog(compose_tools("default")) as opened:
        yield opened


def task_folder(root: Path, name: str, secret: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / f"{name}.txt").write_text(secret)
    return folder


async def call(pool: ToolPool, server: str, tool: str, **arguments: Any) -> str:
    result = await pool.call(server, tool, arguments, call_id=tool, timeout_s=60)
    assert not result.is_error, result.content
    return result.content


def test_the_default_builtins_are_run_scoped() -> None:
    settings = load_settings(compose_tools("web"))
    scopes = {spec.name: spec.scope for spec in settings.servers}
    assert scopes == {name: Scope.RUN for name in scopes}, scopes
    assert {"tool-python", "tool-files", "tool-math", "tool-audio", "tool-browse", "tool-search"} <= set(scopes)


@on_shared_loop
async def test_one_server_process_serves_two_tasks_each_in_its_own_folder(catalog: ToolCatalog, tmp_path: Path) -> None:
    assert {"tool-python", "tool-files"} <= set(catalog.shared)
    first = task_folder(tmp_path, "first", "alpha")
    second = task_folder(tmp_path, "second", "beta")
    cfg = compose_tools("default")
    async with open_tool_pool(cfg, first, catalog=catalog) as a, open_tool_pool(cfg, second, catalog=catalog) as b:
        program = "import os\nprint(sorted(os.listdir('.')), open(sorted(os.listdir('.'))[0]).read())"

        async def both(pool: ToolPool, name: str, secret: str) -> None:
            for _ in range(3):  # interleaved with the other task's calls on the same two processes
                listing, read, ran = await asyncio.gather(
                    call(pool, "tool-files", "list_files"),
                    call(pool, "tool-files", "read_file", path=f"{name}.txt"),
                    call(pool, "tool-python", "run_python", code=program),
                )
                assert listing.splitlines() == [f"{name}.txt  {len(secret)} bytes"]
                assert read == secret
                assert ran.strip() == f"['{name}.txt'] {secret}"

        await asyncio.gather(both(a, "first", "alpha"), both(b, "second", "beta"))

        # What one task's code writes lands in its own folder; the other task's tools cannot reach it.
        await call(a, "tool-python", "run_python", code="open('made.txt', 'w').write('from first')")
        assert (first / "made.txt").read_text() == "from first"
        refused = await b.call("tool-files", "read_file", {"path": "../first/made.txt"}, call_id="x", timeout_s=60)
        assert refused.is_error and "outside the task folder" in refused.content
        # No task started a server of its own: start-up was paid once, by the catalog.
        assert a.startup_seconds == 0 and b.startup_seconds == 0


@on_shared_loop
async def test_results_show_the_folder_as_dot_for_every_task(catalog: ToolCatalog, tmp_path: Path) -> None:
    folder = task_folder(tmp_path, "task", "x")
    async with open_tool_pool(compose_tools("default"), folder, catalog=catalog) as pool:
        text = await call(pool, "tool-python", "run_python", code="import os\nprint(os.getcwd())")
    assert text.strip() == "."


@on_shared_loop
async def test_a_task_folder_is_made_by_the_first_call_that_works_in_it(catalog: ToolCatalog, tmp_path: Path) -> None:
    """The runner names a task's folder without making it: a calculator call leaves none behind (no empty
    ``workspace/`` kept), a file tool's call makes it first, then works in it."""
    folder = tmp_path / "root" / "task"
    async with open_tool_pool(compose_tools("default"), folder, catalog=catalog) as pool:
        assert await call(pool, "tool-math", "calculate", expression="2**3 + 1") == "9"
        assert not folder.exists()
        assert await call(pool, "tool-files", "list_files") == "(the task folder is empty)"
        assert folder.is_dir()
        await call(pool, "tool-python", "run_python", code="open('made.txt', 'w').write('here')")
    assert (folder / "made.txt").read_text() == "here"


def test_a_server_started_without_a_folder_refuses_calls_that_name_none(tmp_path: Path) -> None:
    """Started by hand (or by another client) with neither --workspace nor $FLOWLLM_WORKSPACE, a call that names
    no folder is refused with what to do: never the server's own working directory."""
    (tmp_path / "project-file.txt").write_text("not for the model")
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import asyncio, json, sys\n"
        "from mcp import ClientSession, StdioServerParameters\n"
        "from mcp.client.stdio import stdio_client\n"
        "async def main():\n"
        "    params = StdioServerParameters(command=sys.executable, args=['-m', 'flowllm.tools.files'],\n"
        "                                   env={'PATH': '/usr/bin:/bin'}, cwd=sys.argv[1])\n"
        "    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:\n"
        "        await s.initialize()\n"
        "        res = await s.call_tool('list_files', {})\n"
        "        print(json.dumps({'error': res.is_error, 'text': res.content[0].text}))\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("FLOWLLM_WORKSPACE", None)
    done = subprocess.run(
        [sys.executable, str(driver), str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["error"] is True
    assert "started without a task folder" in answer["text"] and "--workspace" in answer["text"]
    assert "project-file" not in answer["text"]


@on_shared_loop
async def test_a_task_scoped_server_starts_on_the_first_call_and_its_start_up_is_counted(tmp_path: Path) -> None:
    """``scope: task`` still gives a task a process of its own (a third-party server that keeps task state); its
    start-up is the task's own step (``timing.json`` → ``tools_start_s``), apart from the call."""
    cfg = compose_tools("default")
    cfg["servers"]["tool-files"]["scope"] = "task"
    folder = task_folder(tmp_path, "own", "mine")
    async with open_tool_catalog(cfg) as own_catalog, open_tool_pool(cfg, folder, catalog=own_catalog) as pool:
        assert "tool-files" not in own_catalog.shared
        assert pool.startup_seconds == 0  # nothing started before the first call
        assert await call(pool, "tool-files", "read_file", path="own.txt") == "mine"
        assert pool.startup_seconds > 0


@on_shared_loop
async def test_a_task_scoped_server_makes_its_task_folder_before_it_starts(tmp_path: Path) -> None:
    """A server of the task's own is started in the folder (its working directory, ``$FLOWLLM_WORKSPACE``), so
    the folder the runner named but did not make is made before the process starts."""
    cfg = compose_tools("default")
    cfg["servers"]["tool-files"]["scope"] = "task"
    folder = tmp_path / "root" / "own"
    async with open_tool_catalog(cfg) as own_catalog, open_tool_pool(cfg, folder, catalog=own_catalog) as pool:
        assert not folder.exists()
        assert await call(pool, "tool-files", "list_files") == "(the task folder is empty)"
        assert folder.is_dir() and pool.startup_seconds > 0
