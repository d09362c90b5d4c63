"""Document readers under bubblewrap, seen from the outside: what a worker can reach (no host folder, none of the
server's environment or processes, no network, nothing writable but its /tmp, no privilege), that real documents
read the same as in the fallback worker, and that timeouts, the memory cap, crashes and replies a hostile parser
forged end as one ``DocumentError`` with the server unharmed and the next call served.

``ReaderProcess.run`` sends functions by reference, so builtins travel: ``inside`` runs a few statements in a
worker with ``eval`` of an ``exec``. Tests that need the sandbox skip where bubblewrap cannot run here.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flowllm
from flowllm.tools.sandbox.execute import python_paths, sandbox_uid
from flowllm.tools.web import readerproc
from flowllm.tools.web.documents import DocumentError, Limits, convert
from flowllm.tools.web.readerproc import ReaderLimits, ReaderProcess, isolation_problem
from tests.tools.helpers import alive, descendants, needs_proc

pytestmark = pytest.mark.long

PROJECT = Path(__file__).resolve().parents[2]
CANARY = "sk-canary-reader-0123456789abcdef"
GENEROUS = ReaderLimits(memory_mb=1024, timeout_s=300)  # never reached by the calls it serves

needs_bwrap = pytest.mark.skipif(isolation_problem() is not None, reason=f"no reader sandbox: {isolation_problem()}")


def inside(reader: ReaderProcess, code: str) -> Any:
    """Run ``code`` (statements that set ``result``) in one of ``reader``'s workers and return ``result``."""
    return reader.run(eval, f"[exec({code!r}, g := {{}}), g.get('result')][1]")


def gone(pids: set[int]) -> bool:
    """Whether ``pids`` are all dead, waiting for it: a kill is immediate, the bound only keeps a failure finite."""
    deadline = time.monotonic() + 60
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pids)


@pytest.fixture
def isolated() -> Iterator[ReaderProcess]:
    process = ReaderProcess(GENEROUS)
    assert process.isolated, process.problem
    yield process
    process.close()


@pytest.fixture(params=[True, False], ids=["isolated", "fallback"])
def reader(request: pytest.FixtureRequest) -> Iterator[ReaderProcess]:
    if request.param and isolation_problem() is not None:
        pytest.skip(f"no reader sandbox: {isolation_problem()}")
    process = ReaderProcess(GENEROUS, isolate=request.param)
    yield process
    process.close()


@needs_bwrap
def test_a_worker_sees_no_host_folder_and_none_of_the_servers_environment(
    monkeypatch: pytest.MonkeyPatch, workspace: Path
) -> None:
    monkeypatch.setenv("FLOWLLM_TEST_CANARY", CANARY)
    (workspace / "notes.txt").write_text(CANARY)
    with tempfile.NamedTemporaryFile("w", prefix="flowllm-reader-host-", dir="/tmp") as host_file:
        host_file.write(CANARY)
        host_file.flush()
        places = [str(workspace), str(workspace / "notes.txt"), host_file.name, str(PROJECT / "pyproject.toml")]
        places += [str(PROJECT / "flowllm"), str(PROJECT / "tests")]
        reader = ReaderProcess(GENEROUS)  # made after the canary was set: the worker starts with it around
        try:
            seen = inside(
                reader,
                "import os, sys, flowllm.tools.web.documents as documents\n"
                f"result = {{'exists': {{p: os.path.exists(p) for p in {places!r}}}, 'env': dict(os.environ),\n"
                "          'cwd': os.getcwd(), 'documents': documents.__file__, 'path': sys.path,\n"
                f"          'project': os.listdir({str(PROJECT)!r}) if os.path.isdir({str(PROJECT)!r}) else []}}",
            )
        finally:
            reader.close()
    visible = [place for place, exists in seen["exists"].items() if exists and place != "/"]
    assert visible == [], f"host folders visible to a reader: {visible}"
    # Of the project, at most the folder of a virtualenv kept inside it (the Python install is bound read-only).
    python_inside = {Path(p).relative_to(PROJECT).parts[0] for p in python_paths() if Path(p).is_relative_to(PROJECT)}
    assert set(seen["project"]) <= python_inside, seen["project"]
    assert CANARY not in repr(seen["env"])
    assert set(seen["env"]) <= {
        *readerproc.child_env(readerproc.SANDBOX_HOME),
        "PYTHONPATH",
    }, "the worker's environment is the fixed allowlist"
    # flowllm is imported from its neutral folder, not from the project (an editable install points there).
    assert seen["documents"] == f"{readerproc.PACKAGE_ROOT_INSIDE}/flowllm/tools/web/documents.py"
    assert not any(str(PROJECT) == entry for entry in seen["path"])
    assert seen["cwd"] == readerproc.SANDBOX_HOME


@needs_bwrap
def test_a_worker_sees_no_process_of_the_server(isolated: ReaderProcess) -> None:
    seen = inside(
        isolated,
        "import os\n"
        "result = {p: open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace')\n"
        "          for p in os.listdir('/proc') if p.isdigit()}",
    )
    # bwrap's reaper and the worker itself: nothing of the server (its /proc/<pid>/environ holds the keys).
    assert len(seen) <= 2, seen
    assert not any("pytest" in cmdline for cmdline in seen.values()), seen


@needs_bwrap
def test_a_worker_has_no_network(isolated: ReaderProcess) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        seen = inside(
            isolated,
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=30).close()\n"
            "    outcome = 'connected'\n"
            "except OSError as exc:\n"
            "    outcome = type(exc).__name__\n"
            "result = [outcome, sorted(name for _, name in socket.if_nameindex())]",
        )
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert seen[0] != "connected"
    assert seen[1] == ["lo"], "only the namespace's own loopback"


@needs_bwrap
def test_a_worker_can_write_only_its_private_tmp(isolated: ReaderProcess) -> None:
    seen = inside(
        isolated,
        "import os, sys\n"
        "result = {}\n"
        "places = ['/planted', '/usr/planted', '/etc/planted', '/dev/planted', '/opt/flowllm/flowllm/planted',\n"
        "          sys.prefix + '/planted', os.path.dirname(os.__file__) + '/planted']\n"
        "for place in places:\n"
        "    try:\n"
        "        open(place, 'w').close()\n"
        "        result[place] = 'wrote'\n"
        "    except OSError as exc:\n"
        "        result[place] = type(exc).__name__\n"
        "with open('/tmp/scratch', 'w') as fh:\n"
        "    fh.write('fine')\n"
        "result['/tmp'] = open('/tmp/scratch').read()",
    )
    assert seen.pop("/tmp") == "fine"
    assert all(outcome != "wrote" for outcome in seen.values()), seen
    assert not Path("/tmp/scratch").exists() or Path("/tmp/scratch").read_text() != "fine"


@needs_bwrap
def test_a_worker_holds_no_privilege_and_its_limits(isolated: ReaderProcess) -> None:
    seen = inside(
        isolated,
        "import os, resource\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "result = {'uid': os.getuid(), 'groups': os.getgroups(), 'as': resource.getrlimit(resource.RLIMIT_AS),\n"
        "          'fsize': resource.getrlimit(resource.RLIMIT_FSIZE)[0],\n"
        "          'nproc': resource.getrlimit(resource.RLIMIT_NPROC)[0],\n"
        "          **{key: status[key].strip() for key in ('CapEff', 'CapPrm', 'CapInh', 'NoNewPrivs')}}",
    )
    assert seen["CapEff"] == seen["CapPrm"] == seen["CapInh"] == "0000000000000000"
    assert seen["NoNewPrivs"] == "1"
    assert seen["as"] == [GENEROUS.memory_mb * 1024 * 1024] * 2
    assert 0 < seen["fsize"] <= 1024 * 1024 * 1024
    if os.getuid() == 0:
        # Dropped to this server's sandbox uid, unless its Python install cannot be entered by another uid (the
        # worker then stays uid 0 inside its namespaces, with no capability: checked above).
        package = str(Path(flowllm.__file__).resolve().parent)
        if readerproc._unprivileged_can_import(package):
            assert seen["uid"] == sandbox_uid()
            assert seen["groups"] == []
            assert 0 < seen["nproc"] <= 1024
    else:
        assert seen["uid"] == os.getuid()  # mapped to itself in a user namespace of its own


def _docx() -> bytes:
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_heading("Minutes of the board", level=1)
    document.add_paragraph("The treasurer, Dana Whitfield, reported a surplus of 1,204 EUR.")
    table = document.add_table(rows=2, cols=2)
    for row, (role, name) in enumerate([("role", "name"), ("Secretary", "Åsa Lindqvist")]):
        table.cell(row, 0).text, table.cell(row, 1).text = role, name
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _xlsx() -> bytes:
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.Workbook()
    sheet = book.active
    for row in [("city", "population"), ("Zürich", 421878), ("Basel", 173863)]:
        sheet.append(row)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


@needs_bwrap
@pytest.mark.parametrize(
    ("name", "make", "expected"),
    [("minutes.docx", _docx, "Åsa Lindqvist"), ("cities.xlsx", _xlsx, "Zürich")],
    ids=["docx", "xlsx"],
)
def test_a_document_reads_the_same_isolated_as_in_the_fallback(
    isolated: ReaderProcess, name: str, make: Any, expected: str
) -> None:
    pytest.importorskip("markitdown")
    data = make()
    fallback = ReaderProcess(GENEROUS, isolate=False)
    try:
        plain = fallback.run(convert, data, name)
    finally:
        fallback.close()
    text = isolated.run(convert, data, name)
    assert expected in text
    assert text == plain == convert(data, name)


@needs_bwrap
def test_text_comes_back_exactly_and_a_large_document_goes_in(isolated: ReaderProcess) -> None:
    odd = "é — 漢字 \udcff\x00 end"  # a lone surrogate (undecodable bytes kept by surrogateescape) and a NUL
    assert isolated.run(str, odd) == odd
    assert isolated.run(len, b"x" * (48 * 1024 * 1024)) == 48 * 1024 * 1024


def test_errors_come_back_as_document_errors(reader: ReaderProcess) -> None:
    with pytest.raises(DocumentError, match="over the 3-byte limit"):
        reader.run(convert, b"abcd", "a.txt", limits=Limits(max_bytes=3))
    if reader.isolated:  # the fallback passes other exceptions through as they are
        with pytest.raises(DocumentError, match=r"the document reader failed on it \(ValueError: invalid literal"):
            reader.run(int, "twelve")
    assert reader.run(len, b"still here") == 10


def test_a_crash_is_a_document_error_and_the_next_call_gets_a_fresh_worker(reader: ReaderProcess) -> None:
    with pytest.raises(DocumentError, match="the document reader crashed on it"):
        reader.run(os._exit, 3)
    assert reader.run(len, b"again") == 5


@needs_bwrap
@needs_proc
def test_a_call_over_its_budget_kills_the_workers_whole_tree() -> None:
    others = descendants()  # e.g. multiprocessing's forkserver, which the fallback's tests leave running
    reader = ReaderProcess(ReaderLimits(memory_mb=1024, timeout_s=5))
    try:
        inside(reader, "open('/tmp/mark', 'w').close()")
        before = descendants() - others  # bwrap and everything inside the worker's PID namespace
        assert before
        with pytest.raises(DocumentError, match="took longer than 5 s and was stopped"):
            reader.run(time.sleep, 600)
        assert gone(before), f"left running after the timeout: {alive(before)}"
        # The next call is served by a fresh worker: the private /tmp of the killed one is gone with it.
        assert inside(reader, "import os; result = os.path.exists('/tmp/mark')") is False
    finally:
        reader.close()


@needs_bwrap
@needs_proc
def test_close_kills_the_workers_and_what_they_started() -> None:
    others = descendants()  # e.g. multiprocessing's forkserver, which the fallback's tests leave running
    reader = ReaderProcess(GENEROUS, workers=2)
    marker = str(10**8 + uuid.uuid4().int % 10**8)  # `sleep <marker>`: a process a parser left behind
    inside(reader, f"import subprocess; subprocess.Popen(['sleep', '{marker}']); result = 1")
    # Popen returns once exec began; /proc shows the new command line a moment later.
    deadline = time.monotonic() + 60
    while not any(_cmdline(pid) == ["sleep", marker] for pid in descendants()) and time.monotonic() < deadline:
        time.sleep(0.02)
    started = descendants() - others
    assert any(_cmdline(pid) == ["sleep", marker] for pid in started)
    reader.close()
    assert gone(started), f"left running after close(): {alive(started)}"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def test_the_memory_cap_holds(reader: ReaderProcess) -> None:
    with pytest.raises(DocumentError, match="more than the reader's 1,024 MB"):
        reader.run(bytearray, 3 * 1024 * 1024 * 1024)
    assert reader.run(len, b"still alive") == 11


# What a compromised parser could write on the reply pipe before the worker's own reply: a frame of bytes that
# is not JSON, a length no reply may have, JSON that is no reply the worker sends. The worker finds the pipe
# among its descriptors (the request pipe refuses the write).
FORGED = {
    "not-json": "(7).to_bytes(8, 'big') + b'garbage'",
    "huge-length": "(1 << 62).to_bytes(8, 'big')",
    "wrong-shape": "(len(b'{\"error\": 7}')).to_bytes(8, 'big') + b'{\"error\": 7}'",
    "not-utf8": "(4).to_bytes(8, 'big') + b'\"\\xff\\xfe\"'",
}


@needs_bwrap
@pytest.mark.parametrize("forged", FORGED.values(), ids=list(FORGED))
def test_a_forged_reply_is_a_document_error_not_a_crash_of_the_server(isolated: ReaderProcess, forged: str) -> None:
    code = (
        "import os, stat\n"
        "for fd in range(3, 256):\n"
        "    try:\n"
        "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        f"            os.write(fd, {forged})\n"
        "    except OSError:\n"
        "        pass\n"
    )
    with pytest.raises(DocumentError, match="sent back a reply that is not valid"):
        inside(isolated, code)
    assert isolated.run(len, b"served") == 6


@needs_bwrap
def test_a_worker_outlives_the_thread_that_started_it(isolated: ReaderProcess) -> None:
    # bwrap dies with the *thread* that started it (--die-with-parent): a server's worker threads come and go.
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(inside(isolated, "open('/tmp/mark', 'w').close()")))
    thread.start()
    thread.join()
    assert done == [None]
    # The same, warm worker; the pause gives a kill at the thread's end time to land before the answer.
    assert inside(isolated, "import os, time; time.sleep(1); result = os.path.exists('/tmp/mark')") is True


def test_the_servers_say_once_when_readers_are_not_isolated(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(readerproc, "_warned", False)
    plain = ReaderProcess(isolate=False)
    assert plain.isolated is False
    plain.warn_if_not_isolated("tool-files")
    plain.warn_if_not_isolated("tool-files")
    err = capsys.readouterr().err
    assert err.count("tool-files: document readers run without a sandbox (isolation was switched off)") == 1
    if isolation_problem() is None:
        monkeypatch.setattr(readerproc, "_warned", False)
        ReaderProcess().warn_if_not_isolated("tool-browse")
        assert capsys.readouterr().err == ""


def test_isolated_says_what_is_used() -> None:
    assert ReaderProcess().isolated is (sys.platform.startswith("linux") and isolation_problem() is None)
