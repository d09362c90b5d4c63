"""``python -m flowllm.inspect``'s commands are the ones its registries hold, and its usage text names each."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowllm.inspect.cli import RUN_COMMANDS, TOOL_COMMANDS, main


def test_the_usage_text_names_every_registered_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert all(f"flowllm.inspect {name} " in usage for name in TOOL_COMMANDS)
    # summary is the default: the bare ``RUN_DIR`` line names it
    assert all(f"RUN_DIR {name} " in usage or f" {name}: " in usage for name in RUN_COMMANDS)


def test_every_run_command_is_offered_by_the_run_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["some-run", "--help"])
    assert exit_.value.code == 0
    offered = capsys.readouterr().out
    assert all(name in offered for name in RUN_COMMANDS)


def test_an_unknown_command_on_a_run_is_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path), "no-such-command"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
