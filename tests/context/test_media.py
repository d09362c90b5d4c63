"""Multimodal tool results: passed natively to providers that take them, described in text for the others,
with the original kept in the run's records."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from types import SimpleNamespace
from typing import Any

import pytest

from flowllm.agent.loop import Agent
from flowllm.agent.results import AgentSettings
from flowllm.config.plain import plain_config
from flowllm.core.forwarding import ToolBackendDefaults
from flowllm.core.types import ToolResult, ToolSpec
from flowllm.engine import make_runner
from flowllm.engine.pipeline import pipeline_from_config
from flowllm.nodes.media import accepted_media, degrade_messages, describe_media

from .conftest import PROTOCOLS
from .helpers import Outputs


def png(width: int, height: int) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    raw += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(raw).decode()


def wav(seconds: float, rate: int = 8000) -> str:
    frames = b"\x00\x00" * int(rate * seconds)
    header = (
        b"RIFF"
        + struct.pack("<I", 36 + len(frames))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    )
    return base64.b64encode(header + b"data" + struct.pack("<I", len(frames)) + frames).decode()


IMAGE = {"type": "image", "media_type": "image/png", "data": png(64, 48)}


class Camera(ToolBackendDefaults):
    """A tool backend whose one tool returns a picture."""

    async def list_tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {}}
        return [{"server": "tool-camera", "name": "snap", "description": "Take a picture.", "input_schema": schema}]

    async def call(
        self, server: str | None, name: str, arguments: dict[str, Any], *, call_id: str, timeout_s: float
    ) -> ToolResult:
        return ToolResult(call_id=call_id, server=server, name=name, content="picture taken", images=[dict(IMAGE)])


def test_descriptions_say_what_the_model_is_missing() -> None:
    text = describe_media(IMAGE, "message 2")
    assert "image/png" in text and "64x48 pixels" in text and "sha256" in text and "message 2" in text
    audio = describe_media({"type": "audio", "media_type": "audio/wav", "data": wav(1.5)}, "message 4")
    assert "audio not shown" in audio and "1.5 s" in audio


def test_what_a_provider_accepts() -> None:
    assert accepted_media(None) == {"image"}  # no provider (a pipeline on its own): all three protocols carry images
    assert accepted_media(SimpleNamespace(accepted_media=frozenset())) == set()  # type: ignore[arg-type]
    assert accepted_media(SimpleNamespace(accepted_media=frozenset({"image", "audio"}))) == {"image", "audio"}  # type: ignore[arg-type]
    assert accepted_media(SimpleNamespace(accepted_media=frozenset({"image"})), override=[]) == set()  # type: ignore[arg-type]


def test_degrading_touches_only_media_and_keeps_ids() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "task"}, dict(IMAGE)]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "t", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "ok"}, dict(IMAGE)]},
                {"type": "audio", "media_type": "audio/wav", "data": wav(0.5)},
            ],
        },
    ]
    out, report = degrade_messages(messages, {"image"})
    assert out[0] is messages[0] and out[1] is messages[1]  # images are fine here; only the audio goes
    assert [r["type"] for r in report] == ["audio"]
    out, report = degrade_messages(messages, set())
    assert len(report) == 3 and out[2]["content"][0]["tool_use_id"] == "c1"
    assert "image" not in json.dumps(out[2]["content"][0]["content"][1].get("type"))
    assert messages[0]["content"][1] == IMAGE  # the history keeps the original


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("accept", ["native", "text"])
async def test_an_image_result_reaches_each_protocol_natively_or_as_text(
    protocol: str, accept: str, connect: Any, compose_cfg: Any
) -> None:
    overrides = ["pipeline.hooks.before_model=[degrade_media]"]
    if accept == "text":
        overrides.append("pipeline.hook_nodes.degrade_media.accept=[]")
    observer = Outputs()
    agent = Agent(
        pipeline_from_config(plain_config(compose_cfg(*overrides).pipeline)),
        make_runner("graph"),
        AgentSettings(max_turns=3),
        observer=observer,
    )
    result = await agent.run("snap", "What do you see?", connect(protocol, tool_protocol="native"), Camera())
    assert result.answer == "seen"  # the emulator accepted both forms

    sent = json.dumps(observer.turns("call_model")[1]["raw_request"])
    assert (IMAGE["data"] in sent) == (accept == "native")
    assert ("image not shown" in sent) == (accept == "text")
    degraded = observer.turns("degrade_media")[1]["degraded"]
    assert len(degraded) == (1 if accept == "text" else 0)
    # Whatever the model got, the run's records keep the picture.
    kept = observer.turns("dispatch_tools")[0]["tool_results"][0]
    assert kept.images[0]["data"] == IMAGE["data"]
