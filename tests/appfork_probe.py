"""``python -m tests.appfork_probe``: what tests/test_appfork.py runs through the zygote. It prints where and how it
was started, then does what its first argument says: ``exit N``, ``sleep``, ``echo`` (its stdin to stdout),
``atexit`` (a handler prints at exit), ``interrupt`` (an uncaught Ctrl-C) or ``raise`` (an uncaught error)."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

if __name__ == "__main__":
    command = sys.argv[1]
    print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "probe": os.environ.get("PROBE"), "pid": os.getpid()}))
    print("to stderr", file=sys.stderr)
    sys.stdout.flush()
    if command == "sleep":
        time.sleep(60)
    elif command == "echo":
        sys.stdout.write(sys.stdin.read())
    elif command == "atexit":
        atexit.register(print, "handler ran")
    elif command == "interrupt":
        raise KeyboardInterrupt
    elif command == "raise":
        raise RuntimeError("probe failed")
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
