"""The contamination guard and audit end to end: one offline run of three tasks against the web fixture server.

``leak-01`` searches (the fixture's copy of the GAIA dataset page is withheld from the results), asks for the
dataset page (refused) and then reads a forum thread that quotes the answer: the guard records two blocks and the
audit flags the task. ``clean-02`` answers right and ``wrong-03`` wrong, without tools: accuracy is 2/3 over all
tasks and 1/2 without the flagged one. A run made before the audit (tests/verify/old_runs.py) is audited too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flowllm.emulator.web import LEAK_QUESTION, LEAKED_ANSWER
from flowllm.export.contamination import Audit, audit_trace
from flowllm.export.inspect_log import build_eval_log
from flowllm.export.source import open_source
from flowllm.export.trace import Conversation, TaskTrace, ToolCall, Turn, read_run_traces
from flowllm.inspect.cli import main as inspect_main
from flowllm.inspect.report import build_report_data
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.verify.cli import main as verify_main
from tests.experiment.helpers import run_flowllm

DATASET_PAGE = "http://huggingface.co.web.test/datasets/gaia-benchmark/GAIA"
FORUM_PAGE = "http://forum.web.test/t/orrin-vale-chandelier"
ROWS = [
    {"task_id": "leak-01", "Question": LEAK_QUESTION, "Level": 1, "Final answer": LEAKED_ANSWER, "file_name": ""},
    {"task_id": "clean-02", "Question": "What is three times four?", "Level": 1, "Final answer": "12", "file_name": ""},
    {"task_id": "wrong-03", "Question": "What is two times four?", "Level": 1, "Final answer": "8", "file_name": ""},
]


def _call(name: str, **arguments: str) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "input": arguments}]}


SCRIPT = {
    "tasks": {
        "leak-01": [
            _call("tool-search-web_search", query="Orrin Vale chandelier glassblower"),
            _call("tool-browse-read_url", url=DATASET_PAGE),
            _call("tool-browse-read_url", url=FORUM_PAGE),
            {"text": f"The thread names her. \\boxed{{{LEAKED_ANSWER}}}"},
        ],
        "clean-02": [{"text": "\\boxed{12}"}],
        "wrong-03": [{"text": "\\boxed{7}"}],
    }
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    base = tmp_path_factory.mktemp("contamination")
    data = base / "data"
    data.mkdir()
    (data / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    (data / "script.yaml").write_text(yaml.safe_dump(SCRIPT), encoding="utf-8")
    done = run_flowllm(
        "+experiment=web_sample",
        "progress=false",
        f"hydra.run.dir={base / 'run'}",
        f"dataset.path={data}",
        f"provider.emulator_script={data / 'script.yaml'}",
        *(f"~tools.servers.{name}" for name in ("tool-python", "tool-files", "tool-math", "tool-audio")),
        "tools.vision.enabled=false",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return base / "run", done.stdout


def test_the_guard_withholds_and_refuses_the_dataset_page_and_records_each_block(run: tuple[Path, str]) -> None:
    (trace,) = [t for t in read_run_traces(run[0]) if t.task_id == "leak-01"]
    search, dataset, forum = [call for turn in trace.conversation.turns for call in turn.tool_calls]
    assert search.result is not None and FORUM_PAGE in search.result
    assert f"URL: {DATASET_PAGE}" not in search.result
    assert f"withheld: {DATASET_PAGE} is a benchmark answer source" in search.result
    assert search.structured["contamination"]["blocked"][0]["url"] == DATASET_PAGE
    assert dataset.is_error and f"refused: {DATASET_PAGE} is a benchmark answer source" in str(dataset.result)
    assert LEAKED_ANSWER not in str(dataset.result)
    assert dataset.structured["contamination"]["tool"] == "read_url"
    assert not forum.is_error and LEAKED_ANSWER in str(forum.result)
    block = RunSummary.from_dict(json.loads((run[0] / "summary.json").read_text())).contamination
    assert block is not None
    assert (block.blocked, block.blocked_by_tool, block.blocked_tasks) == (
        2,
        {"read_url": 1, "web_search": 1},
        ["leak-01"],
    )


def test_the_audit_flags_the_leaked_answer_and_reports_both_accuracies(
    run: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, stdout = run
    block = RunSummary.from_dict(json.loads((run_dir / "summary.json").read_text())).contamination
    assert block is not None and block.flagged_tasks == ["leak-01"]
    assert block.accuracy["mean"] == pytest.approx(2 / 3) and block.accuracy["ci95"] is not None
    assert block.accuracy_excluding_flagged["mean"] == 0.5 and block.accuracy_excluding_flagged["n"] == 2
    assert "accuracy 66.7% (all) / 50.0% (excluding 1 flagged task)" in stdout
    assert inspect_main(["audit", str(run_dir), "--json"]) == 0
    (flag,) = json.loads(capsys.readouterr().out)["flags"]
    assert (flag["task_id"], flag["turn"], flag["tool"], flag["url"]) == ("leak-01", 3, "read_url", FORUM_PAGE)
    assert f"the answer is {LEAKED_ANSWER}" in flag["excerpt"]
    assert verify_main([str(run_dir)]) == 0  # the auditor recomputes the block from the saved results
    headline = ("contamination", "accuracy 66.7% (all) / 50.0% (excluding 1 flagged task)")
    assert headline in build_report_data(run_dir)["runs"][0]["contamination"]
    metadata = build_eval_log(open_source(run_dir)).eval.metadata or {}
    assert metadata["contamination"]["flagged_tasks"] == ["leak-01"]


def test_a_run_made_before_the_audit_can_be_audited(old_runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_main(["audit", str(old_runs / "plain"), "--pattern", r"\banchor, compass\b"]) == 0
    out = capsys.readouterr().out
    assert "accuracy 100.0% (all) / 100.0% (excluding 0 flagged tasks)" in out
    assert "answer sources blocked: 0" in out


def test_a_leak_inside_a_sub_agent_or_a_sandbox_download_is_flagged_and_local_work_is_not() -> None:
    def python(call_id: str, code: str, result: str) -> ToolCall:
        return ToolCall(call_id, "tool-python", "run_python", {"code": code}, result=result)

    page = ToolCall("c3", "tool-browse", "read_url", {"url": "https://example.org/x"}, result="48,213 visitors.")
    browser = Conversation("browser", "turn_001/subagents/browser-c2", "c2", [Turn(1, tool_calls=[page])])
    local = python("c1", "print(sum(rows))", "48213")  # computed from the task's own file: never outside
    fetched = python("c4", "import urllib.request as u; print(u.urlopen('https://a.example/k.csv').read())", "48213")
    main = Conversation(
        "main", "", None, [Turn(1, tool_calls=[local], subagents=[browser]), Turn(2, [], tool_calls=[fetched])]
    )
    result = TaskResult(task_id="t", status="completed", ground_truth="48213", correct=True)
    audit = Audit()
    audit_trace(TaskTrace("t", 1, Path("."), result, None, main, task_result=result), [], audit)
    assert [(f.agent, f.turn, f.tool, f.url) for f in audit.flags] == [
        ("main", 2, "run_python", "https://a.example/k.csv"),
        ("browser", 1, "read_url", "https://example.org/x"),
    ]


def test_an_answer_recalled_from_memory_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``memory.enabled`` remembers each task's answer; a second run of the same tasks recalls them into its
    prompt, so a task its first run answered right starts with its answer. The audit read tool results only and
    said "no task flagged". It now flags the tasks whose recalled notes hold their ground truth (not the one whose
    note holds the first run's wrong answer), and the summary's accuracy without them verifies."""
    store = tmp_path / "memory.sqlite"
    args = ("progress=false", "+experiment=gaia_sample", "memory.enabled=true", f"memory.path={store}")
    first, second = tmp_path / "first", tmp_path / "second"
    assert run_flowllm(*args, f"hydra.run.dir={first}").returncode == 0
    assert run_flowllm(*args, f"hydra.run.dir={second}").returncode == 0
    summary = RunSummary.from_dict(json.loads((first / "summary.json").read_text()))
    assert summary.contamination is not None and summary.contamination.flagged == 0  # nothing to recall yet
    summary = RunSummary.from_dict(json.loads((second / "summary.json").read_text()))
    block = summary.contamination
    assert block is not None and block.flagged_tasks == ["gaia-sample-01", "gaia-sample-02"]  # 03 was answered wrong
    assert block.accuracy_excluding_flagged["n"] == 1
    assert inspect_main(["audit", str(second)]) == 0
    assert "recall_memory" in capsys.readouterr().out
    assert verify_main([str(second)]) == 0
