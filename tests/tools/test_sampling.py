"""Sampling requests from tool servers (``tools.sampling``): declined by default; with ``answer``, a task-scoped
server's request goes to the run's provider (the real emulator here), recorded as agent ``sampling`` under the
calling turn and counted toward the task; a run-scoped server keeps declining; a failed model call reaches the
server as an MCP error and the task goes on. Real MCP servers throughout: our own stdio test server and, when
installed, npm's server-everything."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowllm.core.interfaces import SamplingReply, SamplingRequest
from flowllm.errors import ToolConfigError
from flowllm.resources import bundled
from flowllm.tools import ToolPool, load_settings, open_tool_catalog, open_tool_pool
from tests.appfork import run_app
from tests.tools.helpers import ROOT, everything_or_skip

SERVER = Path(__file__).parent / "servers" / "sampling_server.py"
BOAT = bundled("data/web_sample") / "boat.png"  # its SHA-256 starts d46f37944737f9d5
OK_TASK = "sampling-ok"
FAILING_TASK = "sampling-fails"
SYSTEM = "You answer questions for a test server."


def server_cfg(**extra: Any) -> dict[str, Any]:
    entry = {"command": "python", "args": [str(SERVER)], "timeout_s": 30}
    return {"name": "sampling", "servers": {"sampler": entry}, **extra}


async def ask(pool: ToolPool, server: str = "sampler", **arguments: Any) -> str:
    result = await pool.call(server, "ask", {"question": "What is 2+2?", **arguments}, call_id="c1", timeout_s=30)
    assert not result.is_error, result.content
    return result.content


# -- the pool, on its own


async def test_sampling_is_declined_by_default_with_a_message_the_server_can_pass_on(workspace: Path) -> None:
    async with open_tool_pool(server_cfg(), workspace) as pool:
        assert pool.sampler is None
        assert await ask(pool) == (
            "sampling failed: flowllm does not answer sampling requests from tool servers (tools.sampling=decline): "
            "do the work without a model"
        )


def test_a_bad_setting_is_one_line_naming_the_values(tmp_path: Path) -> None:
    with pytest.raises(ToolConfigError, match=r"^tools\.sampling must be one of decline, answer, not 'always'$"):
        load_settings(server_cfg(sampling="always"))
    proc = run_app(
        ["tools.sampling=always", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, timeout=300, env=dict(os.environ)
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "flowllm: error: tools.sampling: Invalid value 'always', expected one of [decline, answer]"
    )


async def test_answer_hands_canonical_blocks_to_the_bound_handler_and_reports_its_failures(workspace: Path) -> None:
    seen: list[SamplingRequest] = []

    async def answer(request: SamplingRequest) -> SamplingReply:
        seen.append(request)
        return SamplingReply(text="four", model="some-model", stop_reason="max_tokens")

    async def fail(request: SamplingRequest) -> SamplingReply:
        raise RuntimeError("the provider is down")

    (workspace / "boat.png").write_bytes(BOAT.read_bytes())
    async with open_tool_pool(server_cfg(sampling="answer"), workspace) as pool:
        assert pool.sampler is not None
        # Before the task's agent binds a handler (and after it unbinds it), requests are declined.
        assert "no model is attached to this task's tools" in await ask(pool)
        pool.sampler.bind(answer)
        reply = await ask(pool, image_path="boat.png", max_tokens=7)
        assert reply == "reply=four | role=assistant | model=some-model | stop=maxTokens"
        [request] = seen
        assert request.server == "sampler" and request.system_prompt == SYSTEM and request.max_tokens == 7
        [message] = request.messages
        assert message["role"] == "user"
        assert [b["type"] for b in message["content"]] == ["image", "text"]
        assert message["content"][0]["media_type"] == "image/png"
        assert message["content"][1]["text"] == "What is 2+2?"
        # A failing model call is an MCP error for the server; the pool and the server go on.
        pool.sampler.bind(fail)
        assert await ask(pool) == "sampling failed: the model call failed: RuntimeError: the provider is down"
        pool.sampler.bind(answer)
        assert (await ask(pool)).startswith("reply=four")


async def test_a_run_scoped_server_declines_since_no_task_can_be_charged(workspace: Path) -> None:
    cfg = server_cfg(sampling="answer")
    cfg["servers"]["sampler"]["scope"] = "run"

    async def never(request: SamplingRequest) -> SamplingReply:
        raise AssertionError("a run-scoped server's request reached the task's handler")

    async with open_tool_catalog(cfg) as catalog, open_tool_pool(cfg, workspace, catalog=catalog) as pool:
        assert pool.sampler is not None
        pool.sampler.bind(never)
        assert "cannot be attributed to a task" in await ask(pool)


# -- a run through the command line, against the emulator


def write_run_inputs(folder: Path) -> tuple[Path, Path]:
    """A two-task dataset (the boat photo attached to both) and the emulator script that drives it."""
    data = folder / "data"
    data.mkdir()
    shutil.copy(BOAT, data / "boat.png")
    rows = [
        {"task_id": OK_TASK, "Question": "What is in boat.png?", "Level": 1, "Final answer": "a boat"},
        {"task_id": FAILING_TASK, "Question": "What is in boat.png?", "Level": 1, "Final answer": "a boat"},
    ]
    with (data / "metadata.jsonl").open("w") as fh:
        for row in rows:
            fh.write(json.dumps({**row, "file_name": "boat.png"}) + "\n")

    def call(server: str, arguments: dict[str, Any]) -> dict[str, str]:
        return {
            "text": (
                f"<use_mcp_tool>\n<server_name>{server}</server_name>\n<tool_name>ask</tool_name>\n"
                f"<arguments>\n{json.dumps(arguments)}\n</arguments>\n</use_mcp_tool>"
            )
        }

    look = {"question": "What does the photo show?", "image_path": "boat.png"}
    script = {
        "default": [{"text": "No script for this. \\boxed{none}"}],
        "images": {"d46f37944737f9d5": "a boat"},
        "tasks": {
            OK_TASK: [
                call("sampler", look),  # task-scoped: answered by the emulator's sampling entry
                call("shared", {"question": "And now?"}),  # run-scoped: declined
                {"text": "\\boxed{a boat}"},
            ],
            f"{OK_TASK}/sampling": [{"text": "The photo shows ${image}."}],
            FAILING_TASK: [call("sampler", look), {"text": "\\boxed{a boat}"}],
        },
        "faults": {"rules": [{"fault": "status", "status": 400, "agents": ["sampling"], "tasks": [FAILING_TASK]}]},
    }
    (folder / "script.yaml").write_text(yaml.safe_dump(script, sort_keys=False))
    return data, folder / "script.yaml"


def run_flowllm(data: Path, run_dir: Path, *overrides: str) -> None:
    proc = run_app(
        [
            "progress=false",
            f"dataset.path={data}",
            "tools=none",
            "tools.sampling=answer",
            f"+tools.servers.sampler={{command: python, args: ['{SERVER}']}}",
            f"+tools.servers.shared={{command: python, args: ['{SERVER}'], scope: run}}",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        cwd=ROOT,
        timeout=600,  # a hang guard only
        env={k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def sampling_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sampling-run")
    data, script = write_run_inputs(folder)
    run_flowllm(data, folder / "run", f"provider.emulator_script={script}")
    return folder / "run"


def tool_results(run_dir: Path, task: str, turn: int) -> list[dict[str, Any]]:
    [dispatch] = (run_dir / "tasks" / task / f"turn_{turn:03d}").glob("*_dispatch_tools")
    return list(json.loads((dispatch / "output.json").read_text())["tool_results"])


def ledger(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "usage.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("type") == "attempt"]


def test_answer_runs_the_request_through_the_runs_provider_recorded_and_counted(sampling_run: Path) -> None:
    [result] = tool_results(sampling_run, OK_TASK, 1)
    # The emulator saw the image the server sent (${image}) and its reply came back to the server, then to the model.
    assert result["content"] == "reply=The photo shows a boat. | role=assistant | model=flowllm-emulator | stop=endTurn"
    # The conversation is recorded under the calling turn, as a one-turn sub-agent with the server's system prompt.
    [call] = (sampling_run / "tasks" / OK_TASK / "turn_001" / "subagents").glob("sampling-1/turn_001/*_call_model")
    sent = json.loads((call / "input.json").read_text())
    assert [b["type"] for b in sent["prompt_messages"][0]["content"]] == ["image", "text"]
    assert sent["prompt_system"][0]["text"] == SYSTEM
    # usage.jsonl has it as agent "sampling", and the task's usage includes its tokens.
    entries = [e for e in ledger(sampling_run) if e.get("task_id") == OK_TASK]
    sampling = [e for e in entries if e["agent"] == "sampling"]
    assert len(sampling) == 1 and sampling[0]["outcome"] == "ok" and sampling[0]["usage"]["input_tokens"] > 0
    task = json.loads((sampling_run / "tasks" / OK_TASK / "result.json").read_text())
    assert task["usage"]["input_tokens"] == sum(e["usage"]["input_tokens"] for e in entries if e["outcome"] == "ok")
    assert task["usage"]["output_tokens"] == sum(e["usage"]["output_tokens"] for e in entries if e["outcome"] == "ok")
    assert task["correct"] is True


def test_a_run_scoped_server_keeps_declining(sampling_run: Path) -> None:
    [result] = tool_results(sampling_run, OK_TASK, 2)
    assert result["server"] == "shared"
    assert result["content"].startswith("sampling failed: flowllm does not answer sampling requests from a run-scoped")
    assert "cannot be attributed to a task" in result["content"]
    assert not (sampling_run / "tasks" / OK_TASK / "turn_002" / "subagents").exists()


def test_a_failed_model_call_is_an_error_for_the_server_and_the_task_goes_on(sampling_run: Path) -> None:
    [result] = tool_results(sampling_run, FAILING_TASK, 1)
    assert result["content"].startswith("sampling failed: the model call failed:"), result["content"]
    task = json.loads((sampling_run / "tasks" / FAILING_TASK / "result.json").read_text())
    assert task["status"] == "completed" and task["correct"] is True, task


def test_a_replay_serves_the_sampling_call_again(sampling_run: Path) -> None:
    # (Only the task whose sampling call succeeded: a failed call leaves no reply to serve.)
    again = sampling_run.parent / "replay"
    data = sampling_run.parent / "data"
    run_flowllm(data, again, "provider=replay", f"provider.run_dir={sampling_run}", f"dataset.task_ids=[{OK_TASK}]")
    summary = json.loads((again / "summary.json").read_text())
    assert summary["replay"]["exact"] == 1 and summary["correct"] == 1, summary
    [result] = tool_results(again, OK_TASK, 1)
    assert result["content"].startswith("reply=The photo shows a boat.")


# -- npm's reference server


async def test_server_everythings_sampling_tool_gets_an_answer(workspace: Path) -> None:
    entry = everything_or_skip()
    cfg = {"servers": {"everything": {"command": "node", "args": [str(entry), "stdio"]}}, "sampling": "answer"}
    seen: list[SamplingRequest] = []

    async def answer(request: SamplingRequest) -> SamplingReply:
        seen.append(request)
        return SamplingReply(text="Hello from the model", model="flowllm-emulator", stop_reason="end_turn")

    async with open_tool_pool(cfg, workspace) as pool:
        assert pool.sampler is not None
        pool.sampler.bind(answer)
        names = {t["name"] for t in await pool.list_tools()}
        assert "trigger-sampling-request" in names, sorted(names)
        result = await pool.call(
            "everything", "trigger-sampling-request", {"prompt": "hi", "maxTokens": 20}, call_id="c1", timeout_s=60
        )
    assert not result.is_error, result.content
    assert '"text": "Hello from the model"' in result.content and '"model": "flowllm-emulator"' in result.content
    [request] = seen
    assert request.system_prompt == "You are a helpful test server." and request.max_tokens == 20
