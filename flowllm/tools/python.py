"""``tool-python``: an MCP server (stdio) with one tool, ``run_python(code)``.

Run it as ``python -m flowllm.tools.python [--workspace DIR] [--timeout-s 30] [--memory-mb 2048]
[--allow-network]``. Each call runs the code in a fresh interpreter inside the task's folder under the limits
of ``flowllm.tools.sandbox.execute``; nothing is kept between calls except the files the code writes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent

from flowllm.core.scratch import scratch as scratch_folder
from flowllm.core.types import InfraCause
from flowllm.tools.common import add_workspace_argument, workspace_from
from flowllm.tools.needs import infra_meta
from flowllm.tools.sandbox.call import REFUSED_EXIT, Isolation, SandboxBackend, SandboxLimits
from flowllm.tools.sandbox.execute import run_python_code
from flowllm.tools.sandbox.hardening import protect_process
from flowllm.tools.sandbox.isolation import describe_gaps
from flowllm.tools.taskfolder import TaskFolders, asks_for_workspace

if TYPE_CHECKING:
    from flowllm.tools.client.settings import ServerSpec

SERVER_NAME = "tool-python"
SERVER_MODULE = "flowllm.tools.python"  # what a tools config's server entry runs: python -m flowllm.tools.python


def _description(limits: SandboxLimits) -> str:
    network = "Network access is allowed." if limits.allow_network else "There is no network access."
    memory = f"{limits.memory_mb} MB of memory" if limits.memory_mb else "no memory limit"
    return (
        "Run Python 3 code in a fresh interpreter and return what it prints (stdout, then stderr).\n"
        "The working directory is the task's folder: the task's files are there and can be opened by their "
        "relative name (e.g. open('data.csv')); files you write there persist for later calls, variables do "
        "not (each call starts a new process, so re-import and recompute what you need).\n"
        f"Limits: {limits.timeout_s:g} seconds wall clock, {memory}. {network} "
        "Only print() output is returned: print the values you need, and keep it short (long output is cut)."
    )


def probe_gaps(limits: SandboxLimits | None = None) -> list[str]:
    """What this machine's sandbox cannot isolate (empty: everything holds), found by running a statement in it.

    The run calls it once before the first task so the user reads the gaps on the console and in
    ``summary.json`` (``tools.sandbox_gaps``), not only in a server's own log.
    """
    limits = limits or SandboxLimits(timeout_s=30.0)
    with scratch_folder("flowllm-probe-") as folder:
        result = asyncio.run(run_python_code("pass", folder, limits))
    return list(result.gaps or [])


def build_server(workspace: Path | None, limits: SandboxLimits) -> MCPServer:
    """The ``tool-python`` server (also handy in-process in tests). ``workspace``: the folder of the task it serves;
    ``None`` for a server shared by a run, whose calls each name their task's folder (``flowllm.tools.taskfolder``).
    Each call runs in a process of its own, so one server can run many tasks' code at once."""
    server = MCPServer(SERVER_NAME, instructions="Runs Python code inside the task's folder.", log_level="WARNING")
    folders = TaskFolders(SERVER_NAME, workspace)
    warned: list[str] = []  # the gaps already reported: say it once per server, not once per call

    async def run_python(code: str, ctx: Context) -> CallToolResult:
        if not code.strip():
            return CallToolResult(
                content=[TextContent(type="text", text="Error: 'code' is empty; pass the Python source to run.")],
                is_error=True,
            )
        result = await run_python_code(code, folders.for_call(ctx), limits)
        if result.gaps and not warned:
            warned.extend(result.gaps)
            print(f"tool-python: weaker sandbox on this machine: {describe_gaps(result.gaps)}", file=sys.stderr)
        # A failing script is still a successful tool call, but flagging it lets the model (and the recorder)
        # see at a glance that the code did not do what it meant.
        # Code refused for want of the isolation required here is the machine's failure, not the model's.
        refused = result.exit_code == REFUSED_EXIT and bool(result.gaps)
        return CallToolResult(
            content=[TextContent(type="text", text=result.render())],
            is_error=not result.ok,
            _meta=infra_meta(InfraCause.SANDBOX) if refused else None,
        )

    server.add_tool(run_python, name="run_python", description=_description(limits), meta=asks_for_workspace())
    return server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flowllm.tools.python", description=__doc__)
    add_workspace_argument(parser)
    defaults = SandboxLimits()
    parser.add_argument("--timeout-s", type=float, default=defaults.timeout_s, help="wall-clock limit per call")
    parser.add_argument("--memory-mb", type=int, default=defaults.memory_mb, help="address-space limit; 0: none")
    parser.add_argument("--max-file-mb", type=int, default=defaults.max_file_mb, help="largest file it may write")
    parser.add_argument("--max-output-chars", type=int, default=defaults.max_stdout_chars, help="stdout kept")
    parser.add_argument("--max-workspace-mb", type=int, default=defaults.max_workspace_mb, help="folder cap")
    parser.add_argument("--max-processes", type=int, default=defaults.max_processes, help="processes+threads")
    parser.add_argument("--allow-network", action="store_true", help="let the code use the network")
    parser.add_argument(
        "--isolation",
        choices=[i.value for i in Isolation],
        default=defaults.isolation.value,
        help="required: refuse to run code where the machine cannot isolate it fully",
    )
    parser.add_argument(
        "--sandbox-backend",
        choices=[b.value for b in SandboxBackend],
        default=defaults.backend.value,
        help="auto: own namespaces as root, else bubblewrap (bwrap) where it works; bwrap: bubblewrap always",
    )
    return parser


def server_arguments(spec: ServerSpec) -> list[str] | None:
    """The arguments ``spec`` gives this server (after ``-m flowllm.tools.python``); None when ``spec`` starts
    another server."""
    args = list(spec.args)
    if spec.remote or SERVER_MODULE not in args:
        return None
    return args[args.index(SERVER_MODULE) + 1 :]


def limits_from_args(argv: list[str]) -> SandboxLimits:
    """The limits a server started with these arguments applies (``python -m flowllm.tools.python ARGS``): the
    run probes the sandbox the server will really use. Raises ``SystemExit`` for arguments it refuses."""
    return _limits(_parser().parse_args(argv))


def _limits(args: argparse.Namespace) -> SandboxLimits:
    return SandboxLimits(
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
        max_file_mb=args.max_file_mb,
        max_workspace_mb=args.max_workspace_mb,
        max_processes=args.max_processes,
        allow_network=args.allow_network,
        isolation=Isolation(args.isolation),
        backend=SandboxBackend(args.sandbox_backend),
        max_stdout_chars=args.max_output_chars,
    )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    limits = _limits(args)
    protect_process()
    build_server(workspace_from(args.workspace), limits).run()


if __name__ == "__main__":
    main()
