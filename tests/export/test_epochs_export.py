"""An ``experiment.epochs=2`` run exported: one Inspect sample per task and epoch (read back by inspect_ai's
read_eval_log), one OpenTelemetry trace per task and epoch, one analysis row per task and epoch, and one GAIA
submission line per task carrying the answer its epochs voted for."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from flowllm.analysis import load
from flowllm.engine.recorder import read_json
from flowllm.export.gaia import build_submission, reasoning_trace
from flowllm.export.source import open_source
from flowllm.scoring.stats import voted_epoch
from tests.export.runs import RUN_TASKS, SPLIT, export_run, flowllm_export

EPOCHS = 2


@pytest.fixture(scope="module")
def epochs_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The export tests' run (a correct task with a sub-agent, a wrong one) with two epochs of each task."""
    return export_run(tmp_path_factory.mktemp("epochs-export"), f"experiment.epochs={EPOCHS}").check().run_dir


def _epoch_result(run: Path, task_id: str, epoch: int) -> dict:
    return read_json(run / "tasks" / task_id / "epochs" / str(epoch) / "result.json")


def test_inspect_reads_one_sample_per_task_and_epoch(epochs_run: Path, tmp_path: Path) -> None:
    inspect_log = pytest.importorskip("inspect_ai.log")
    target = tmp_path / "run.eval"
    done = flowllm_export(epochs_run, "--format", "inspect", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert f"{len(RUN_TASKS) * EPOCHS} sample(s)" in done.stdout
    log = inspect_log.read_eval_log(str(target))
    assert log.eval.config.epochs == EPOCHS and log.eval.config.epochs_reducer == ["mean"]
    assert log.eval.dataset.samples == len(RUN_TASKS) and log.eval.dataset.sample_ids == list(RUN_TASKS)
    assert log.results is not None and log.results.total_samples == log.results.completed_samples == 4
    assert log.results.scores[0].metrics["accuracy"].value == read_json(epochs_run / "summary.json")["accuracy"]
    assert log.samples is not None
    assert sorted((s.id, s.epoch) for s in log.samples) == sorted((t, e) for t in RUN_TASKS for e in (1, 2))
    for sample in log.samples:
        result = _epoch_result(epochs_run, str(sample.id), sample.epoch)
        assert sample.scores is not None
        assert next(iter(sample.scores.values())).value == ("C" if result["correct"] else "I")
        assistants = [m for m in sample.messages if m.role == "assistant"]
        assert len(assistants) == result["turns"]  # this epoch's own turns, not the other epoch's
        assert [m.role for m in sample.messages][:2] == ["system", "user"]
        assert any(m.role == "tool" for m in sample.messages)
        assert sample.model_usage[log.eval.model].input_tokens == result["usage"]["input_tokens"]
    ledger = [json.loads(line) for line in (epochs_run / "usage.jsonl").read_text().splitlines()]
    billed = sum(e["cost_usd"] for e in ledger if e["type"] == "attempt" and e["task_id"] == "wrong")
    by_epoch = [s.model_usage[log.eval.model].total_cost for s in log.samples if s.id == "wrong"]
    assert all(c is not None and c > 0 for c in by_epoch) and sum(by_epoch) == pytest.approx(billed)


def test_analysis_has_a_row_per_task_and_epoch(epochs_run: Path) -> None:
    pytest.importorskip("pandas")
    frames = load(epochs_run)
    tasks = frames.tasks.set_index(["task_id", "epoch"]).sort_index()
    assert list(tasks.index) == [(t, e) for t in sorted(RUN_TASKS) for e in (1, 2)]
    for (task_id, epoch), row in tasks.iterrows():
        result = _epoch_result(epochs_run, str(task_id), int(epoch))
        assert row["correct"] == result["correct"] and row["turns"] == result["turns"]
        assert row["input_tokens"] == result["usage"]["input_tokens"]
        assert row["cost_usd"] > 0
    per_epoch_turns = frames.turns.groupby(["task_id", "epoch", "agent"])["turn"].nunique()
    assert per_epoch_turns[("wrong", 1, "main")] == per_epoch_turns[("wrong", 2, "main")] == 2
    assert per_epoch_turns[("delegate", 2, "analyst")] == 2  # the sub-agent's turns of epoch 2
    assert set(frames.calls["epoch"].dropna().astype(int)) == {1, 2}  # the ledger names each call's epoch


def test_one_trace_per_task_and_epoch(epochs_run: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from tests.export.test_telemetry_spans import after_the_fact

    spans = after_the_fact(epochs_run)
    roots = {s.name: s for s in spans if s.parent is None}
    assert set(roots) == {f"task {t} epoch {e}" for t in RUN_TASKS for e in (1, 2)}
    assert len({s.context.trace_id for s in spans}) == len(RUN_TASKS) * EPOCHS
    assert {(r.attributes["flowllm.task_id"], r.attributes["flowllm.epoch"]) for r in roots.values()} == {
        (t, e) for t in RUN_TASKS for e in (1, 2)
    }


def test_live_spans_of_an_epochs_run_equal_the_saved_ones(epochs_run: Path) -> None:
    """The live listener fed each epoch's node events as the epochs ran them (one after another, each in its
    own epoch context, an attempt discarded in epoch 2 not touching epoch 1) gives the saved run's spans."""
    pytest.importorskip("opentelemetry.sdk")
    import orjson

    from flowllm.rundir.epochs import running_epoch
    from flowllm.telemetry.live import LiveTelemetry
    from tests.export.test_telemetry_spans import after_the_fact, in_memory, node_events, signature

    pipeline, memory = in_memory()
    listener = LiveTelemetry(pipeline, epochs_run, orjson.dumps)
    for task_id in RUN_TASKS:
        for epoch in (1, 2):
            with running_epoch(epoch):
                listener.discard_task(task_id)  # a retried attempt of this epoch: the earlier epoch is kept
                for _start, scope, turn, name, index, folder in node_events(epochs_run, task_id, epoch):
                    ctx = SimpleNamespace(task_id=task_id, turn=turn, scope=scope, agent="main")
                    node = SimpleNamespace(name=name, index=index)
                    listener.on_node(
                        ctx,  # type: ignore[arg-type]
                        node,  # type: ignore[arg-type]
                        read_json(folder / "input.json"),
                        read_json(folder / "output.json"),
                        read_json(folder / "meta.json"),
                    )
        listener.finish_task(task_id, read_json(epochs_run / "tasks" / task_id / "result.json"))
    streamed = list(memory.get_finished_spans())
    assert signature(streamed) == signature(after_the_fact(epochs_run))


def test_the_gaia_submission_has_one_line_per_task_with_the_voted_answer(epochs_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "answers.jsonl"
    done = flowllm_export(epochs_run, "--format", "gaia-submission", "-o", str(target))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [line["task_id"] for line in lines] == list(SPLIT)
    answers = {line["task_id"]: line["model_answer"] for line in lines}
    assert answers == {"delegate": "385", "wrong": "41", "not-run": ""}
    # Epochs that disagree, one vote each: the tie goes to the earliest epoch, not to the task's result.json
    # (which carries the last epoch's answer), with that epoch's reasoning.
    run = tmp_path / "run"
    shutil.copytree(epochs_run, run)
    first = run / "tasks" / "wrong" / "epochs" / "1" / "result.json"
    first.write_text(json.dumps({**read_json(first), "answer": "forty-one"}))
    assert read_json(run / "tasks" / "wrong" / "result.json")["answer"] == "41"
    source = open_source(run)
    line = next(x for x in build_submission(source).lines if x.task_id == "wrong")
    assert line.model_answer == "forty-one"
    assert line.reasoning_trace == reasoning_trace(
        next(t for t in source.traces if (t.task_id, t.epoch) == ("wrong", 1))
    )
    assert voted_epoch(["forty-one", "41"]) == 0 and voted_epoch(["Paris", " paris. ", "Rome"]) == 0
    assert voted_epoch(["Rome", "Paris", "paris"]) == 1 and voted_epoch(["", None]) is None


def test_an_unfinished_epochs_task_is_exported_with_its_finished_epochs(epochs_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(epochs_run, run)
    (run / "summary.json").unlink()
    (run / "tasks" / "wrong" / "result.json").unlink()  # as a crash during its epoch 2 leaves it
    (run / "tasks" / "wrong" / "epochs" / "2" / "result.json").unlink()
    source = open_source(run)
    assert "exporting the 3 finished task epoch(s), leaving out 1 unfinished" in source.notes[0]
    assert [(t.task_id, t.epoch) for t in source.unfinished] == [("wrong", 2)]
    assert ("wrong", 1) in [(t.task_id, t.epoch) for t in source.finished]
    answers = {line.task_id: line.model_answer for line in build_submission(source).lines}
    assert answers["wrong"] == "" and answers["delegate"] == "385"  # a task is submitted once all epochs ran


def test_a_settled_run_exports_no_epoch_of_a_task_it_left_unfinished(epochs_run: Path, tmp_path: Path) -> None:
    """A resume that the spent budget stopped at once leaves a task with finished epochs and no result.json:
    the summary counts it unfinished, so its epochs are no samples (they were, with their scores, in a log that
    Inspect then scored on more tasks than the run counts, and that ``flowllm verify --export`` refused)."""
    run = tmp_path / "run"
    shutil.copytree(epochs_run, run)
    (run / "tasks" / "wrong" / "result.json").unlink()
    source = open_source(run)
    assert [(t.task_id, t.epoch) for t in source.unfinished] == [("wrong", 1), ("wrong", 2)]
    assert "wrong" not in {t.task_id for t in source.finished}
    assert source.notes[0].startswith("2 task epoch(s) are unfinished")


def test_an_epoch_the_budget_stopped_is_exported_unscored_not_wrong(tmp_path: Path) -> None:
    """A budget's stop leaves an epoch unfinished: the Inspect sample has no score and the tasks frame's
    ``correct`` is NA for it (it read "I" and False, so a mean counted it wrong); verify agrees with the log."""
    inspect_log = pytest.importorskip("inspect_ai.log")
    pd = pytest.importorskip("pandas")
    from flowllm.verify import audit_run
    from tests.replay.runs import run_flowllm

    run = tmp_path / "run"
    overrides = ("experiment.epochs=2", "experiment.budget.cost_usd=0.01", "experiment.max_concurrent=1")
    run_flowllm(run, "dataset.limit=2", *overrides).check(3)  # 3: the budget ended the run with tasks left
    stopped = {
        (p.parts[-4], int(p.parts[-2]))
        for p in run.glob("tasks/*/epochs/*/result.json")
        if read_json(p)["status"] == "budget"
    }
    assert stopped
    target = tmp_path / "run.eval"
    assert flowllm_export(run, "--format", "inspect", "-o", str(target)).returncode == 0
    samples = {(s.id, s.epoch): s for s in inspect_log.read_eval_log(str(target)).samples or []}
    for key in stopped:
        assert not samples[key].scores and samples[key].metadata["status"] == "budget"
    rows = load(run).tasks.set_index(["task_id", "epoch"])
    for key in stopped:
        assert rows.loc[key, "status"] == "budget" and pd.isna(rows.loc[key, "correct"])
    audit = audit_run(run, exports=[target])
    assert audit.verified, [f.line() for f in audit.findings]
    if importlib.util.find_spec("opentelemetry.sdk") is not None:  # the spans say so too
        from tests.export.test_telemetry_spans import after_the_fact

        roots = {
            (s.attributes["flowllm.task_id"], s.attributes["flowllm.epoch"]): s.attributes
            for s in after_the_fact(run)
            if s.parent is None and s.attributes
        }
        for key in stopped:
            assert roots[key]["flowllm.scored"] is False and "flowllm.correct" not in roots[key]
