"""The Inspect AI export, read back by inspect_ai itself: read_eval_log and samples_df."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flowllm.engine.recorder import read_json
from tests.export.runs import flowllm_export

inspect_log = pytest.importorskip(
    "inspect_ai.log", reason='inspect_ai is not installed (pip install "flowllm[inspect]")'
)
inspect_analysis = pytest.importorskip("inspect_ai.analysis")


@pytest.fixture(scope="module")
def eval_file(saved_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("inspect") / "run.eval"
    done = flowllm_export(saved_run, "--format", "inspect", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert "2 sample(s)" in done.stdout
    return target


def test_inspect_reads_the_same_samples_scores_and_tokens(saved_run: Path, eval_file: Path) -> None:
    log = inspect_log.read_eval_log(str(eval_file))
    summary = read_json(saved_run / "summary.json")
    assert log.status == "success"
    assert log.eval.model == f"{summary['provider']}/{summary['model']}"
    config = yaml.safe_load((saved_run / ".hydra" / "config.yaml").read_text(encoding="utf-8"))
    assert log.eval.task_args["agent.max_turns"] == config["agent"]["max_turns"]
    assert log.eval.model_generate_config.max_tokens == config["provider"]["max_tokens"]
    assert "+subagents=analyst" in log.eval.metadata["overrides"]
    assert log.results is not None and log.results.completed_samples == summary["tasks"] == 2
    assert log.results.scores[0].metrics["accuracy"].value == summary["accuracy"] == 0.5
    usage = log.stats.model_usage[log.eval.model]
    assert usage.input_tokens == summary["usage"]["input_tokens"]
    assert usage.output_tokens == summary["usage"]["output_tokens"]
    assert usage.input_tokens_cache_read == summary["usage"]["cache_read_tokens"]
    assert usage.total_cost == pytest.approx(summary["cost_usd"])

    samples = {s.id: s for s in log.samples or []}
    assert set(samples) == {"delegate", "wrong"}
    for task_id, sample in samples.items():
        result = read_json(saved_run / "tasks" / task_id / "result.json")
        assert sample.target == result["ground_truth"]
        score = sample.scores["gaia"]
        assert score.value == ("C" if result["correct"] else "I")
        assert score.answer == result["answer"] and result["ground_truth"] in (score.explanation or "")
        task_usage = sample.model_usage[log.eval.model]
        assert task_usage.input_tokens == result["usage"]["input_tokens"]
        assert task_usage.output_tokens == result["usage"]["output_tokens"]
        assert task_usage.total_cost is not None and task_usage.total_cost > 0


def test_a_sample_holds_the_conversation_and_timed_events(saved_run: Path, eval_file: Path) -> None:
    sample = inspect_log.read_eval_log_sample(str(eval_file), id="wrong", epoch=1)
    assert sample.input == "What is six times seven?"
    roles = [m.role for m in sample.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    call = sample.messages[2].tool_calls[0]
    assert (call.function, call.arguments) == ("run_python", {"code": "print(6 * 7)"})
    assert sample.messages[3].tool_call_id == call.id and sample.messages[3].text.strip() == "42"
    assert "boxed{41}" in sample.messages[4].text and "41" in sample.output.completion
    kinds = [e.event for e in sample.events]
    assert kinds == ["model", "tool", "model"]
    model_event, tool_event = sample.events[0], sample.events[1]
    meta = read_json(saved_run / "tasks" / "wrong" / "turn_001" / "03_call_model" / "meta.json")
    assert model_event.working_time == pytest.approx(meta["duration_s"])
    assert model_event.output.usage is not None and model_event.output.usage.output_tokens > 0
    assert tool_event.function == "run_python" and tool_event.result.strip() == "42"
    assert tool_event.completed is not None and tool_event.completed >= tool_event.timestamp


def test_a_subagents_calls_are_events_under_the_tool_call_that_started_it(eval_file: Path) -> None:
    sample = inspect_log.read_eval_log_sample(str(eval_file), id="delegate", epoch=1)
    delegate = next(e for e in sample.events if e.event == "tool")
    assert delegate.function == "execute_subtask" and delegate.agent == "analyst"
    inner = [e if isinstance(e, dict) else e.model_dump() for e in delegate.events]
    assert [e["event"] for e in inner] == ["model", "tool", "model"]
    assert inner[0]["role"] == "analyst" and inner[1]["function"] == "run_python"


def test_samples_df_lists_every_sample_with_its_score_and_tokens(saved_run: Path, eval_file: Path) -> None:
    frame = inspect_analysis.samples_df(str(eval_file))
    assert sorted(frame["id"]) == ["delegate", "wrong"]
    by_id = frame.set_index("id")
    assert by_id.loc["delegate", "score_gaia"] == "C" and by_id.loc["wrong", "score_gaia"] == "I"
    for task_id in ("delegate", "wrong"):
        result = read_json(saved_run / "tasks" / task_id / "result.json")
        usage = json.loads(by_id.loc[task_id, "model_usage"])
        (model_usage,) = usage.values()
        assert model_usage["input_tokens"] == result["usage"]["input_tokens"]
        assert by_id.loc[task_id, "total_tokens"] == result["usage"]["input_tokens"] + result["usage"]["output_tokens"]


def test_the_model_usage_is_labelled_as_the_eval_model_when_the_ledger_names_the_provider_otherwise(
    tmp_path: Path,
) -> None:
    """provider=offline_chat's calls go to the ledger as provider ``offline`` (its config's name): the usage is
    still the eval model's, not a second model's."""
    from flowllm.export.inspect_log import build_eval_log
    from flowllm.export.source import open_source
    from tests.export.runs import export_run

    run = export_run(tmp_path, "provider=offline_chat").check().run_dir
    assert {json.loads(line)["provider"] for line in (run / "usage.jsonl").read_text().splitlines()} == {"offline"}
    log = build_eval_log(open_source(run))
    assert log.eval.model == "offline_chat/flowllm-emulator"
    assert set(log.stats.model_usage) == {log.eval.model}
    assert all(set(s.model_usage) == {log.eval.model} for s in log.samples or [])
