"""Headless Chromium for the report's browser tests (Debian's chromium and chromium-driver, through selenium).

Importing this module skips the importing test module, saying why, when selenium, Chromium or chromedriver is
missing; ``start_chromium`` starts one browser with the flags a closed network needs (no background
connections, no updates, no sync).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 20

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("Chromium is absent (apt-get install chromium chromium-driver)", allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

__all__ = ["WAIT_S", "By", "Select", "WebDriverWait", "start_chromium"]


@contextmanager
def start_chromium(profile: Path, window: str | None = None) -> Iterator[object]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ]
    if window:
        flags.append(f"--window-size={window}")
    for flag in flags:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
