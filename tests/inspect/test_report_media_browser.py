"""The report in a real headless Chromium: the tool-servers and per-category cards, and images in node views.

Skipped with the reason when Chromium, chromedriver or selenium is missing, like test_report_browser.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowllm.inspect.report import write_report
from tests.inspect.chromium import WAIT_S, By, WebDriverWait, start_chromium
from tests.inspect.conftest import KEYED_SERVER, UNSET_KEY
from tests.inspect.test_media import TASK, short, write_image_run


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with start_chromium(tmp_path_factory.mktemp("chromium-profile"), "1600,1000") as driver:
        yield driver


def open_report(driver: object, run: Path, target: Path) -> None:
    report, _ = write_report(run, target)
    driver.get(report.as_uri())  # type: ignore[attr-defined]
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-table tbody tr"))


def test_tool_servers_and_breakdown_cards(judged_run: Path, tmp_path: Path, browser: object) -> None:
    driver: object = browser
    open_report(driver, judged_run, tmp_path / "report.html")
    saved = json.loads((judged_run / "summary.json").read_text())
    servers = driver.find_elements(By.CSS_SELECTOR, "#tools-unavailable tbody tr")  # type: ignore[attr-defined]
    assert [r.get_attribute("data-server") for r in servers] == [KEYED_SERVER]
    assert UNSET_KEY in servers[0].text
    tables = driver.find_elements(By.CSS_SELECTOR, "#breakdown table.breakdown")  # type: ignore[attr-defined]
    assert [t.get_attribute("data-field") for t in tables] == list(saved["breakdown"])
    for table in tables:
        groups = saved["breakdown"][table.get_attribute("data-field")]
        rows = [
            [td.text for td in tr.find_elements(By.CSS_SELECTOR, "td")]
            for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")
        ]
        assert rows == [
            [value, f"{g['correct']}/{g['tasks']}", f"{g['accuracy'] * 100:.1f}%"] for value, g in groups.items()
        ]


def test_images_in_a_node_view(tmp_path: Path, browser: object) -> None:
    driver: object = browser
    run = write_image_run(tmp_path / "run")
    open_report(driver, run.path, tmp_path / "report.html")
    driver.find_element(By.CSS_SELECTOR, f'#task-table tr[data-task="{TASK}"]').click()  # type: ignore[attr-defined]
    node = WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element(By.CSS_SELECTOR, 'details.node[data-node="04_dispatch_tools"]')
    )
    node.find_element(By.CSS_SELECTOR, "summary").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: node.find_elements(By.CSS_SELECTOR, ".media"))
    image = node.find_element(By.CSS_SELECTOR, f'figure.blob[data-blob="{run.small_blob}"] img')
    # Decoded by the browser from its data: URI: the picture's own size.
    natural = driver.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", image)  # type: ignore[attr-defined]
    assert natural == [64, 40]
    assert image.get_attribute("src").startswith("data:image/png;base64,")
    line = node.find_element(By.CSS_SELECTOR, f'.blob-line[data-blob="{run.big_blob}"]')
    assert line.text == f"[image 3000x2000 png, {short(run.big_blob)}, too large to embed]"
    # The readable text names the image in one line instead of its fields.
    assert f"[image 64x40 png, {short(run.small_blob)}]" in node.find_element(By.CSS_SELECTOR, "pre.node-input").text
