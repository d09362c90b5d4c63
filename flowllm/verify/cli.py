"""``flowllm verify RUN [--json] [--dataset PATH] [--export FILE...]``: audit a run (or each job of a sweep).

Exit status: 0 every number agrees with the evidence, 6 a disagreement was found (one line each, naming the
file, the field and both values), 2 what was given is not a run or a file in it does not parse.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from flowllm.errors import CliError
from flowllm.exit_codes import ExitCode
from flowllm.rundir.store import local_run
from flowllm.verify.audit import audit_path
from flowllm.verify.findings import Audit

__all__ = ["main"]

PROG = "flowllm verify"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Recompute every derived number of a run from its evidence (the saved wire replies, the "
        "dataset, the config as it ran, the price table) and name each disagreement. Writes nothing.",
    )
    parser.add_argument("run", help="a run folder, a sweep folder (each job is audited), or a store's URL")
    parser.add_argument("--json", action="store_true", help="the audit as JSON on stdout")
    parser.add_argument("--dataset", type=Path, help="the dataset to score against (default: the run's own)")
    parser.add_argument(
        "--export",
        type=Path,
        action="append",
        default=[],
        help="an export of the run to compare with it: an Inspect AI log (.eval) or a GAIA submission (.jsonl)",
    )
    return parser


def _text(audit: Audit) -> list[str]:
    head = f"{PROG}: {audit.run_dir}: "
    if audit.verified:
        lines = [head + f"verified ({audit.compared} values agree with the evidence)"]
    else:
        count = len(audit.findings)
        lines = [head + f"NOT verified: {count} disagreement{'s' if count != 1 else ''}"]
        lines += [f"  {finding.line()}" for finding in audit.findings]
    lines += [f"  not checked: {why}" for why in audit.not_checked]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        audits = audit_path(local_run(args.run), dataset=args.dataset, exports=args.export)
    except CliError as exc:  # VerifyInputError, or a store's URL that cannot be read
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        body = audits[0].to_dict() if len(audits) == 1 else {"jobs": [a.to_dict() for a in audits]}
        sys.stdout.write(json.dumps(body, indent=2, default=str) + "\n")
    else:
        for audit in audits:
            sys.stdout.write("\n".join(_text(audit)) + "\n")
    return ExitCode.OK if all(a.verified for a in audits) else ExitCode.UNVERIFIED


if __name__ == "__main__":
    sys.exit(main())
