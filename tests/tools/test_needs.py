"""A built-in tool that cannot work is known before the first task: its server checks its needs at start, marks
what cannot work in its listing, and the catalog leaves it out and says why (with the line to install).
The missing or broken libraries are simulated with tests/tools/blocked_imports (a sitecustomize that makes the
named modules fail to import in the server's process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowllm.core.types import InfraCause
from flowllm.tools import open_tool_catalog, open_tool_pool

BLOCKER = str(Path(__file__).parent / "blocked_imports")


def server(module: str, blocked: str, *args: str) -> dict[str, Any]:
    return {
        "command": "python",
        "args": ["-m", module, *args],
        "env": {"PYTHONPATH": BLOCKER, "FLOWLLM_TEST_BLOCKED_MODULES": blocked},
        "scope": "run",
    }


async def test_a_broken_page_reader_withdraws_tool_browse_and_says_how_to_install(tmp_path: Path) -> None:
    cfg = {
        "servers": {
            "tool-browse": server("flowllm.tools.browse", "trafilatura"),
            "tool-files": server("flowllm.tools.files", "markitdown"),
            "tool-math": server("flowllm.tools.math", ""),
        }
    }
    async with open_tool_catalog(cfg) as catalog:
        why = catalog.unavailable["tool-browse"]
        assert "needs trafilatura, which does not import (ModuleNotFoundError" in why
        assert "pip install 'flowllm[docs]'" in why and "read_url" in why
        # tool-files keeps list_files and read_file for text, and says what read_file cannot read.
        limited = catalog.unavailable["tool-files.read_file"]
        assert "reading pdf, docx" in limited and "needs markitdown, which is not installed" in limited
        assert "offered for the rest" in limited
        assert set(catalog.withdrawn) == {"tool-browse", "tool-files.read_file"}
        assert "tool-browse" not in catalog.listings and "tool-browse" not in catalog.shared
        async with open_tool_pool(cfg, tmp_path, catalog=catalog) as pool:
            offered = {(t["server"], t["name"]) for t in await pool.list_tools()}
            assert offered == {("tool-files", "read_file"), ("tool-files", "list_files"), ("tool-math", "calculate")}
            read_file = next(t for t in await pool.list_tools() if t["name"] == "read_file")
            assert "PDF" not in read_file["description"]
            (tmp_path / "notes.txt").write_text("plain text still reads")
            result = await pool.call("tool-files", "read_file", {"path": "notes.txt"}, call_id="1", timeout_s=60)
            assert not result.is_error and "plain text still reads" in result.content and result.infra is None
            (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4")
            pdf = await pool.call("tool-files", "read_file", {"path": "report.pdf"}, call_id="2", timeout_s=60)
            assert pdf.is_error and "needs markitdown" in pdf.content
            assert pdf.infra is InfraCause.UNAVAILABLE  # counted as the machine's failure, not the model's


async def test_without_a_transcription_provider_transcribe_is_not_offered(tmp_path: Path) -> None:
    cfg = {"servers": {"tool-audio": server("flowllm.tools.audio", "", "--api-key-env", "FLOWLLM_TEST_NO_SUCH_KEY")}}
    async with open_tool_pool(cfg, tmp_path) as pool:
        assert await pool.list_tools() == []
        assert "no transcription provider is configured" in pool.unavailable["tool-audio"]


async def test_a_working_install_withdraws_nothing() -> None:
    cfg = {
        "servers": {"tool-browse": server("flowllm.tools.browse", ""), "tool-files": server("flowllm.tools.files", "")}
    }
    async with open_tool_catalog(cfg) as catalog:
        assert catalog.unavailable == {} and set(catalog.listings["tool-browse"].tools) == {"read_url", "find_in_url"}
