"""``flowllm bundle RUN -o FILE [--with-answers]`` and ``flowllm verify FILE [--dataset PATH]
[--dataset-changed-ok]``: ``verify`` given a file checks a bundle; given a folder it is the run auditor
(flowllm/verify/cli.py), unchanged.

Exit status of a bundle's check: 0 every number reproduced, 6 something did not (the manifest's first mismatch,
or the first task and turn that did not replay, with the file), 2 bad input (not a bundle, truncated, newer,
a dataset that differs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flowllm.bundle.check import check_bundle
from flowllm.bundle.make import make_bundle
from flowllm.errors import CliError
from flowllm.exit_codes import ExitCode
from flowllm.rundir.store import local_run
from flowllm.verify.cli import main as audit_main

__all__ = ["bundle_main", "verify_main"]

SHOWN_PROBLEMS = 20  # the first problems of a run that did not reproduce; the rest are counted


def _bundle_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowllm bundle",
        description="Write a run (or each job of a sweep) into one archive anyone can check offline with "
        "flowllm verify FILE: the config as it ran, every node's input and output, the ledgers, the web cache; "
        "no key, no ground truth (each task's answer hash instead) unless --with-answers.",
    )
    parser.add_argument("run", help="a run folder or a sweep folder, or a run kept in a store (experiment.store URL)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the bundle file to write")
    parser.add_argument(
        "--with-answers", action="store_true", help="keep the ground truth (only for a dataset you may publish)"
    )
    return parser


def bundle_main(argv: Sequence[str] | None = None) -> int:
    args = _bundle_parser().parse_args(argv)
    try:
        manifest = make_bundle(local_run(args.run), args.output, with_answers=args.with_answers)
    except CliError as exc:  # BundleInputError, or a run record that is no record (RecordFormatError)
        print(f"flowllm bundle: error: {exc}", file=sys.stderr)
        return exc.exit_code
    answers = "with answers" if manifest.with_answers else "no answers (their hashes instead)"
    print(
        f"flowllm bundle: wrote {args.output}: {len(manifest.jobs)} run(s), {len(manifest.files)} files, "
        f"{manifest.compression}, {answers}"
    )
    return ExitCode.OK


def _verify_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowllm verify",
        description="Check a bundle: its manifest, then replay each run offline from its saved replies, score "
        "every answer again and recompute every statistic. Writes only to a temporary folder.",
    )
    parser.add_argument("bundle", type=Path, help="a bundle written by flowllm bundle")
    parser.add_argument("--dataset", type=Path, help="the dataset to score against (default: the run's own)")
    parser.add_argument(
        "--dataset-changed-ok", action="store_true", help="verify even when the dataset's files differ from the run's"
    )
    return parser


def _check(args: argparse.Namespace) -> int:
    head = f"flowllm verify: {args.bundle}"
    tampered, checks = check_bundle(args.bundle, dataset=args.dataset, dataset_changed_ok=args.dataset_changed_ok)
    if tampered:
        print(f"{head}: NOT reproduced: the bundle does not match its manifest (first: {tampered[0]})")
        print("\n".join(f"  {line}" for line in tampered[:SHOWN_PROBLEMS]))
        return ExitCode.UNVERIFIED
    for check in checks:
        name = f"{head} [{check.name}]" if len(checks) > 1 else head
        if check.reproduced:
            print(f"{name}: {check.line}")
        else:
            print(f"{name}: NOT reproduced: {check.problems[0]}")
            print("\n".join(f"  {line}" for line in check.problems[1:SHOWN_PROBLEMS]))
            if len(check.problems) > SHOWN_PROBLEMS:
                print(f"  ... and {len(check.problems) - SHOWN_PROBLEMS} more")
        print("\n".join(f"  note: {note}" for note in check.notes), end="\n" if check.notes else "")
    return ExitCode.OK if all(c.reproduced for c in checks) else ExitCode.UNVERIFIED


def verify_main(argv: Sequence[str] | None = None) -> int:
    """``flowllm verify``: a file is a bundle to check, anything else goes to the run auditor."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    target = next((a for a in args_in if not a.startswith("-")), None)
    if target is None or not Path(target).is_file():
        return audit_main(args_in)
    args = _verify_parser().parse_args(args_in)
    try:
        return _check(args)
    except CliError as exc:  # BundleInputError, or a bundled record that is no record (RecordFormatError)
        print(f"flowllm verify: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(verify_main())
