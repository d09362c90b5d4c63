"""``python -m tests.compat.render_templates --templates DIR``: render flowllm's summary-turn request through every
chat template in DIR that has tool calls, with jinja2 (``pip install jinja2``) in a sandbox as Hugging Face's
``apply_chat_template`` does, with ``provider.history`` off and on.

The request is the one a template is most likely to refuse: a native call whose arguments the server cut (so
repaired), its tool result, then a new user message (the summary turn's instruction), with the server's own
32-character call id. A template that raises prints its message; one that raises with the history settings on
is a request flowllm built that this template refuses. Templates written for another renderer (llama.cpp's
own extensions, Hugging Face's ``generation`` tag) raise for reasons of their own, which the message shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from flowllm.config.provider_schema import HistoryConfig, ProviderConfig
from flowllm.core.types import Message
from flowllm.engine import TurnContext
from flowllm.nodes.dispatch import DispatchTools
from flowllm.nodes.toolcalls import ParseToolCalls, RepairArguments
from flowllm.providers import build_provider

SERVER_ID = "Qh8JkYvJ2kCq0bZlN3yX5mT9aW4eR7uP"  # a llama.cpp stream's call id
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
TOOLS = [{"server": "tool-math", "name": "calculate", "description": "Calculate.", "input_schema": SCHEMA}]
TASK: Message = {"role": "user", "content": [{"type": "text", "text": "What is 17.5 * 2?"}]}


async def summary_request(history_on: bool) -> dict[str, Any]:
    cfg = ProviderConfig(
        name="local",
        protocol="openai_chat",
        model="local-model",
        tool_protocol="native",
        history=HistoryConfig(alternate_roles=history_on, portable_ids=history_on),
    )
    provider = build_provider(cfg, base_url="http://127.0.0.1:9/v1")
    call = {
        "id": SERVER_ID,
        "type": "function",
        "function": {"name": "tool-math-calculate", "arguments": '{"expression": "17.5'},  # cut by max_tokens
    }
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    body = {"id": "r", "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": "length"}]}
    response = provider.normalize(body)
    ctx = TurnContext(task_id="t", turn=1)
    parsed = await ParseToolCalls().run(ctx, response, TOOLS)
    prepared = (await RepairArguments().run(ctx, parsed["tool_calls"]))["prepared_calls"]
    history = (await DispatchTools().run(ctx, [TASK], response, prepared, parsed["bad_tool_calls"]))["next_messages"]
    last = history[-1]
    summary: Message = {**last, "content": [*last["content"], {"type": "text", "text": "Give your final answer now."}]}
    system = [{"type": "text", "text": "You are a careful assistant."}]
    request = provider.build_request(system=system, messages=[*history[:-1], summary], tools=TOOLS)  # type: ignore[list-item]
    await provider.aclose()
    return request


def template_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat wire messages as a server hands them to a template: call arguments decoded (llama.cpp and
    transformers both parse them; that parse is what refused the broken text)."""
    out = []
    for m in request["messages"]:
        calls = [
            {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in m.get("tool_calls") or []
        ]
        out.append({**m, "tool_calls": calls} if calls else dict(m))
    return out


def render_all(folder: Path) -> int:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: "04 Dec 2026")
    templates = sorted(p for p in folder.glob("*.jinja") if "tool_calls" in p.read_text(errors="replace"))
    refused_with_history = 0
    for history_on in (False, True):
        request = asyncio.run(summary_request(history_on))
        messages = template_messages(request)
        tools = request.get("tools")
        raised = 0
        for path in templates:
            try:
                env.from_string(path.read_text()).render(
                    messages=messages, tools=tools, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
                )
            except Exception as exc:  # any template failure is reported, whatever raised it
                raised += 1
                print(f"history={'on' if history_on else 'off'} {path.stem}: {type(exc).__name__}: {str(exc)[:110]}")
        print(f"history={'on' if history_on else 'off'}: {len(templates) - raised} of {len(templates)} rendered")
        if history_on:
            refused_with_history = raised
    return 1 if refused_with_history else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.compat.render_templates", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--templates", required=True, help="llama.cpp's models/templates folder")
    args = parser.parse_args(argv)
    return render_all(Path(args.templates))


if __name__ == "__main__":
    sys.exit(main())
