"""``python -m flowllm``: the Hydra application (flowllm.cli.run; the run itself is flowllm.app)."""

import sys

from flowllm.cli.run import run_main


def main() -> None:
    """Kept for console scripts installed before ``flowllm`` got subcommands (flowllm.cli.command)."""
    from flowllm.cli.command import console_main

    console_main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["verify"]:  # python -m flowllm verify RUN|FILE = flowllm verify (auditor, or a bundle)
        from flowllm.bundle.cli import verify_main

        sys.exit(verify_main(sys.argv[2:]))
    if sys.argv[1:2] == ["bundle"]:  # python -m flowllm bundle RUN -o FILE = flowllm bundle
        from flowllm.bundle.cli import bundle_main

        sys.exit(bundle_main(sys.argv[2:]))
    if sys.argv[1:2] == ["merge"]:  # python -m flowllm merge SHARD... -o RUN = flowllm merge (flowllm/cli/merge.py)
        from flowllm.cli.merge import main as merge_main

        sys.exit(merge_main(sys.argv[2:]))
    if sys.argv[1:2] == ["ctl"]:  # python -m flowllm ctl RUN CMD = flowllm ctl RUN CMD (steer a running run)
        from flowllm.cli.ctl import main as ctl_main

        sys.exit(ctl_main(sys.argv[2:]))
    sys.exit(run_main())
