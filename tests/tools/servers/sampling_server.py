"""A real MCP stdio server whose tool asks the client's model (``sampling/createMessage``), for the sampling tests.

Run as a script (``python sampling_server.py``); it needs only ``mcp``. ``ask`` sends the question (and, when
``image_path`` names a file relative to the task's folder, that image before it) with a system prompt and a token
limit, and returns what the client answered, or the message of the error the client sent back, as text.
"""

from __future__ import annotations

import base64
import os
import warnings
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import ImageContent, SamplingMessage, TextContent

warnings.simplefilter("ignore")  # sampling is deprecated in the newest protocol revision; the test still needs it

server = MCPServer("sampler", log_level="WARNING")


@server.tool()
async def ask(question: str, ctx: Context, image_path: str = "", max_tokens: int = 64) -> str:
    """Ask the client's model a question (optionally about an image file) and return its answer."""
    content: list[TextContent | ImageContent] = []
    if image_path:
        path = Path(os.environ.get("FLOWLLM_WORKSPACE", ".")) / image_path
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        content.append(ImageContent(type="image", data=data, mime_type="image/png"))
    content.append(TextContent(type="text", text=question))
    try:
        result = await ctx.session.create_message(
            [SamplingMessage(role="user", content=content)],
            max_tokens=max_tokens,
            system_prompt="You answer questions for a test server.",
        )
    except MCPError as exc:
        return f"sampling failed: {exc.message}"
    text = result.content.text if isinstance(result.content, TextContent) else f"({result.content.type})"
    return f"reply={text} | role={result.role} | model={result.model} | stop={result.stop_reason}"


if __name__ == "__main__":
    server.run()
