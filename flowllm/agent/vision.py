"""``tool-vision.ask_image(path_or_url, question)``: one multimodal model call through flowllm's own provider layer.

A text-only main model can still answer an image question: the tool sends the image and the question to a
model that takes images (the run's provider, or ``tools.vision.provider``) and hands its answer back as the tool
result. The call runs the turn graph once, as agent ``vision`` with no tools, so it is what a sub-agent is:
recorded under the calling turn (``turn_NNN/subagents/vision-<call_id>/turn_001/...``), its tokens counted
toward the task and in ``usage.jsonl`` (agent ``vision``), served again by ``provider=replay``.

The image is a file of the task's folder (confined to it: a regular file, one link, at most
``tools.vision.max_image_mb``) or an http(s) URL fetched with tool-browse's address policy (public addresses
only; ``*.web.test`` reaches the run's fixture server) and kept in the run's web cache, so a resume or a replay
fetches nothing again. PNG, JPEG, GIF and WebP are recognised by their bytes, not their names.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flowllm.agent.results import AgentResult
from flowllm.core.forwarding import ForwardingTools
from flowllm.core.images import image_media_type
from flowllm.core.interfaces import TaskStore, ToolBackend
from flowllm.core.types import Block, ToolResult, ToolSpec, Usage, text_block

if TYPE_CHECKING:
    from flowllm.tools.browse import UrlPolicy
    from flowllm.tools.web.cache import WebCache

VISION_SERVER = "tool-vision"
ASK_IMAGE = "ask_image"
VISION_AGENT = "vision"
DEFAULT_SYSTEM_PROMPT = (
    "You answer questions about one image. Describe only what the image shows; say so when the image does not "
    "show what is asked. Be precise about text, numbers, colours and positions."
)


class ImageError(Exception):
    """An image that cannot be sent; the message is what the model is told."""


def is_url(source: str) -> bool:
    return urlsplit(source.strip()).scheme.lower() in ("http", "https")


@dataclass(frozen=True)
class VisionSpec:
    """How ``ask_image`` runs (``tools.vision`` in config)."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_image_bytes: int = 5 * 1024 * 1024  # Anthropic's limit for one image
    timeout_s: float = 300.0
    # The provider that looks at images; None: the run's own.
    provider: Any = None
    # Where URLs may go (tool-browse's policy) and the run's web cache; None: URLs are refused.
    url_policy: UrlPolicy | None = None
    cache: WebCache | None = None

    def tool_spec(self) -> ToolSpec:
        return {
            "server": VISION_SERVER,
            "name": ASK_IMAGE,
            "description": (
                "Look at an image and answer a question about it. path_or_url: a file of the task's folder "
                "(png, jpeg, gif, webp) or an http(s) URL of an image. question: what you want to know; ask for "
                "exactly what you need (text to transcribe, things to count, a colour)."
            ),
            "input_schema": {
                "type": "object",
                "properties": {
                    "path_or_url": {"type": "string", "description": "the image file or URL"},
                    "question": {"type": "string", "description": "the question about the image"},
                },
                "required": ["path_or_url", "question"],
            },
        }


def load_image_file(workspace: Path, path: str, max_bytes: int) -> tuple[str, bytes]:
    """(media type, bytes) of an image file of the task's folder."""
    from flowllm.tools.common import ConfinementError, confine, scrub_workspace
    from flowllm.tools.files import ReadError, open_regular

    try:
        target = confine(workspace, path)
    except ConfinementError as exc:
        raise ImageError(scrub_workspace(str(exc), workspace)) from None
    if not target.exists():
        raise ImageError(f"no such file: '{path}'")
    try:
        data = open_regular(target, max_bytes)
    except ReadError as exc:
        raise ImageError(f"cannot read '{path}': {exc}") from None
    except OSError as exc:
        raise ImageError(f"cannot read '{path}': {exc.strerror or exc}") from None
    return _typed(data, f"'{path}'")


async def fetch_image(url: str, spec: VisionSpec) -> tuple[str, bytes]:
    """(media type, bytes) of an image URL, from the run's web cache when it was fetched before."""
    from flowllm.tools.browse import BrowseError, BrowseLimits, Browser
    from flowllm.tools.web.cache import CachedError, ReplayMiss, WebCache

    if spec.url_policy is None:
        raise ImageError("this run reads no URLs; save the image in the task's folder first")
    browser = Browser(spec.url_policy, BrowseLimits(max_bytes=spec.max_image_bytes))

    async def download() -> str:
        try:
            fetched = await browser.fetch(url)
        except BrowseError as exc:
            raise ImageError(str(exc)) from None
        media_type, data = _typed(fetched.data, fetched.url)
        return json.dumps({"media_type": media_type, "data": base64.b64encode(data).decode("ascii")})

    cache = spec.cache or WebCache(None)
    try:
        entry = json.loads(await cache.get(ASK_IMAGE, {"url": url.strip()}, download))
    except (CachedError, ReplayMiss) as exc:
        raise ImageError(str(exc)) from None
    return str(entry["media_type"]), base64.b64decode(entry["data"])


def _typed(data: bytes, where: str) -> tuple[str, bytes]:
    media_type = image_media_type(data)
    if media_type is None:
        raise ImageError(f"{where} is not an image a model can take (png, jpeg, gif or webp)")
    return media_type, data


def image_prompt(question: str, media_type: str, data: bytes) -> list[Block]:
    """The vision call's user message: the image, then the question."""
    image: Block = {"type": "image", "media_type": media_type, "data": base64.b64encode(data).decode("ascii")}
    return [image, text_block(question.strip())]


# Runs one vision conversation: (prompt blocks, record scope) -> its result.
VisionRunner = Callable[[list[Block], str], Coroutine[Any, Any, AgentResult]]


@dataclass
class VisionTools(ForwardingTools):
    """A task's tools plus ``tool-vision.ask_image``, as one ToolBackend."""

    inner: ToolBackend | None
    spec: VisionSpec
    workspace: Path
    run_vision: VisionRunner
    record_dir: Callable[[str], str]  # call id -> the conversation's scope under the task
    usage: Usage = field(default_factory=Usage)
    calls: int = 0

    async def list_tools(self) -> list[ToolSpec]:
        return [*await super().list_tools(), self.spec.tool_spec()]

    def _mine(self, server: str | None, name: str) -> bool:
        return server == VISION_SERVER or (server is None and name == ASK_IMAGE)

    async def call(
        self,
        server: str | None,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str,
        timeout_s: float,
        state: TaskStore | None = None,
    ) -> ToolResult:
        if not self._mine(server, name):
            return await super().call(server, name, arguments, call_id=call_id, timeout_s=timeout_s, state=state)
        if name != ASK_IMAGE:
            return _error(call_id, name, f"{VISION_SERVER} has one tool, {ASK_IMAGE}(path_or_url, question)")
        source, question = arguments.get("path_or_url"), arguments.get("question")
        if not isinstance(source, str) or not source.strip() or not isinstance(question, str) or not question.strip():
            return _error(call_id, name, f"call {ASK_IMAGE} with a 'path_or_url' string and a 'question' string")
        try:
            if is_url(source):
                media_type, data = await fetch_image(source, self.spec)
            else:
                media_type, data = await asyncio.to_thread(
                    load_image_file, self.workspace, source, self.spec.max_image_bytes
                )
        except ImageError as exc:
            return _error(call_id, name, str(exc))
        try:
            async with asyncio.timeout(self.spec.timeout_s):
                result = await self.run_vision(image_prompt(question, media_type, data), self.record_dir(call_id))
        except TimeoutError:
            return _error(call_id, name, f"the image model did not answer within {self.spec.timeout_s:g}s")
        self.usage = self.usage + result.usage
        self.calls += 1
        return ToolResult(call_id, VISION_SERVER, ASK_IMAGE, result.final_text.strip() or "(no answer)")


def _error(call_id: str, name: str, message: str) -> ToolResult:
    return ToolResult(call_id, VISION_SERVER, name, f"Error: {message}", True)
