"""``tool-audio``: an MCP server (stdio) with one tool, ``transcribe(path)``.

Run it as ``python -m flowllm.tools.audio --base-url URL --model whisper-1 --api-key-env OPENAI_API_KEY``. The
file (in the task's folder, a regular file with one link, at most 25 MB as the OpenAI API accepts) is sent to an
OpenAI-compatible ``audio.transcriptions`` endpoint through the official SDK. Without a configured provider
(``tools.audio.base_url`` / ``tools.audio.api_key_env``) the tool answers with an error saying what to set.
``$FLOWLLM_AUDIO_BASE_URL`` (set by the run when ``tools.audio.emulator`` is true) points it at the loopback
emulator, which answers from its script (flowllm/emulator/media.py).

A transcript is kept in the run's web cache under the SHA-256 of the file and the model, so a resume or another
pass@k attempt does not pay for it again and ``provider=replay`` serves it without any transcription provider.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from flowllm.tools.common import ConfinementError, add_workspace_argument, confine, scrub_workspace, workspace_from
from flowllm.tools.files import ReadError, open_regular
from flowllm.tools.needs import TRANSCRIPTION_NEEDS, unmet, withdrawn_meta
from flowllm.tools.taskfolder import TaskFolders, asks_for_workspace
from flowllm.tools.web.cache import CachedError, CacheMode, ReplayMiss, TransientError, WebCache
from flowllm.tools.web.documents import Kind, kind_of

SERVER_NAME = "tool-audio"
AUDIO_BASE_URL_ENV = "FLOWLLM_AUDIO_BASE_URL"
MAX_AUDIO_BYTES = 25 * 1024 * 1024
EMULATOR_KEY = "flowllm-emulator"


@dataclass(frozen=True)
class Transcriber:
    base_url: str | None
    model: str
    api_key: str | None
    timeout_s: float = 120.0

    def problem(self) -> str | None:
        if not self.base_url and not self.api_key:
            return (
                "no transcription provider is configured: set tools.audio.base_url (an OpenAI-compatible "
                "server) and/or tools.audio.api_key_env (the variable holding its key)"
            )
        if not self.api_key:
            return "the transcription provider's key is not set (tools.audio.api_key_env names the variable)"
        return None

    async def transcribe(self, name: str, data: bytes) -> str:
        from openai import APIError, AsyncOpenAI

        client = AsyncOpenAI(
            base_url=self.base_url or None, api_key=self.api_key, timeout=self.timeout_s, max_retries=2
        )
        try:
            result = await client.audio.transcriptions.create(model=self.model, file=(name, data))
        except APIError as exc:
            raise TransientError(f"transcription failed: {exc.message}") from None
        finally:
            await client.close()
        return result.text


async def transcribe_file(workspace: Path, transcriber: Transcriber, path: str, cache: WebCache | None = None) -> str:
    cache = cache or WebCache(None)
    problem = transcriber.problem()
    if problem and cache.mode is not CacheMode.REPLAY:  # a replay needs no provider: it reads the saved transcript
        raise ToolError(problem)
    try:
        target = confine(workspace, path)
    except ConfinementError as exc:
        raise ToolError(scrub_workspace(str(exc), workspace)) from None
    if not target.exists():
        raise ToolError(f"no such audio file: '{path}'")
    if kind_of(target.name) is not Kind.AUDIO:
        raise ToolError(f"'{path}' is not an audio file (mp3, wav, m4a, flac, ogg)")
    try:
        data = open_regular(target, MAX_AUDIO_BYTES)
    except (ReadError, OSError) as exc:
        raise ToolError(f"cannot read '{path}': {exc}") from None

    request = {"sha256": hashlib.sha256(data).hexdigest(), "model": transcriber.model}
    try:
        text = await cache.get("transcribe", request, lambda: transcriber.transcribe(target.name, data))
    except (CachedError, ReplayMiss, TransientError) as exc:
        raise ToolError(str(exc)) from None
    return f"[transcript of '{path}']\n{text}"


def build_server(
    workspace: Path | None, transcriber: Transcriber, cache: WebCache | None = None, unavailable: str | None = None
) -> MCPServer:
    """The ``tool-audio`` server. ``workspace``: the folder of the task it serves; ``None`` for a server shared by
    a run, whose calls each name their task's folder (``flowllm.tools.taskfolder``). ``unavailable``: why
    transcribe cannot work here (no provider, no client library): listed as withdrawn (``flowllm.tools.needs``)."""
    server = MCPServer(SERVER_NAME, instructions="Transcribes audio files.", log_level="WARNING")
    folders = TaskFolders(SERVER_NAME, workspace)

    async def transcribe(path: str, ctx: Context) -> str:
        return await transcribe_file(folders.for_call(ctx), transcriber, path, cache)

    server.add_tool(
        transcribe,
        name="transcribe",
        meta={**asks_for_workspace(), **(withdrawn_meta(unavailable) if unavailable else {})},
        description="Transcribe an audio file of the task's folder (mp3, wav, m4a, flac, ogg) into text.",
        structured_output=False,
    )
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flowllm.tools.audio", description=__doc__)
    add_workspace_argument(parser)
    parser.add_argument("--base-url", default="", help="an OpenAI-compatible server (default: OpenAI's)")
    parser.add_argument("--model", default="whisper-1")
    parser.add_argument("--api-key-env", default="", help="the variable holding the key")
    args = parser.parse_args(argv)
    emulator = os.environ.get(AUDIO_BASE_URL_ENV)
    if emulator:
        transcriber = Transcriber(emulator, args.model, EMULATOR_KEY)
    else:
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        transcriber = Transcriber(args.base_url or None, args.model, key)
    cache = WebCache.from_environment()
    unavailable = unmet(TRANSCRIPTION_NEEDS, "transcribing audio")
    if unavailable is None and cache.mode is not CacheMode.REPLAY:  # a replay reads saved transcripts
        problem = transcriber.problem()
        unavailable = f"transcribing audio: {problem}" if problem else None
    build_server(workspace_from(args.workspace), transcriber, cache, unavailable).run()


if __name__ == "__main__":
    main()
