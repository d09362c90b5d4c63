"""``python -m flowllm.inspect``: see ``flowllm.inspect.cli``."""

import sys

from flowllm.inspect.cli import main

sys.exit(main())
