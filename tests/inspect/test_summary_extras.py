"""The summary view and the HTML report show summary.json → tools.unavailable and → breakdown, when non-empty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowllm.inspect.cli import main
from flowllm.inspect.report import write_report
from tests.inspect.conftest import KEYED_SERVER, UNSET_KEY
from tests.inspect.minirun import write_run, write_task
from tests.inspect.test_report import embedded_data

BREAKDOWN = {
    "topic": {
        "Geography": {"tasks": 2, "correct": 1, "accuracy": 0.5},
        "Science and technology": {"tasks": 1, "correct": 1, "accuracy": 1.0},
    },
    "answer_type": {"Date": {"tasks": 1, "correct": 1, "accuracy": 1.0}, "Number": {"tasks": 1, "correct": 0}},
}


def summary_of(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([str(run)]) == 0
    return capsys.readouterr().out


def report_of(run: Path, tmp_path: Path) -> tuple[str, dict]:
    target, _ = write_report(run, tmp_path / "report.html")
    html = target.read_text(encoding="utf-8")
    return html, embedded_data(html)["runs"][0]


def mini(tmp_path: Path, name: str, **summary: object) -> Path:
    run = write_run(tmp_path / name, summary)
    write_task(run, "t1", [[("call_model", {"messages": []}, {"response": {"text": "42"}})]])
    return run


def test_a_real_judged_run_shows_its_breakdown_and_its_disabled_server(
    judged_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = json.loads((judged_run / "summary.json").read_text())
    out = summary_of(judged_run, capsys)
    assert "tool servers unavailable" in out and KEYED_SERVER in out and UNSET_KEY in out
    for name, groups in saved["breakdown"].items():
        assert f"accuracy by {name}" in out
        for value, figures in groups.items():
            line = next(line for line in out.splitlines() if f" {value} " in line)
            assert f"{figures['correct']}/{figures['tasks']}" in line and f"{figures['accuracy']:.1%}" in line
    html, data = report_of(judged_run, tmp_path)
    assert data["tools_unavailable"] == {"known": True, "servers": saved["tools"]["unavailable"]}
    assert UNSET_KEY in data["tools_unavailable"]["servers"][KEYED_SERVER]
    assert {name: [r["value"] for r in rows] for name, rows in data["breakdown"].items()} == {
        name: list(groups) for name, groups in saved["breakdown"].items()
    }
    # The page draws both cards from these (ids the browser test looks for).
    assert 'id: "tools-unavailable"' in html and 'id: "breakdown"' in html


def test_breakdown_and_unavailable_servers_of_a_hand_made_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = mini(
        tmp_path,
        "extras",
        breakdown=BREAKDOWN,
        tools={"unavailable": {"tool-search": "server 'tool-search' is disabled: SERPER_API_KEY not set"}},
    )
    out = summary_of(run, capsys)
    assert "accuracy by topic" in out and "accuracy by answer_type" in out
    geography = next(line for line in out.splitlines() if "Geography" in line)
    assert "1/2" in geography and "50.0%" in geography
    number = next(line for line in out.splitlines() if " Number " in line)
    assert "0/1" in number and "0.0%" in number  # an accuracy the summary left out is computed
    assert "tool-search" in out and "SERPER_API_KEY not set" in out
    _, data = report_of(run, tmp_path)
    geo = {"value": "Geography", "tasks": 2, "scored": 2, "correct": 1, "accuracy": 0.5}  # scored: every task, then
    assert data["breakdown"]["topic"][0] == geo
    assert data["breakdown"]["answer_type"][1]["accuracy"] == 0.0
    assert data["tools_unavailable"]["servers"] == {
        "tool-search": "server 'tool-search' is disabled: SERPER_API_KEY not set"
    }


def test_unavailable_servers_not_known_are_said_to_be_not_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = mini(tmp_path, "workers", tools={"unavailable": None})  # experiment.workers=N: the parent cannot tell
    out = summary_of(run, capsys)
    assert "tool servers unavailable: not known" in out
    _, data = report_of(run, tmp_path)
    assert data["tools_unavailable"] == {"known": False, "servers": {}}


def test_nothing_is_shown_when_there_is_nothing_to_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, summary in (("empty", {"tools": {"unavailable": {}}, "breakdown": {}}), ("older", {})):
        run = mini(tmp_path, name, **summary)
        out = summary_of(run, capsys)
        assert "tool servers unavailable" not in out and "accuracy by" not in out
        _, data = report_of(run, tmp_path / name)
        assert data["tools_unavailable"] is None and data["breakdown"] == {}
