"""run_python's sandbox: limits, output capture, path scrubbing, and no process left behind."""

from __future__ import annotations

import os
from pathlib import Path

from flowllm.tools.sandbox.execute import SandboxLimits, run_python_code
from tests.tools.helpers import alive, descendants, needs_proc


async def test_runs_in_the_workspace_and_shows_paths_relative_to_it(workspace: Path) -> None:
    (workspace / "data.txt").write_text("42\n")
    result = await run_python_code(
        "import os\nprint(os.getcwd())\nprint(open('data.txt').read().strip())\nprint(os.path.abspath('o.csv'))",
        workspace,
    )
    assert result.ok
    assert result.render() == ".\n42\n./o.csv"


async def test_files_written_persist_for_later_calls(workspace: Path) -> None:
    await run_python_code("open('note.txt', 'w').write('kept')", workspace)
    assert (workspace / "note.txt").read_text() == "kept"
    again = await run_python_code("print(open('note.txt').read())", workspace)
    assert again.render() == "kept"


async def test_an_exception_shows_a_traceback_of_the_users_code_only(workspace: Path) -> None:
    result = await run_python_code("x = 1\ny = x / 0\n", workspace)
    text = result.render()
    assert not result.ok and result.exit_code == 1
    assert 'File "<run_python>", line 2, in <module>' in text
    assert "y = x / 0" in text  # the source line is shown
    assert "ZeroDivisionError: division by zero" in text
    assert "_main" not in text and "exec(" not in text  # the bootstrap frame is hidden
    assert text.endswith("[exit status 1]")


async def test_an_error_path_inside_the_workspace_is_scrubbed(workspace: Path) -> None:
    result = await run_python_code("import os\nopen(os.path.abspath('missing.csv'))", workspace)
    text = result.render()
    assert "No such file or directory: './missing.csv'" in text
    assert str(workspace) not in text and os.path.realpath(workspace) not in text


async def test_a_syntax_error_is_reported_with_its_line(workspace: Path) -> None:
    result = await run_python_code("def f(:\n    pass\n", workspace)
    assert not result.ok
    assert "SyntaxError" in result.stderr and '"<run_python>", line 1' in result.stderr


async def test_the_wall_clock_limit_stops_a_loop_and_keeps_what_it_printed(workspace: Path) -> None:
    result = await run_python_code(
        "print('started', flush=True)\nwhile True:\n    pass\n", workspace, SandboxLimits(timeout_s=1)
    )
    assert result.timed_out and not result.ok
    assert result.render().startswith("started\n[timed out: the code was still running after 1 s")


async def test_the_memory_limit_turns_a_huge_allocation_into_a_clear_error(workspace: Path) -> None:
    result = await run_python_code("block = bytearray(4 * 1024 ** 3)\n", workspace, SandboxLimits(memory_mb=512))
    assert not result.ok
    assert "MemoryError" in result.stderr
    assert "the limit is 512 MB" in result.render()


async def test_there_is_no_network_by_default(workspace: Path) -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 9), timeout=2)\n"
        "except OSError as exc:\n"
        "    print('refused:', type(exc).__name__)\n"
    )
    result = await run_python_code(code, workspace)
    assert result.render().startswith("refused: ")


async def test_a_50_mb_print_is_cut_to_head_and_tail_with_a_note(workspace: Path) -> None:
    limits = SandboxLimits(max_stdout_chars=3000)
    result = await run_python_code("print('A' * 25_000_000 + 'B' * 25_000_000)", workspace, limits)
    assert result.ok
    assert result.stdout.startswith("A" * 2000)
    assert result.stdout.rstrip().endswith("B" * 999)
    assert "bytes of output cut" in result.stdout
    assert result.stdout_cut == 50_000_001 - 3000
    assert len(result.render()) < 3200


async def test_the_same_code_prints_the_same_thing_every_time(workspace: Path) -> None:
    code = "print(hash('flowllm'), sorted({'b', 'a'}), list({'x', 'y', 'z'}))"
    first = await run_python_code(code, workspace)
    second = await run_python_code(code, workspace)
    assert first.render() == second.render()


async def test_files_in_the_workspace_do_not_hijack_the_sandbox(workspace: Path) -> None:
    # A task attachment named like a module the bootstrap uses must not break the run...
    (workspace / "socket.py").write_text("raise SystemExit('hijacked')\n")
    (workspace / "helper.py").write_text("VALUE = 7\n")
    result = await run_python_code("import helper\nprint(helper.VALUE)", workspace)
    # ...while the task's own modules stay importable, as with `python script.py`.
    assert result.render() == "7"


async def test_input_reads_end_of_file_instead_of_hanging(workspace: Path) -> None:
    result = await run_python_code("print(input())", workspace, SandboxLimits(timeout_s=10))
    assert not result.timed_out and "EOFError" in result.stderr


async def test_exit_status_and_empty_output_are_explained(workspace: Path) -> None:
    assert (await run_python_code("import sys; sys.exit(3)", workspace)).render() == "[exit status 3]"
    assert "no output" in (await run_python_code("x = 1", workspace)).render()


@needs_proc
async def test_background_children_do_not_outlive_the_call(workspace: Path) -> None:
    before = descendants()
    code = "import subprocess\np = subprocess.Popen(['sleep', '60'])\nprint(p.pid)"
    result = await run_python_code(code, workspace)
    assert result.ok
    # The printed pid may be one of the sandbox's own PID namespace: look from here instead.
    assert alive(descendants() - before) == set()


@needs_proc
async def test_a_timed_out_run_leaves_no_process(workspace: Path) -> None:
    before = descendants()
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '60'])\ntime.sleep(60)"
    result = await run_python_code(code, workspace, SandboxLimits(timeout_s=0.5))
    assert result.timed_out
    assert alive(descendants() - before) == set()
