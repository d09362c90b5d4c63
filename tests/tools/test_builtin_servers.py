"""The three built-in servers through real stdio MCP sessions, configured by ``conf/tools/default.yaml``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hydra import compose, initialize_config_dir

from flowllm.config.plain import plain_config
from flowllm.config.schema import register_configs
from flowllm.tools import ToolPool, format_tool_result, open_tool_pool
from tests.tools.helpers import alive, builtin_config, descendants, needs_proc

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONF_DIR = Path(__file__).resolve().parents[2] / "flowllm" / "conf"


def compose_tools(name: str) -> dict[str, Any]:
    """The tools section of a composed config, as the loader hands it on (plain data)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        tools = plain_config(compose(overrides=[f"+tools={name}"]).tools)
    assert isinstance(tools, dict)
    return tools


def make_attachments(folder: Path) -> None:
    (folder / "sales.csv").write_text("region,amount\nnorth,120\nsouth,80\n")
    (folder / "docs").mkdir()
    (folder / "docs" / "readme.txt").write_text("Quarterly figures.\n")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ToolPool]:
    workspace = tmp_path_factory.mktemp("builtin") / "task"
    workspace.mkdir()
    make_attachments(workspace)
    async with open_tool_pool(compose_tools("default"), workspace) as opened:
        yield opened


async def run(pool: ToolPool, server: str, tool: str, **arguments: Any):
    return await pool.call(server, tool, arguments, call_id=tool, timeout_s=60)


async def test_default_config_offers_the_four_builtin_tools(pool: ToolPool) -> None:
    tools = [(t["server"], t["name"]) for t in await pool.list_tools()]
    assert tools == [
        ("tool-python", "run_python"),
        ("tool-files", "read_file"),
        ("tool-files", "list_files"),
        ("tool-math", "calculate"),
    ]
    assert pool.unavailable == {}


async def test_python_works_on_the_task_files_and_files_sees_its_output(pool: ToolPool) -> None:
    code = (
        "import csv\n"
        "rows = list(csv.DictReader(open('sales.csv')))\n"
        "total = sum(int(r['amount']) for r in rows)\n"
        "open('total.txt', 'w').write(str(total))\n"
        "print('total', total)\n"
    )
    ran = await run(pool, "tool-python", "run_python", code=code)
    assert (ran.is_error, ran.content) == (False, "total 200")
    read = await run(pool, "tool-files", "read_file", path="total.txt")
    assert (read.is_error, read.content) == (False, "200")
    listing = await run(pool, "tool-files", "list_files")
    assert "total.txt  3 bytes" in listing.content.splitlines()
    assert "docs/readme.txt  19 bytes" in listing.content.splitlines()


async def test_failing_code_is_an_error_result_with_the_traceback(pool: ToolPool) -> None:
    result = await run(pool, "tool-python", "run_python", code="import json\njson.loads('{bad')")
    assert result.is_error
    assert "json.decoder.JSONDecodeError" in result.content and result.content.endswith("[exit status 1]")
    wrapped = format_tool_result(result)
    assert wrapped.startswith('<tool_result server="tool-python" tool="run_python" is_error="true">')


async def test_files_refuses_paths_out_of_the_task_folder(pool: ToolPool) -> None:
    escaped = await run(pool, "tool-files", "read_file", path="../../etc/passwd")
    assert escaped.is_error and "outside the task folder" in escaped.content
    assert "root:" not in escaped.content
    csv_text = await run(pool, "tool-files", "read_file", path="sales.csv")
    assert csv_text.content.startswith("[CSV: 3 rows")


async def test_math_calculates_and_explains_refusals(pool: ToolPool) -> None:
    ok = await run(pool, "tool-math", "calculate", expression="(120 + 80) / 2")
    assert (ok.is_error, ok.content) == (False, "100.0")
    refused = await run(pool, "tool-math", "calculate", expression="__import__('os')")
    assert refused.is_error and "unknown function" in refused.content


async def test_results_do_not_depend_on_the_task_folder(pool: ToolPool, tmp_path: Path) -> None:
    """Two runs in different folders must compare file by file: no absolute path in any result."""
    other = tmp_path / "elsewhere" / "task"
    other.mkdir(parents=True)
    make_attachments(other)
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("tool-python", "run_python", {"code": "import os\nprint(os.getcwd(), os.path.abspath('docs'))"}),
        ("tool-python", "run_python", {"code": "import os\nopen(os.path.abspath('nope.csv'))"}),
        ("tool-files", "read_file", {"path": "docs/readme.txt"}),
        ("tool-files", "list_files", {"path": "docs"}),
        ("tool-files", "read_file", {"path": "docs/missing.txt"}),
    ]
    cfg = builtin_config()
    del cfg["servers"]["tool-math"]  # not involved: one server less to start
    async with open_tool_pool(cfg, other) as second:
        here = [(await run(pool, s, t, **a)).to_dict() for s, t, a in calls]
        there = [(await run(second, s, t, **a)).to_dict() for s, t, a in calls]
    assert here == there
    assert here[0]["content"] == ". ./docs"
    assert "No such file or directory: './nope.csv'" in here[1]["content"]


@needs_proc
async def test_a_timed_out_script_and_its_children_do_not_outlive_the_pool(tmp_path: Path) -> None:
    workspace = tmp_path / "task"
    workspace.mkdir()
    before = descendants()
    cfg = {"servers": {"tool-python": {"command": "python", "args": ["-m", "flowllm.tools.python"]}}}
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '120'])\ntime.sleep(99)"
    async with open_tool_pool(cfg, workspace) as pool:
        result = await pool.call("tool-python", "run_python", {"code": code}, call_id="x", timeout_s=1.5)
        assert result.is_error and "did not finish within 1.5 s" in result.content
        running = descendants() - before
    await asyncio.sleep(0)  # nothing to wait for: leaving the context already stopped everything
    assert alive(running) == set()
