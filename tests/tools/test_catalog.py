"""A run lists tools once; each task's pool then starts a server only when one of its tools is called."""

from __future__ import annotations

from pathlib import Path

from flowllm.tools import discover_tools, open_tool_pool

from .helpers import alive, builtin_config, descendants, needs_proc


@needs_proc
async def test_lazy_pool_starts_only_the_servers_it_uses(tmp_path: Path, workspace: Path) -> None:
    cfg = builtin_config()
    scratch = tmp_path / "discovery"
    scratch.mkdir()
    # Only the processes this test starts count: an earlier test's helper may still be winding down.
    before = descendants()
    catalog = await discover_tools(cfg, scratch)
    assert set(catalog.tools) == {"tool-python", "tool-files", "tool-math"}
    assert not alive(descendants() - before)  # discovery stopped what it started

    async with open_tool_pool(cfg, workspace, catalog=catalog) as pool:
        listed = {(t["server"], t["name"]) for t in await pool.list_tools()}
        assert ("tool-math", "calculate") in listed and ("tool-python", "run_python") in listed
        assert not alive(descendants() - before)  # nothing started yet

        result = await pool.call("tool-math", "calculate", {"expression": "6*7"}, call_id="c1", timeout_s=30)
        assert result.content.strip() == "42" and not result.is_error
        assert len(alive(descendants() - before)) >= 1
        started = {name for name, h in pool._handles.items() if h.conn is not None}
        assert started == {"tool-math"}

        # Routing and schema checks work from the catalog alone, before any server of theirs is up.
        bad = await pool.call(None, "read_file", {}, call_id="c2", timeout_s=30)
        assert bad.is_error and "path" in bad.content
    assert not alive(descendants() - before)


async def test_a_server_that_cannot_start_is_reported_on_its_first_call(tmp_path: Path, workspace: Path) -> None:
    cfg = builtin_config()
    scratch = tmp_path / "discovery"
    scratch.mkdir()
    catalog = await discover_tools(cfg, scratch)
    cfg["servers"]["tool-math"]["args"] = ["-c", "raise SystemExit(3)"]
    async with open_tool_pool(cfg, workspace, catalog=catalog, start_timeout_s=10) as pool:
        result = await pool.call("tool-math", "calculate", {"expression": "1"}, call_id="c1", timeout_s=30)
        assert result.is_error and "failed to start" in result.content
        again = await pool.call("tool-math", "calculate", {"expression": "1"}, call_id="c2", timeout_s=30)
        assert again.is_error and "failed to start" in again.content
