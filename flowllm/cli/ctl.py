"""``flowllm ctl RUN CMD [ARG]`` (also ``python -m flowllm ctl``): a command to a running run, answered.

    flowllm ctl RUN status                               what the run is doing
    flowllm ctl RUN pause | resume                       no new turn starts / turns start again
    flowllm ctl RUN drain                                no new task starts; running ones finish
    flowllm ctl RUN stop                                 as Ctrl-C
    flowllm ctl RUN set experiment.max_concurrent=N      also experiment.budget.cost_usd=X
    flowllm ctl RUN requeue TASK                         a failed task runs again at the end

The command goes through the run folder's ``.control/`` (flowllm/rundir/control.py); the answer is printed
(``--json``: as JSON) and the command is logged in the run's ``history.jsonl``. Exit 0 when the run did it, 2
when it refused, when the folder has no running run, or when no answer came in ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from flowllm.exit_codes import ExitCode
from flowllm.rundir.control import (
    ControlPaths,
    CtlAnswer,
    CtlRequest,
    logged_answer,
    read_driver,
    read_record,
    save,
)

POLL_S = 0.05


def _error(message: str) -> int:
    print(f"flowllm: error: {message}", file=sys.stderr)
    return ExitCode.CONFIG


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowllm ctl", description="Steer a running run.")
    parser.add_argument("run", help="the run's folder (its hydra.run.dir)")
    parser.add_argument("command", help="status, pause, resume, drain, stop, set KEY=VALUE, requeue TASK")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    return parser


def wait_answer(paths: ControlPaths, request: CtlRequest, timeout_s: float) -> CtlAnswer | None:
    """The run's answer, or None when none came in time (or the run ended first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = read_record(paths.answer(request.id))
        if data is not None:
            paths.answer(request.id).unlink(missing_ok=True)
            return CtlAnswer.from_dict(data)
        driver = read_driver(paths)
        if driver is None or not driver.alive():
            return logged_answer(paths, request.id)  # answered, then the run ended and took its channel along
        time.sleep(POLL_S)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    run_dir = Path(args.run)
    paths = ControlPaths(run_dir)
    driver = read_driver(paths)
    if driver is None or not driver.alive():
        return _error(f"no run is running in {run_dir} (no live control channel in {paths.folder})")
    request = CtlRequest.new(args.command, list(args.args))
    try:
        save(paths.request(request.id), request)
    except PermissionError:
        return _error(f"refused: the run in {run_dir} belongs to another user (its .control/ is theirs alone)")
    except OSError as exc:
        return _error(f"cannot write to the run's control channel: {exc.strerror or exc}")
    answer = wait_answer(paths, request, args.timeout)
    if answer is None:
        paths.request(request.id).unlink(missing_ok=True)
        return _error(f"no answer from the run in {run_dir} within {args.timeout:g}s (has it ended?)")
    if args.json:
        print(orjson.dumps({"ok": answer.ok, "message": answer.message, **answer.data}).decode())
    elif answer.ok:
        print(answer.message)
    else:
        print(f"flowllm: error: {answer.message}", file=sys.stderr)
    return ExitCode.OK if answer.ok else ExitCode.CONFIG


if __name__ == "__main__":
    sys.exit(main())
