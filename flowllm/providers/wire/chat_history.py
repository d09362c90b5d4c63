"""Chat histories that strict chat templates accept (``provider.history``, OpenAI Chat).

Servers that render a model's own chat template (llama.cpp's ``--jinja``, vLLM, SGLang) run that template's
checks on every request:

* **Alternation.** Mistral's and Gemma's templates raise unless user and assistant turns alternate, counting
  neither tool results nor assistant messages with tool calls. A new user message right after tool results
  (the summary turn's instruction, a compaction note, a hook's message) breaks it. ``alternate`` puts a short
  assistant message between them and joins consecutive user messages.
* **Tool-call ids.** Mistral's template refuses any id but 9 letters and digits; a llama.cpp stream gives a
  32-character one. ``portable_id`` maps a server's id to such an id, deterministically (the same reply always
  gives the same id, so a replay reads the same history); the tool_use block keeps the server's id as
  ``server_id``, and requests carry the portable one.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

# What the assistant says between tool results and a new user message, where the template needs a turn there.
BRIDGE_TEXT = "I have the results of my tool calls."
PORTABLE_ID_LENGTH = 9
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_PORTABLE = re.compile(r"[A-Za-z0-9]{9}\Z")


def is_portable(call_id: str) -> bool:
    return bool(_PORTABLE.match(call_id))


def portable_id(server_id: str, *, response_id: str = "", index: int = 0) -> str:
    """A 9-character alphanumeric id for a call: the server's own when it already is one, else derived from
    it, the reply's id and the call's position (so two calls that share a server id stay apart)."""
    if is_portable(server_id):
        return server_id
    digest = int.from_bytes(hashlib.sha256(f"{response_id}\0{index}\0{server_id}".encode()).digest()[:8], "big")
    chars = []
    for _ in range(PORTABLE_ID_LENGTH):
        digest, rest = divmod(digest, len(_ALPHABET))
        chars.append(_ALPHABET[rest])
    return "".join(chars)


def _counted(message: dict[str, Any]) -> str | None:
    """The role a strict template counts for alternation: tool results and tool-call turns are not counted."""
    role = message.get("role")
    if role == "user":
        return "user"
    if role == "assistant" and not message.get("tool_calls"):
        return "assistant"
    return None


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": str(content)}] if content else []


def _join(first: Any, second: Any) -> Any:
    if isinstance(first, str) and isinstance(second, str):
        return "\n\n".join(t for t in (first, second) if t)
    return [*_parts(first), *_parts(second)]


def alternate(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat wire messages with user and assistant turns alternating (system messages and tool turns aside)."""
    out: list[dict[str, Any]] = []
    last: str | None = None
    for message in messages:
        role = _counted(message)
        if role == "user" and out and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": _join(out[-1].get("content"), message.get("content"))}
            continue
        if role == "user" and last == "user":
            text: Any = BRIDGE_TEXT
            if isinstance(message.get("content"), list):
                text = [{"type": "text", "text": BRIDGE_TEXT}]
            out.append({"role": "assistant", "content": text})
        if role is not None:
            last = role
        out.append(message)
    return out
