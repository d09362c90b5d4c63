"""The report's cost columns in a real headless Chromium: the cost card, per-task tokens and cost, sweep columns.

A screenshot of the task table's cost cells is taken and checked to hold drawn text (not a blank strip).
Skipped with the reason when Chromium, chromedriver or selenium is missing, like test_report_browser.py.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowllm.inspect.report import write_report
from flowllm.spend.task_usage import read_bills
from tests.inspect.chromium import WAIT_S, By, WebDriverWait, start_chromium
from tests.inspect.test_report import make_multirun
from tests.replay.runs import FixtureRuns


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with start_chromium(tmp_path_factory.mktemp("chromium-profile"), "1600,1000") as driver:
        yield driver


MONEY = re.compile(r"^\$\d[\d,]*\.\d{2,4}$")


def test_cost_card_task_columns_and_sweep_columns(runs: FixtureRuns, tmp_path: Path, browser: object) -> None:
    driver: object = browser
    multirun = make_multirun(runs, tmp_path / "multirun")
    report, _ = write_report(multirun, tmp_path / "report.html")
    driver.get(report.as_uri())  # type: ignore[attr-defined]
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-table tbody tr"))

    cards = {
        c.find_element(By.CSS_SELECTOR, ".k").text: c.find_element(By.CSS_SELECTOR, ".v").text
        for c in driver.find_elements(By.CSS_SELECTOR, "#summary-cards .card")  # type: ignore[attr-defined]
    }
    assert MONEY.match(cards["cost"]), cards
    bills = read_bills(runs.original.run_dir)
    assert cards["billed tokens"] == f"{sum(b.total_tokens for b in bills.values()):,}"

    headers = [th.text.strip() for th in driver.find_elements(By.CSS_SELECTOR, "#task-table thead th")]  # type: ignore[attr-defined]
    tokens_at, cost_at = headers.index("tokens"), headers.index("cost")
    for row in driver.find_elements(By.CSS_SELECTOR, "#task-table tbody tr"):  # type: ignore[attr-defined]
        cells = row.find_elements(By.CSS_SELECTOR, "td")
        task = row.get_attribute("data-task")
        assert cells[tokens_at].text == f"{bills[task].total_tokens:,}"
        assert MONEY.match(cells[cost_at].text), cells[cost_at].text

    comparison = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#comparison thead th")]  # type: ignore[attr-defined]
    assert "cost" in comparison and "billed tokens" in comparison
    cost_col = comparison.index("cost")
    jobs = driver.find_elements(By.CSS_SELECTOR, "#comparison tbody tr")  # type: ignore[attr-defined]
    # Job 0 ran against the (priced) emulator; job 1 is a replay, which bills nothing it could price.
    assert MONEY.match(jobs[0].find_elements(By.CSS_SELECTOR, "td")[cost_col].text)

    # The screenshot: the first cost cell as Chromium drew it, checked to hold dark text pixels.
    cell = driver.find_elements(By.CSS_SELECTOR, "#task-table tbody td.cost-col")[1]  # type: ignore[attr-defined]
    png = cell.screenshot_as_png
    (tmp_path / "cost-cell.png").write_bytes(png)
    image = pytest.importorskip("matplotlib.image").imread(io.BytesIO(png), format="png")
    assert image.shape[0] > 5 and image.shape[1] > 20
    luminance = image[..., :3].mean(axis=2)
    assert luminance.min() < 0.5 < luminance.max(), "the cost cell rendered blank"
