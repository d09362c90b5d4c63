"""tool-audio: transcription through the official OpenAI SDK against the emulator's scripted endpoint; a clear
error without a provider; the same file guards as read_file."""

from __future__ import annotations

import io
import os
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from flowllm.emulator import Emulator
from flowllm.tools.audio import Transcriber, transcribe_file


def wav_bytes(seconds: float = 0.5) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\x00\x00" * int(16000 * seconds))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    script = {"tasks": {"transcribe/memo.wav": [{"text": "The meeting moves to Thursday at nine."}]}}
    with Emulator(script) as emu:
        yield emu


async def test_a_file_is_transcribed_through_the_sdk(emulator: Emulator, workspace: Path) -> None:
    (workspace / "memo.wav").write_bytes(wav_bytes())
    transcriber = Transcriber(emulator.openai_base_url, "whisper-1", "test-key")
    text = await transcribe_file(workspace, transcriber, "memo.wav")
    assert text == "[transcript of 'memo.wav']\nThe meeting moves to Thursday at nine."


async def test_an_unknown_file_fails_instead_of_inventing_words(emulator: Emulator, workspace: Path) -> None:
    (workspace / "other.wav").write_bytes(wav_bytes())
    transcriber = Transcriber(emulator.openai_base_url, "whisper-1", "test-key")
    with pytest.raises(ToolError, match=r"transcription failed: .*400.* no transcript for 'other\.wav'"):
        await transcribe_file(workspace, transcriber, "other.wav")


async def test_no_provider_no_key_and_bad_files_are_clear_errors(workspace: Path, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"no transcription provider is configured: set tools\.audio\.base_url"):
        await transcribe_file(workspace, Transcriber(None, "whisper-1", None), "memo.wav")
    with pytest.raises(ToolError, match="key is not set"):
        await transcribe_file(workspace, Transcriber("http://127.0.0.1:9/v1", "whisper-1", None), "memo.wav")
    ready = Transcriber("http://127.0.0.1:9/v1", "whisper-1", "k")
    (workspace / "notes.txt").write_text("hi")
    with pytest.raises(ToolError, match="not an audio file"):
        await transcribe_file(workspace, ready, "notes.txt")
    with pytest.raises(ToolError, match="outside the task folder"):
        await transcribe_file(workspace, ready, "../x.wav")
    os.mkfifo(workspace / "pipe.wav")
    with pytest.raises(ToolError, match="FIFO"):
        await transcribe_file(workspace, ready, "pipe.wav")
