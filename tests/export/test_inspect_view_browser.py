"""``inspect view`` serves the exported log, and a real headless Chromium shows its samples, scores and messages.

Needs Debian's ``chromium`` and ``chromium-driver`` and ``selenium`` (tests/inspect/chromium.py skips, saying
why, when one is missing) and inspect_ai (the ``inspect`` extra).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason='inspect_ai is not installed (pip install "flowllm[inspect]")')

from tests.export.phoenix import free_port
from tests.export.runs import flowllm_export
from tests.inspect.chromium import By, WebDriverWait, start_chromium

INSPECT = shutil.which("inspect")
START_TIMEOUT_S = 120  # hang guards, not speed targets
PAGE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def viewer(saved_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if INSPECT is None:
        pytest.skip("the inspect command is not on PATH (pip install inspect-ai)")
    logs = tmp_path_factory.mktemp("inspect-logs")
    done = flowllm_export(saved_run, "--format", "inspect", "-o", str(logs / "run.eval"))
    assert done.returncode == 0, done.stderr
    port = free_port()
    proc = subprocess.Popen(
        [INSPECT, "view", "--log-dir", str(logs), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx2

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"inspect view exited {proc.returncode}"
            try:
                if httpx2.get(f"{url}/api/logs", timeout=5).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, "inspect view did not answer"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def body_text(driver: object) -> str:
    return str(driver.find_element(By.TAG_NAME, "body").text)  # type: ignore[attr-defined]


def test_inspect_view_shows_the_samples_and_a_conversation(viewer: str, tmp_path: Path) -> None:
    with start_chromium(tmp_path / "profile", window="1400,1000") as driver:
        driver.get(f"{viewer}/#/logs/run.eval")  # type: ignore[attr-defined]
        WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: "What is six times seven?" in body_text(d))
        text = body_text(driver)
        for expected in ("offline/flowllm-emulator", "ACCURACY", "0.5", "gaia", "delegate", "wrong", "2 Samples"):
            assert expected in text, expected
        driver.save_screenshot(str(tmp_path / "samples.png"))  # type: ignore[attr-defined]
        assert (tmp_path / "samples.png").stat().st_size > 10_000
        row = next(
            e
            for e in driver.find_elements(By.XPATH, "//*[text()='What is six times seven?']")  # type: ignore[attr-defined]
            if e.is_displayed()
        )
        row.click()
        WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: "run_python" in body_text(d))
        assert "boxed{41}" in body_text(driver)
        driver.save_screenshot(str(tmp_path / "sample.png"))  # type: ignore[attr-defined]
        errors = [
            e
            for e in driver.get_log("browser")  # type: ignore[attr-defined]
            if e["level"] == "SEVERE" and e.get("source") != "network"
        ]
        assert errors == []
