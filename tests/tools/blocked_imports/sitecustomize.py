"""Test helper: on ``PYTHONPATH``, makes the modules named in ``$FLOWLLM_TEST_BLOCKED_MODULES`` (comma-separated)
fail to import, as on a machine where they are missing or broken (trafilatura without lxml_html_clean)."""

from __future__ import annotations

import os
import sys
from importlib.abc import MetaPathFinder
from typing import Any

BLOCKED = {name.strip() for name in os.environ.get("FLOWLLM_TEST_BLOCKED_MODULES", "").split(",") if name.strip()}


class _Blocked(MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named '{fullname}' (blocked for this test)", name=fullname)
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Blocked())
