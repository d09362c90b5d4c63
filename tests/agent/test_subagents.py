"""Sub-agents end to end offline: delegated through a tool call, recorded under the calling turn, billed to the task."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir

from flowllm.app import run
from flowllm.config.schema import register_configs
from flowllm.engine.recorder import read_json
from flowllm.inspect import open_run
from flowllm.resources import CONFIG_DIR

DELEGATE = """I'll hand the computation to the analyst.
<use_mcp_tool>
<server_name>agent-analyst</server_name>
<tool_name>execute_subtask</tool_name>
<arguments>{"subtask": "Compute the sum of the squares of 1 to 10 with Python and reply with the number."}</arguments>
</use_mcp_tool>"""

PYTHON = """<use_mcp_tool>
<server_name>tool-python</server_name>
<tool_name>run_python</tool_name>
<arguments>{"code": "print(sum(i * i for i in range(1, 11)))"}</arguments>
</use_mcp_tool>"""

MATH = """<use_mcp_tool>
<server_name>tool-math</server_name>
<tool_name>calculate</tool_name>
<arguments>{"expression": "1+1"}</arguments>
</use_mcp_tool>"""

SCRIPT = {
    "tasks": {
        "delegate": [
            {"text": DELEGATE},
            {"text": "The analyst says ${last_tool_result}. \\boxed{${last_tool_result}}"},
        ],
        # The sub-agent first tries a server it was not given, then uses Python, then answers.
        "delegate/analyst": [{"text": MATH}, {"text": PYTHON}, {"text": "${last_tool_result}"}],
    }
}


def test_a_subagent_solves_a_delegated_subtask(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    row = {"task_id": "delegate", "Question": "Sum of squares 1..10?", "Level": 1, "Final answer": "385"}
    (data / "metadata.jsonl").write_text(json.dumps(row) + "\n")
    (data / "script.yaml").write_text(yaml.safe_dump(SCRIPT))
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "+subagents=analyst",
                f"dataset.path={data}",
                f"provider.emulator_script={data / 'script.yaml'}",
                "progress=false",
            ],
        )
    summary = run(cfg, tmp_path / "run")
    assert summary["correct"] == 1, summary

    task = tmp_path / "run" / "tasks" / "delegate"
    result = read_json(task / "result.json")
    assert result["answer"] == "385" and result["turns"] == 2

    sub = task / "turn_001" / "subagents" / "analyst-call_0"
    assert sorted(p.name for p in sub.iterdir()) == ["turn_001", "turn_002", "turn_003"]
    # The sub-agent sees only its servers: tool-math was refused, tool-python ran.
    first = read_json(sub / "turn_001" / "07_dispatch_tools" / "output.json")["tool_results"][0]
    assert first["is_error"] and "not available to this agent" in first["content"]
    second = read_json(sub / "turn_002" / "07_dispatch_tools" / "output.json")["tool_results"][0]
    assert second["content"].strip() == "385"
    # Its prompt offers its own tools and not the main agent's delegate tool.
    system = read_json(sub / "turn_001" / "03_call_model" / "input.json")["prompt_system"][0]["text"]
    assert "run_python" in system and "execute_subtask" not in system

    # Every call of the task, the sub-agent's included, counts toward the task's usage.
    def output_tokens(folder: Path) -> int:
        return sum(
            read_json(p)["response"]["usage"]["output_tokens"] for p in folder.glob("turn_*/04_normalize/output.json")
        )

    assert result["usage"]["output_tokens"] == output_tokens(task) + output_tokens(sub)
    assert output_tokens(sub) > 0

    # inspect finds the sub-agent's conversation under the turn that called it.
    record = open_run(tmp_path / "run").task("delegate")
    assert list(record.agents) == ["turn_001/subagents/analyst-call_0"]
    assert len(record.agents["turn_001/subagents/analyst-call_0"]) == 3
