"""The ``flowllm`` console command: one entry point for running, inspecting and listing.

    flowllm run [OVERRIDES...]          = python -m flowllm [OVERRIDES...] (also: flowllm OVERRIDES...)
    flowllm inspect RUN [...]           = python -m flowllm.inspect RUN [...]
    flowllm list providers|experiments|tools|pipelines|repair|runners|subagents|launchers
    flowllm sweep-summary SWEEP_DIR     = python -m flowllm.sweep.summary SWEEP_DIR
    flowllm verify RUN [--json]         the run auditor (flowllm/verify): every number checked against evidence
    flowllm bundle RUN -o FILE          a run as one archive anyone can check offline: flowllm verify FILE
    flowllm merge SHARD... -o RUN       shard folders (experiment.shard=I/N) merged into one run
    flowllm ctl RUN CMD [ARG]           steer a running run: status, pause, resume, drain, stop, set, requeue

``flowllm --help`` lists the config groups and their choices without the ``base_*`` schemas (which are no
choice) and the exit codes; ``flowllm run --hydra-help`` is Hydra's own page.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from flowllm.cli.listing import LISTS, describe, group_options, help_text
from flowllm.exit_codes import ExitCode


def cmd_list(args: Sequence[str]) -> int:
    if not args or args[0] not in LISTS:
        print(f"flowllm: error: list what? one of {', '.join(LISTS)}", file=sys.stderr)
        return ExitCode.CONFIG
    group = LISTS[args[0]]
    for name in group_options(group):
        about = describe(group, name)
        print(f"{name:<20} {about}" if about else name)
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        sys.stdout.write(help_text())
        return ExitCode.OK
    if args and args[0] == "list":
        return cmd_list(args[1:])
    if args and args[0] == "inspect":
        from flowllm.inspect.cli import main as inspect_main

        return inspect_main(args[1:])
    if args and args[0] == "verify":  # a folder: the run auditor; a file: a bundle (flowllm/bundle)
        from flowllm.bundle.cli import verify_main

        return verify_main(args[1:])
    if args and args[0] == "bundle":
        from flowllm.bundle.cli import bundle_main

        return bundle_main(args[1:])
    if args and args[0] == "merge":
        from flowllm.cli.merge import main as merge_main

        return merge_main(args[1:])
    if args and args[0] == "ctl":
        from flowllm.cli.ctl import main as ctl_main

        return ctl_main(args[1:])
    if args and args[0] == "sweep-summary":
        from flowllm.sweep.summary import main as sweep_main

        return sweep_main(args[1:])
    from flowllm.cli.run import run_main

    return run_main(args[1:] if args and args[0] == "run" else args)


def console_main() -> None:
    """The ``flowllm`` console script (pyproject's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
