"""``python -m tests.appfork_probe``: what tests/test_appfork.py runs through the zygote. It prints where and how it
was started, then exits with the code it was given, or sleeps when asked to."""

from __future__ import annotations

import json
import os
import sys
import time

if __name__ == "__main__":
    command = sys.argv[1]
    print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "probe": os.environ.get("PROBE"), "pid": os.getpid()}))
    print("to stderr", file=sys.stderr)
    if command == "sleep":
        time.sleep(60)
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
