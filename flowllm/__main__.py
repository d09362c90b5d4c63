"""``python -m flowllm``: the Hydra application (flowllm.cli.run; the run itself is flowllm.app)."""

import sys

from flowllm.cli.run import run_main

if __name__ == "__main__":
    sys.exit(run_main())
