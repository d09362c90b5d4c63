"""Document readers in their own capped process: a reader that overruns its time is killed (and the next call
gets a fresh worker), one that needs more memory than the cap fails with that reason, a real document is read
the same as in-process, and read_file reports each as one line to the model. Each runs with the worker under
bubblewrap (where it works here) and with the plain fallback worker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from flowllm.tools.files import read_file_result
from flowllm.tools.web.documents import DocumentError, convert
from flowllm.tools.web.readerproc import ReaderLimits, ReaderProcess


@pytest.fixture(params=[True, False], ids=["isolated", "fallback"])
def isolate(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def reader(isolate: bool) -> ReaderProcess:
    process = ReaderProcess(ReaderLimits(memory_mb=512, timeout_s=3), isolate=isolate)
    yield process
    process.close()


def test_a_reader_that_runs_too_long_is_stopped_and_the_next_call_still_works(reader: ReaderProcess) -> None:
    with pytest.raises(DocumentError, match="took longer than 3 s and was stopped"):
        reader.run(time.sleep, 600)
    assert reader.run(convert, b"a,b\n1,2\n", "t.csv") == convert(b"a,b\n1,2\n", "t.csv")


def test_a_reader_that_needs_more_memory_than_the_cap_fails_with_that_reason(reader: ReaderProcess) -> None:
    with pytest.raises(DocumentError, match="more than the reader's 512 MB"):
        reader.run(bytearray, 2 * 1024 * 1024 * 1024)
    assert reader.run(len, b"still alive") == 11


def test_a_document_reads_the_same_in_the_reader_process(isolate: bool, workspace: Path) -> None:
    pytest.importorskip("markitdown")
    # A fresh worker imports markitdown first: on a loaded machine that alone took over the 3 s the overrun tests
    # use, so this reader's time limit is a hang guard only.
    reader = ReaderProcess(ReaderLimits(memory_mb=512, timeout_s=120), isolate=isolate)
    try:
        _reads_the_same(reader, workspace)
    finally:
        reader.close()


def _reads_the_same(reader: ReaderProcess, workspace: Path) -> None:
    html = b"<html><body><h1>Minutes</h1><table><tr><th>role</th><th>name</th></tr>"
    html += b"<tr><td>Treasurer</td><td>Dana Whitfield</td></tr></table></body></html>"
    (workspace / "minutes.html").write_bytes(html)
    result = read_file_result(workspace, "minutes.html", reader=reader)
    assert "Dana Whitfield" in result.content[0].text
    assert result.content[0].text == read_file_result(workspace, "minutes.html").content[0].text


def test_read_file_says_why_when_the_reader_is_stopped(workspace: Path, isolate: bool) -> None:
    pytest.importorskip("markitdown")
    # A worker with too little memory to even load the PDF reader: the model reads one line, the server lives.
    starved = ReaderProcess(ReaderLimits(memory_mb=64, timeout_s=30), isolate=isolate)
    try:
        (workspace / "report.pdf").write_bytes(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n")
        with pytest.raises(
            ToolError,
            match=r"cannot read 'report\.pdf': (reading it needs more than|the pdf reader could not be loaded)",
        ):
            read_file_result(workspace, "report.pdf", reader=starved)
    finally:
        starved.close()
