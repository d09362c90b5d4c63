"""The HTML report in a real headless Chromium: open it, filter, open a task, expand a node.

Needs Debian's ``chromium`` and ``chromium-driver`` packages and the ``selenium`` Python package; skipped with
the reason when one of them is missing. Nothing is downloaded: Selenium drives the system chromedriver.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowllm.inspect.report import write_report
from tests.inspect.test_report import make_multirun
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, FixtureRuns

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("Chromium is absent (apt-get install chromium chromium-driver)", allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

WAIT_S = 20


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


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
    assert "100.0%" in jobs[0].text and " - 1/2 " in jobs[1].text

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
