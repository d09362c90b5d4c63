"""``python -m flowllm.emulator --script F [--port N]``: serve a script by hand (e.g. for curl or an IDE)."""

from __future__ import annotations

import argparse
import threading

from flowllm.emulator.server import Emulator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flowllm.emulator", description=__doc__)
    parser.add_argument("--script", required=True, help="the YAML script file")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    args = parser.parse_args(argv)
    emulator = Emulator(args.script, port=args.port)
    emulator.start()
    print(
        f"flowllm emulator on {emulator.base_url}  (Anthropic: {emulator.base_url}, "
        f"OpenAI: {emulator.openai_base_url}); Ctrl-C stops it",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
