"""State across turns: the per-task key-value store, handed by dispatch_tools to the tools that ask for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowllm.agent.loop import Agent
from flowllm.agent.results import AgentSettings
from flowllm.config.plain import plain_config
from flowllm.config.provider_schema import ProviderConfig
from flowllm.emulator import Emulator
from flowllm.engine import make_runner
from flowllm.engine.pipeline import pipeline_from_config
from flowllm.providers import build_provider
from flowllm.tools import open_tool_pool
from flowllm.tools.state import STATE_FILE, TaskState
from flowllm.verify import audit_run
from tests.experiment.helpers import run_flowllm

from .helpers import Outputs


def test_the_store_persists_per_namespace_and_applies_changes_per_key(tmp_path: Path) -> None:
    state = TaskState(tmp_path / "task" / STATE_FILE)
    state.set("tool-form", "name", "Ada")
    state.apply("tool-form", {"set": {"email": "ada@example.org", "n": 3}, "delete": ["missing"]})
    state.set("tool-cart", "items", ["pen"])
    again = TaskState(tmp_path / "task" / STATE_FILE)
    assert again.values("tool-form") == {"name": "Ada", "email": "ada@example.org", "n": 3}
    assert again.get("tool-cart", "items") == ["pen"] and again.get("tool-cart", "nope", 0) == 0
    again.delete("tool-cart", "items")
    assert "tool-cart" not in json.loads((tmp_path / "task" / STATE_FILE).read_text())
    with pytest.raises(TypeError):
        again.set("tool-form", "bad", object())  # only JSON values
    assert TaskState.for_workspace(tmp_path / "task" / "workspace", fresh=True).snapshot() == {}


def call(tool: str, **args: Any) -> str:
    return (
        f"<use_mcp_tool>\n<server_name>tool-form</server_name>\n<tool_name>{tool}</tool_name>\n"
        f"<arguments>{json.dumps(args)}</arguments>\n</use_mcp_tool>"
    )


SCRIPT = {
    "tasks": {
        "form": [
            {"text": call("set_field", field="name", value="Ada")},
            {"text": call("set_field", field="email", value="ada@example.org")},
            {"text": call("set_field", field="topic", value="engines")},
            {"text": call("submit_form")},
            {"text": "Done: ${last_tool_result} \\boxed{submitted}"},
        ]
    }
}
TOOLS = {"servers": {"tool-form": {"command": "python", "args": ["-m", "flowllm.tools.state"]}}, "call_timeout_s": 30}


@pytest.mark.parametrize("task_state", [True, False])
async def test_a_form_filled_over_several_turns(tmp_path: Path, compose_cfg: Any, task_state: bool) -> None:
    workspace = tmp_path / "tasks" / "form" / "workspace"
    workspace.mkdir(parents=True)
    pipeline = pipeline_from_config(plain_config(compose_cfg(f"tools.task_state={str(task_state).lower()}").pipeline))
    observer = Outputs()
    agent = Agent(pipeline, make_runner("graph_parallel"), AgentSettings(max_turns=6), observer=observer)
    with Emulator(SCRIPT) as emu:
        provider = build_provider(ProviderConfig(name="offline", model="m"), base_url=emu.base_url, api_key="k")
        async with open_tool_pool(TOOLS, workspace) as tools:
            result = await agent.run("form", "Fill in the contact form.", provider, tools)
        await provider.aclose()
    submitted = observer.turns("dispatch_tools")[3]["tool_results"][0]
    state_file = workspace.parent / STATE_FILE
    if task_state:
        # Each call saw what earlier turns filled in, through the store in the task folder.
        assert result.answer == "submitted" and not submitted.is_error
        assert "name=Ada; email=ada@example.org; topic=engines" in submitted.content
        saved = json.loads(state_file.read_text())
        assert saved["tool-form"] == {"name": "Ada", "email": "ada@example.org", "topic": "engines", "_submitted": True}
    else:
        # Off by default: the tool gets no state, so every call starts from an empty form.
        assert submitted.is_error and "missing name, email, topic" in submitted.content
        assert not state_file.exists()


def _form_script(name: str, email: str) -> list[dict[str, str]]:
    return [
        {"text": call("set_field", field="name", value=name)},
        {"text": call("set_field", field="email", value=email)},
        {"text": call("set_field", field="topic", value="engines")},
        {"text": call("submit_form")},
        {"text": "Done: ${last_tool_result} \\boxed{submitted}"},
    ]


def test_a_run_keeps_each_tasks_store_in_its_own_folder(tmp_path: Path) -> None:
    """Two tasks fill the form at once: each one's store is ``tasks/<id>/state.json``, its own, beside its other
    records (not in the temporary folder the workspaces live in, which both would share and the run removes)."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"task_id": t, "Question": "Fill in the contact form.", "Level": 1, "Final answer": "submitted"}
        for t in ("ada", "bob")
    ]
    (data / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = {"tasks": {"ada": _form_script("Ada", "ada@example.org"), "bob": _form_script("Bob", "bob@example.org")}}
    (data / "script.yaml").write_text(yaml.safe_dump(script))
    run_dir = tmp_path / "run"
    done = run_flowllm(
        "+experiment=gaia",
        "progress=false",
        f"dataset.path={data}",
        f"provider.emulator_script={data / 'script.yaml'}",
        f"hydra.run.dir={run_dir}",
        "experiment.max_concurrent=2",
        "tools=none",
        "+tools.servers.tool-form={command: python, args: [-m, flowllm.tools.state]}",
        "tools.task_state=true",
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((run_dir / "summary.json").read_text())["correct"] == 2
    for task, name in (("ada", "Ada"), ("bob", "Bob")):
        saved = json.loads((run_dir / "tasks" / task / STATE_FILE).read_text())
        email = f"{task}@example.org"
        assert saved == {"tool-form": {"name": name, "email": email, "topic": "engines", "_submitted": True}}
    audit = audit_run(run_dir)  # the run's files agree with each other, the stores among them
    assert audit.verified, [f.line() for f in audit.findings]
