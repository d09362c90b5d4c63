"""The HTML report in a real headless Chromium: open it, filter, open a task, expand a node.

Needs Debian's ``chromium`` and ``chromium-driver`` packages and the ``selenium`` Python package; skipped with
the reason when one of them is missing. Nothing is downloaded: Selenium drives the system chromedriver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowllm.exit_codes import ExitCode
from flowllm.inspect.report import write_report
from tests.experiment.helpers import run_flowllm
from tests.inspect.chromium import WAIT_S, By, Select, WebDriverWait, start_chromium
from tests.inspect.test_report import make_multirun
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, FixtureRuns


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with start_chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def visible_rows(driver: object) -> list[str]:
    return [r.get_attribute("data-task") for r in driver.find_elements(By.CSS_SELECTOR, "#task-table tbody tr")]


def test_filter_open_a_task_and_expand_a_node(runs: FixtureRuns, tmp_path: Path, browser: object) -> None:
    driver = browser
    report, _ = write_report(make_multirun(runs, tmp_path / "multirun"), tmp_path / "report.html")
    driver.get(report.as_uri())
    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-table tbody tr"))

    # The sweep comparison: one row per job, and the task matrix.
    jobs = driver.find_elements(By.CSS_SELECTOR, "#comparison tbody tr")
    assert [j.get_attribute("data-job") for j in jobs] == ["0", "1"]
    # Job 1 replayed no task exactly: its accuracy is not known, and the report says so with "-".
    # The replay job scored no task (one missed, one diverged): 0 correct of 0 scored, no accuracy.
    assert "100.0%" in jobs[0].text and "0/0 scored" in jobs[1].text and "not known" in jobs[1].text

    # Job 0, the original run: filter by level, then clear the filter.
    assert sorted(visible_rows(driver)) == sorted([LENIENT_TASK, CLEAN_TASK])
    Select(driver.find_element(By.ID, "level-filter")).select_by_value("2")
    assert visible_rows(driver) == [CLEAN_TASK]
    assert driver.find_element(By.ID, "task-count").text == "showing 1 of 2"
    Select(driver.find_element(By.ID, "level-filter")).select_by_value("")

    # Open a task: its timeline, the repaired call, then a node's input and output on demand.
    driver.find_element(By.CSS_SELECTOR, f'#task-table tr[data-task="{LENIENT_TASK}"]').click()
    detail = driver.find_element(By.ID, "task-detail")
    assert LENIENT_TASK in detail.find_element(By.ID, "detail-title").text
    turns = detail.find_elements(By.CSS_SELECTOR, ".turn")
    assert [t.get_attribute("data-turn") for t in turns] == ["1", "2"]
    assert "repair: lenient" in turns[0].find_element(By.CSS_SELECTOR, ".repair").text
    assert "5259.18" in turns[0].find_element(By.CSS_SELECTOR, "pre.result").text
    node = turns[0].find_element(By.CSS_SELECTOR, 'details.node[data-node="06_repair_arguments"]')
    assert not node.find_elements(By.CSS_SELECTOR, "pre.node-output")  # built only when expanded
    node.find_element(By.TAG_NAME, "summary").click()
    output = wait.until(lambda d: node.find_element(By.CSS_SELECTOR, "pre.node-output"))
    assert 'repair_stage: "lenient"' in output.text
    assert 'if row["region"] == "North":' in output.text  # code shown with its line breaks

    # Job 1, the replay that lost a turn: filter on failed tasks and read why.
    Select(driver.find_element(By.ID, "run-select")).select_by_value("1")
    Select(driver.find_element(By.ID, "status-filter")).select_by_value("failed")
    assert visible_rows(driver) == [LENIENT_TASK]
    driver.find_element(By.CSS_SELECTOR, f'#task-table tr[data-task="{LENIENT_TASK}"]').click()
    error = driver.find_element(By.CSS_SELECTOR, "#task-detail pre.task-error").text
    assert "turn 2: the replayed run never made this turn" in error

    # Sorting: a click on "task" sorts ascending, a second click descending.
    Select(driver.find_element(By.ID, "status-filter")).select_by_value("")
    header = driver.find_element(By.CSS_SELECTOR, '#task-table th[data-key="task_id"]')
    header.click()
    assert visible_rows(driver) == sorted([LENIENT_TASK, CLEAN_TASK])
    driver.find_element(By.CSS_SELECTOR, '#task-table th[data-key="task_id"]').click()
    assert visible_rows(driver) == sorted([LENIENT_TASK, CLEAN_TASK], reverse=True)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []  # no JavaScript error on the way


def test_a_replay_shows_its_verdicts_and_where_it_diverged(runs: FixtureRuns, tmp_path: Path, browser: object) -> None:
    driver = browser
    report, _ = write_report(runs.strict.run_dir, tmp_path / "replay.html")
    driver.get(report.as_uri())
    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-table tbody tr"))

    # The replay card: counts, accuracy on the exact replays and on the scored tasks, the unscored count.
    card = driver.find_element(By.ID, "replay-card").text
    assert "1 exact \u00b7 1 diverged \u00b7 0 missing" in card
    assert "100.0% on exact replays (1/1)" in card and "100.0% on scored tasks (1/1), 1 unscored" in card
    assert "accuracy (scored tasks)" in driver.find_element(By.ID, "summary-cards").text

    # A replay column per task, and a filter on it.
    headers = [th.text.strip() for th in driver.find_elements(By.CSS_SELECTOR, "#task-table th")]
    assert headers[:4] == ["task", "level", "status", "replay"]
    cells = {
        r.get_attribute("data-task"): r.find_element(By.CSS_SELECTOR, "td.replay-col").text
        for r in driver.find_elements(By.CSS_SELECTOR, "#task-table tbody tr")
    }
    assert cells == {LENIENT_TASK: "diverged at turn 1 / repair_arguments", CLEAN_TASK: "exact"}
    Select(driver.find_element(By.ID, "replay-filter")).select_by_value("diverged")
    assert visible_rows(driver) == [LENIENT_TASK]
    assert driver.find_element(By.ID, "task-count").text == "showing 1 of 2"

    # The task view: what changed, the saved and the new value, and the node marked in its turn.
    driver.find_element(By.CSS_SELECTOR, f'#task-table tr[data-task="{LENIENT_TASK}"]').click()
    panel = driver.find_element(By.ID, "task-replay")
    assert "diverged at turn 1 / repair_arguments" in panel.text
    assert "repair_arguments output, at prepared_calls[0].arguments" in panel.text
    assert 'if row["region"] == "North":' in panel.find_element(By.CSS_SELECTOR, "pre.replay-saved").text
    assert panel.find_element(By.CSS_SELECTOR, "pre.replay-new").text == "null"
    marked = driver.find_elements(By.CSS_SELECTOR, "#task-detail details.node.diverged")
    assert [m.get_attribute("data-node") for m in marked] == ["06_repair_arguments"]
    assert "replay diverged here" in marked[0].find_element(By.TAG_NAME, "summary").text
    assert driver.find_element(By.CSS_SELECTOR, '.turn[data-turn="1"] details.node.diverged')

    # The exact task has no replay panel.
    Select(driver.find_element(By.ID, "replay-filter")).select_by_value("exact")
    driver.find_element(By.CSS_SELECTOR, f'#task-table tr[data-task="{CLEAN_TASK}"]').click()
    assert not driver.find_elements(By.ID, "task-replay")
    assert not driver.find_elements(By.CSS_SELECTOR, "#task-detail details.node.diverged")
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_a_run_that_is_not_a_replay_has_no_replay_card_or_column(
    runs: FixtureRuns, tmp_path: Path, browser: object
) -> None:
    driver = browser
    report, _ = write_report(runs.original.run_dir, tmp_path / "original.html")
    driver.get(report.as_uri())
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-table tbody tr"))
    assert not driver.find_elements(By.ID, "replay-card")
    assert not driver.find_elements(By.ID, "replay-filter")
    headers = [th.text.strip() for th in driver.find_elements(By.CSS_SELECTOR, "#task-table th")]
    assert "replay" not in headers
    assert driver.find_element(By.ID, "summary-cards").text.startswith("accuracy\n100.0% (2/2 scored)")


def test_a_task_the_budget_stopped_reads_unfinished_not_wrong(tmp_path: Path, browser: object) -> None:
    """The summary leaves a task experiment.budget stopped out of the accuracy; its row and its panel say
    unfinished where they said false."""
    run = tmp_path / "run"
    overrides = ("experiment.budget.cost_usd=0.0001", "experiment.max_concurrent=2", "dataset.limit=3")
    done = run_flowllm("progress=false", *overrides, f"hydra.run.dir={run}")
    assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    stopped = json.loads((run / "summary.json").read_text())["budget"]["stopped_tasks"]
    driver = browser
    report, _ = write_report(run, tmp_path / "budget.html")
    driver.get(report.as_uri())
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-table tbody tr"))
    headers = [th.text.strip() for th in driver.find_elements(By.CSS_SELECTOR, "#task-table th")]
    column = headers.index("correct")
    for task_id in stopped:
        row = driver.find_element(By.CSS_SELECTOR, f'#task-table tr[data-task="{task_id}"]')
        assert row.find_elements(By.CSS_SELECTOR, "td")[column].text == "unfinished"
    driver.find_element(By.CSS_SELECTOR, f'#task-table tr[data-task="{next(iter(stopped))}"]').click()
    assert "correct\nunfinished" in driver.find_element(By.ID, "task-detail").text
