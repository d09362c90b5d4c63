"""The tool pool against a real misbehaving MCP server over stdio, one fresh server per test: hangs, crashes
and restarts, servers that cannot start, and no process left behind however the task ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flowllm.config.schema import ToolsConfig, ToolServerConfig
from flowllm.tools import ToolPool, open_tool_pool
from tests.tools.helpers import FLAKY_SERVER, alive, descendants, flaky_config, needs_proc

pytestmark = pytest.mark.long


async def call(pool: ToolPool, name: str, arguments: dict, *, server: str | None = "flaky", timeout_s: float = 30):
    return await pool.call(server, name, arguments, call_id=f"id-{name}", timeout_s=timeout_s)


@needs_proc
async def test_structured_config_and_a_clean_exit_with_no_process_left(workspace: Path) -> None:
    cfg = ToolsConfig(
        name="dc",
        servers={"flaky": ToolServerConfig(command="python", args=[str(FLAKY_SERVER)], env={"FLAKY_KEY": "k1"})},
    )
    before = descendants()
    async with open_tool_pool(cfg, workspace) as pool:
        result = await call(pool, "where", {})
        started = descendants() - before
    assert (result.is_error, result.content.endswith("key=k1")) == (False, True)
    assert started, "the server should be a child process"
    assert alive(started) == set()

    after_close = await call(pool, "where", {})
    assert after_close.is_error and "closed" in after_close.content
    await pool.aclose()  # idempotent


async def test_the_server_timeout_caps_the_callers_timeout(workspace: Path, state_dir: Path) -> None:
    async with open_tool_pool(flaky_config(state_dir, timeout_s=0.5), workspace) as pool:
        slow = await call(pool, "sleep", {"seconds": 30}, timeout_s=300)
    assert slow.is_error and "within 0.5 s" in slow.content


async def test_a_server_that_hangs_is_restarted_after_a_timeout(workspace: Path, state_dir: Path) -> None:
    async with open_tool_pool(flaky_config(state_dir), workspace, ping_timeout_s=0.5) as pool:
        first_pid = (await call(pool, "where", {})).content.split("pid=")[1].split()[0]
        # 'block' freezes the server's event loop: the ping after the timeout fails and the pool restarts it.
        hung = await call(pool, "block", {"seconds": 30}, timeout_s=0.5)
        assert hung.is_error
        answer = await call(pool, "where", {}, timeout_s=30)
        assert not answer.is_error
        assert answer.content.split("pid=")[1].split()[0] != first_pid


async def test_a_crash_mid_call_restarts_the_server_and_retries_once(workspace: Path, state_dir: Path) -> None:
    async with open_tool_pool(flaky_config(state_dir), workspace) as pool:
        result = await call(pool, "crash_once", {"name": "a"})
        assert (result.is_error, result.content) == (False, "survived a")
        # The restarted server serves the next calls as usual.
        assert (await call(pool, "sleep", {"seconds": 0})).content == "slept 0"


async def test_a_crash_of_a_tool_with_side_effects_is_not_rerun(workspace: Path, state_dir: Path) -> None:
    async with open_tool_pool(flaky_config(state_dir), workspace) as pool:
        result = await call(pool, "write_once", {"name": "w"})
        assert result.is_error and "may or may not have acted" in result.content
        assert (state_dir / "w").read_text() == "acted\n", "the call must not have been sent twice"
        # The server was restarted for the next calls.
        assert not (await call(pool, "where", {})).is_error


async def test_retry_on_crash_in_config_reruns_a_tool_without_annotations(workspace: Path, state_dir: Path) -> None:
    async with open_tool_pool(flaky_config(state_dir, retry_on_crash=True), workspace) as pool:
        result = await call(pool, "write_once", {"name": "w"})
    assert (result.is_error, result.content) == (False, "wrote w")


async def test_a_tool_that_always_crashes_is_reported_after_one_retry(workspace: Path, state_dir: Path) -> None:
    async with open_tool_pool(flaky_config(state_dir), workspace) as pool:
        result = await call(pool, "crash", {})
        assert result.is_error
        assert "stopped while running 'crash', again after a restart" in result.content
        # The next call gets a fresh server.
        assert (await call(pool, "sleep", {"seconds": 0})).content == "slept 0"


async def test_parallel_calls_share_one_restart(workspace: Path, state_dir: Path) -> None:
    async with open_tool_pool(flaky_config(state_dir), workspace) as pool:
        results = await asyncio.gather(
            call(pool, "crash_once", {"name": "b"}),
            call(pool, "sleep", {"seconds": 0.3, "label": "x"}),
            call(pool, "sleep", {"seconds": 0.3, "label": "y"}),
        )
    contents = sorted(r.content for r in results)
    assert contents == ["slept 0.3 x", "slept 0.3 y", "survived b"]
    assert not any(r.is_error for r in results)


async def test_servers_missing_a_key_or_failing_to_start_are_left_out_clearly(
    workspace: Path, state_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOWLLM_TEST_MISSING_KEY", raising=False)
    cfg = flaky_config(state_dir)
    cfg["servers"]["search"] = {"command": "does-not-exist", "requires_env": ["FLOWLLM_TEST_MISSING_KEY"]}
    cfg["servers"]["broken"] = {
        "command": "python",
        "args": ["-c", "import sys; sys.stderr.write('cannot load the index'); sys.exit(2)"],
    }
    cfg["servers"]["absent"] = {"command": "flowllm-no-such-command"}
    with caplog.at_level("WARNING", logger="flowllm.tools.client.pool"):
        async with open_tool_pool(cfg, workspace) as pool:
            assert set(pool.unavailable) == {"search", "broken", "absent"}
            assert {t["server"] for t in await pool.list_tools()} == {"flaky"}
            search = await pool.call("search", "web_search", {"q": "x"}, call_id="s", timeout_s=5)
            broken = await pool.call("broken", "anything", {}, call_id="b", timeout_s=5)
            absent = await pool.call("absent", "anything", {}, call_id="a", timeout_s=5)
            ok = await call(pool, "sleep", {"seconds": 0})
    assert search.is_error and "FLOWLLM_TEST_MISSING_KEY not set" in search.content
    assert "FLOWLLM_TEST_MISSING_KEY" in caplog.text  # the warning at open time
    assert broken.is_error and "failed to start" in broken.content
    assert "cannot load the index" in broken.content  # the tail of the server's stderr explains why
    assert absent.is_error and "failed to start" in absent.content and "command not found" in absent.content
    assert not ok.is_error  # the run goes on with the servers that work


async def test_a_server_that_never_answers_the_handshake_times_out(workspace: Path, state_dir: Path) -> None:
    # Reads stdin but never answers: the handshake times out (it exits once the pool closes its stdin).
    cfg = {"servers": {"mute": {"command": "python", "args": ["-c", "import sys; sys.stdin.read()"]}}}
    async with open_tool_pool(cfg, workspace, start_timeout_s=0.5) as pool:
        assert "did not finish starting within 0.5 s" in pool.unavailable["mute"]
        assert await pool.list_tools() == []


@needs_proc
async def test_an_error_in_the_task_still_stops_every_process(workspace: Path, state_dir: Path) -> None:
    before = descendants()
    started: set[int] = set()
    with pytest.raises(RuntimeError, match="task failed"):
        async with open_tool_pool(flaky_config(state_dir), workspace) as pool:
            await call(pool, "sleep", {"seconds": 0})
            started = descendants() - before
            raise RuntimeError("task failed")
    assert started and alive(started) == set()


@needs_proc
async def test_cancelling_the_task_propagates_and_stops_every_process(workspace: Path, state_dir: Path) -> None:
    before = descendants()
    seen: dict[str, set[int]] = {}
    in_call = asyncio.Event()

    async def task() -> None:
        async with open_tool_pool(flaky_config(state_dir), workspace) as pool:
            seen["pids"] = descendants() - before
            in_call.set()
            await call(pool, "sleep", {"seconds": 60})

    running = asyncio.create_task(task())
    await in_call.wait()
    await asyncio.sleep(0.2)  # let the call reach the server
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert seen["pids"] and alive(seen["pids"]) == set()


async def test_infrastructure_failures_carry_their_cause_and_the_models_bad_calls_do_not(
    workspace: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowllm.core.types import InfraCause, ToolResult

    monkeypatch.delenv("FLOWLLM_TEST_MISSING_KEY", raising=False)
    cfg = flaky_config(state_dir)
    cfg["servers"]["search"] = {"command": "does-not-exist", "requires_env": ["FLOWLLM_TEST_MISSING_KEY"]}
    async with open_tool_pool(cfg, workspace) as pool:
        crashed = await call(pool, "crash", {})
        maybe = await call(pool, "write_once", {"name": "w"})
        disabled = await pool.call("search", "web_search", {"q": "x"}, call_id="s", timeout_s=5)
        unknown = await call(pool, "no_such_tool", {})
        bad_arguments = await call(pool, "sleep", {"seconds": "long"})
        ok = await call(pool, "sleep", {"seconds": 0})
    assert (crashed.infra, maybe.infra, disabled.infra) == (
        InfraCause.SERVER_LOST,
        InfraCause.SERVER_LOST,
        InfraCause.UNAVAILABLE,
    )
    assert unknown.is_error and bad_arguments.is_error and unknown.infra is bad_arguments.infra is None
    assert ok.infra is None
    # Recorded with the result and read back (a replay, a resume), absent when there is none.
    assert ToolResult.from_dict(crashed.to_dict()).infra is InfraCause.SERVER_LOST
    assert "infra" not in ok.to_dict()
