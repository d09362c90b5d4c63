"""Media from tools in the run's artifacts: stored once per run, content-addressed, referenced everywhere, and
shown by inspect as ``[image 64x48 png, blobs/...]``."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from flowllm.core.types import ToolResult
from flowllm.engine import Node, TurnContext, build_pipeline
from flowllm.engine.blobs import describe_blob, image_size, inline
from flowllm.engine.recorder import Recorder
from flowllm.engine.runners import make_runner
from tests.context.test_media import png

IMAGE = {"type": "image", "media_type": "image/png", "data": png(64, 48)}


class Snap(Node):
    """A tool step that returns a picture and carries the history (with the picture) on."""

    outputs = ("tool_results", "next_messages")

    async def run(self, ctx: TurnContext, messages: list) -> dict:
        result = ToolResult("c1", "tool-camera", "snap", "picture taken", images=[dict(IMAGE)])
        history = [*messages, {"role": "user", "content": [{"type": "text", "text": "see"}, dict(IMAGE)]}]
        return {"tool_results": [result], "next_messages": history}


async def test_an_image_is_stored_once_and_referenced_from_every_artifact(tmp_path: Path) -> None:
    pipeline = build_pipeline({"snap": {"_target_": Snap()}}, provided=("messages",))
    messages: list = []
    with Recorder(tmp_path) as rec:
        for turn in (1, 2):  # the second turn's input holds the first turn's picture again
            state = await make_runner("graph").run(pipeline, {"messages": messages}, TurnContext("t", turn), rec)
            messages = state["next_messages"]
    blobs = list((tmp_path / "blobs").iterdir())
    raw = base64.b64decode(IMAGE["data"])
    assert len(blobs) == 1 and blobs[0].read_bytes() == raw and blobs[0].suffix == ".png"
    records = list((tmp_path / "tasks").rglob("*.json"))
    assert records and all(IMAGE["data"] not in p.read_text() for p in records), "no inline copy anywhere"
    output = json.loads((tmp_path / "tasks" / "t" / "turn_002" / "01_snap" / "output.json").read_text())
    ref = output["tool_results"][0]["images"][0]
    assert ref["blob"] == f"blobs/{blobs[0].name}" and (ref["width"], ref["height"]) == (64, 48)
    assert describe_blob(ref) == f"[image 64x48 png, blobs/{blobs[0].name[:12]}...]"
    assert inline(ref, tmp_path) == IMAGE
    assert messages[-1]["content"][1] == IMAGE, "the live history keeps its data: only the records change"


def test_image_sizes_from_headers() -> None:
    assert image_size(base64.b64decode(png(3, 7))) == (3, 7)
    assert image_size(b"GIF89a\x05\x00\x09\x00") == (5, 9)
    assert image_size(b"not an image") is None
