"""``tool-math``: an MCP server (stdio) with one tool, ``calculate(expression)``.

Run it as ``python -m flowllm.tools.math``. The evaluation itself is in ``flowllm.tools.calculator`` (no
``eval``: a whitelisted syntax tree). This module never imports the standard library's ``math`` by a relative
name, and nothing puts this package's folder on ``sys.path``, so its name cannot shadow the standard module.
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from flowllm.tools.calculator import CONSTANTS, FUNCTIONS, CalculationError, calculate

SERVER_NAME = "tool-math"

DESCRIPTION = (
    "Evaluate an arithmetic expression exactly and safely, "
    "e.g. '(17.5 - 3) * 12 / 7' or 'sqrt(2) * log(100, 10)'.\n"
    "Operators: + - * / // % ** (power is **, not ^), comparisons, parentheses. Integers are exact "
    "(arbitrary size up to about 4,000 digits); decimals are 64-bit floats.\n"
    f"Functions: {', '.join(sorted(FUNCTIONS))}. Constants: {', '.join(CONSTANTS)}. "
    "Trigonometry uses radians; log(x) is natural, log(x, base) any base."
)


def build_server() -> MCPServer:
    server = MCPServer(SERVER_NAME, instructions="A safe calculator.", log_level="WARNING")

    def calculate_tool(expression: str) -> str:
        try:
            return calculate(expression)
        except CalculationError as exc:
            # ToolError reaches the model as an is_error result carrying this message.
            raise ToolError(f"cannot calculate {expression!r}: {exc}") from None

    server.add_tool(calculate_tool, name="calculate", description=DESCRIPTION, structured_output=False)
    return server


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m flowllm.tools.math", description=__doc__).parse_args(argv)
    build_server().run()


if __name__ == "__main__":
    main()
