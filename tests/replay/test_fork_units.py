"""The fork's and the unscored replay's pieces, without a run: verdict counts, the summary, resume, settings."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from flowllm.config.provider_schema import ForkMode, ProviderConfig
from flowllm.config.providers import default_resolver
from flowllm.core.interfaces import CallContext
from flowllm.core.types import Usage
from flowllm.datasets.task import Task
from flowllm.providers.errors import ProviderConfigError
from flowllm.providers.fork import ForkLog, ForkPoint, check_replay, main_turn
from flowllm.run.outcome import COMPLETED, TaskOutcome, read_outcome
from flowllm.run.replay_audit import is_scored, judged, replay_summary
from flowllm.run.report import accuracy_rows
from flowllm.run.summary import summarize


def outcome(task_id: str, correct: bool | None, replay: dict | None, level: int = 1) -> TaskOutcome:
    return TaskOutcome(task_id, COMPLETED, "4", "4", correct, 2, Usage(), level=level, replay=replay)


def test_only_exact_and_forked_tasks_are_scored() -> None:
    assert is_scored(None) and is_scored({"status": "exact"}) and is_scored({"status": "forked", "turn": 2})
    assert not any(is_scored({"status": s}) for s in ("diverged", "missing", "unverified"))
    counts = replay_summary(
        [
            ({"status": "exact"}, True),
            ({"status": "forked", "turn": 2, "live_calls": 2}, False),
            ({"status": "forked", "turn": 3, "live_calls": 1}, True),
            ({"status": "diverged", "turn": 1, "node": "repair_arguments"}, None),
            ({"status": "missing"}, None),
        ]
    )
    assert counts is not None
    assert (counts["exact"], counts["forked"], counts["diverged"], counts["missing"]) == (1, 2, 1, 1)
    assert (counts["scored"], counts["unscored"], counts["scored_correct"]) == (3, 2, 2)
    assert counts["accuracy_scored"] == round(2 / 3, 4) and counts["accuracy_exact"] == 1.0
    assert counts["live_calls"] == 3


def test_a_task_with_no_ground_truth_replays_but_counts_in_no_accuracy() -> None:
    """GAIA's test split hides its answers ("?"): such a task replays exactly all the same. It counted in the
    replay's accuracy as not correct: four right of five scored tasks, three unscored, headlined 50% (4/8)."""
    verdicts: list[tuple[dict | None, bool | None]] = [({"status": "exact"}, True)] * 4
    verdicts += [({"status": "exact"}, False)] + [({"status": "exact"}, None)] * 3
    counts = replay_summary(verdicts)
    assert counts is not None
    assert (counts["exact"], counts["scored"], counts["unscored"], counts["scored_correct"]) == (8, 8, 0, 4)
    assert counts["accuracy_scored"] == counts["accuracy_exact"] == 0.8
    assert judged(verdicts) == (5, 5)  # the denominators inspect's diff and report show
    outcomes = [outcome(f"t{i}", correct, verdict) for i, (verdict, correct) in enumerate(verdicts)]
    summary = summarize(outcomes, total=8, wall_seconds=1.0, interrupted=False)
    assert summary.accuracy == 0.8 and (summary.scored, summary.unscored) == (5, 3)
    assert accuracy_rows(summary)[0] == ("accuracy", "80.0% (4/5 scored: exact replays); 3 unscored: no ground truth")


def test_no_figure_counts_an_unscored_task_as_correct_or_wrong() -> None:
    summary = summarize(
        [
            outcome("a", True, {"status": "exact"}),
            outcome("b", None, {"status": "diverged", "turn": 1, "node": "x"}, level=2),
            outcome("c", False, {"status": "forked", "turn": 2}, level=2),
        ],
        total=3,
        wall_seconds=1.0,
        interrupted=False,
    ).to_dict()
    assert summary["correct"] == 1
    assert summary["accuracy"] == 0.5  # 1 of the 2 scored tasks
    assert summary["by_level"]["2"] == {"tasks": 2, "scored": 1, "unscored": 1, "correct": 0, "accuracy": 0.0}
    assert "accuracy_all" not in summary


def test_a_resumed_unscored_task_stays_unscored(tmp_path: Path) -> None:
    task = Task(task_id="b", question="q", level=1, ground_truth="4", file_name=None, dataset_dir=tmp_path)
    path = tmp_path / "result.json"
    path.write_bytes(orjson.dumps(outcome("b", None, {"status": "diverged", "turn": 1, "node": "x"}).to_dict()))
    resumed = read_outcome(path, task, rescore=lambda t, answer: answer == t.ground_truth)
    assert resumed is not None and resumed.correct is None
    path.write_bytes(orjson.dumps(outcome("b", True, {"status": "forked", "turn": 2}).to_dict()))
    resumed = read_outcome(path, task, rescore=lambda t, answer: answer == t.ground_truth)
    assert resumed is not None and resumed.correct is True


def test_the_fork_log_keeps_the_first_fork_of_a_task_and_forgets_it_for_a_new_attempt() -> None:
    log = ForkLog()
    assert log.point("t") is None and log.live("t") == (0, Usage())
    first = log.fork("t", ForkPoint(2, "the request differs"))
    assert log.fork("t", ForkPoint(3, "a sub-agent's")) == first  # concurrent sub-agents: the first one wins
    log.add_live("t", Usage(input_tokens=10, output_tokens=2))
    log.add_live("t", Usage(input_tokens=5))
    calls, usage = log.live("t")
    assert calls == 2 and (usage.input_tokens, usage.output_tokens) == (15, 2)
    log.forget("t")
    assert log.point("t") is None


def test_a_sub_agents_call_belongs_to_the_main_turn_it_runs_in() -> None:
    assert main_turn(CallContext("t", 4)) == 4
    assert main_turn(CallContext("t", 1, agent="researcher", scope="turn_003/subagents/researcher-call_0")) == 3


def _saved_run(folder: Path) -> Path:
    (folder / "tasks").mkdir(parents=True)
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(
        "provider:\n  name: offline\n  protocol: anthropic\n  model: m\n  tool_protocol: xml\n", encoding="utf-8"
    )
    return folder


def _providers(folder: Path) -> Path:
    folder.mkdir()
    (folder / "live_xml.yaml").write_text("name: live_xml\nprotocol: anthropic\nmodel: m2\n", encoding="utf-8")
    (folder / "live_native.yaml").write_text(
        "name: live_native\nprotocol: anthropic\nmodel: m2\ntool_protocol: native\n", encoding="utf-8"
    )
    (folder / "again.yaml").write_text("name: again\nprotocol: replay\nmodel: replay\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("live", "at_turn", "message"),
    [
        (None, None, "provider.fork=live needs provider.live=<a provider choice"),
        ("again", None, "provider.live=again is itself a replay"),
        ("nosuch", None, "provider.live=nosuch: unknown provider 'nosuch'"),
        ("live_native", None, "uses tool_protocol native, the saved run used xml"),
        ("live_xml", 0, "provider.fork_at_turn must be a turn number"),
    ],
)
def test_bad_fork_settings_say_what_to_do(tmp_path: Path, live: str | None, at_turn: int | None, message: str) -> None:
    cfg = ProviderConfig(
        name="replay",
        protocol="replay",
        model="replay",
        run_dir=str(_saved_run(tmp_path / "saved")),
        fork=ForkMode.live,
        live=live,
        fork_at_turn=at_turn,
        config_dir=str(_providers(tmp_path / "providers")),
    )
    resolve = default_resolver(cfg)  # the loader reads provider.config_dir; the providers only ask it
    with pytest.raises(ProviderConfigError, match=message.replace("(", r"\(").replace("<", "<")):
        check_replay(cfg, resolve)
    cfg.live, cfg.fork_at_turn = "live_xml", 2
    check_replay(cfg, resolve)  # a good fork passes
