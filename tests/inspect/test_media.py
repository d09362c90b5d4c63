"""Images in a run's artifacts: ``node`` names them in one line each, the HTML report embeds them (up to a cap).

The run is written by hand with the recorder's own ``BlobStore``, so its references have the real shape:
``{"type": "image", "media_type": ..., "blob": "blobs/<sha256>.png", "bytes": n, "width": w, "height": h}``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from flowllm.engine.blobs import BlobStore
from flowllm.inspect.cli import main
from flowllm.inspect.report import MAX_EMBED_BYTES, build_report_data, write_report
from tests.inspect.minirun import png, write_run, write_task

TASK = "picture"
QUESTION = "What number is painted on the hull?"


@dataclass(frozen=True)
class ImageRun:
    path: Path
    small: bytes  # a 64x40 PNG sent to the model
    small_blob: str
    big_blob: str  # a "screenshot" over the report's cap


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_image_run(root: Path) -> ImageRun:
    run = write_run(root)

    def write(folder: str, name: str, raw: bytes) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_bytes(raw)

    store = BlobStore(run, write)
    small = png(64, 40)
    image = store.externalize({"type": "image", "media_type": "image/png", "data": b64(small)})
    # Only its header is read (for the size); the rest is padding past the cap.
    big_bytes = png(3000, 2000)[:33] + b"\0" * (MAX_EMBED_BYTES + 1)
    screenshot = store.externalize({"type": "image", "media_type": "image/png", "data": b64(big_bytes)})
    history = {"messages": [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]}
    # What the provider was sent still holds the bytes inline (the request as the SDK built it).
    request = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(small)}}
                ],
            }
        ]
    }
    call = {"id": "c1", "server": "tool-browser", "name": "screenshot", "arguments_text": "{}"}
    prepared = {"prepared_calls": [{"call": call, "arguments": {}, "repair_stage": "strict"}]}
    results = {"tool_results": [{"call_id": "c1", "content": "a screenshot", "images": [screenshot]}]}
    turn = [
        ("trim_history", history, history),
        ("call_model", history, {"raw_request": request, "response": {"text": "27"}}),
        ("repair_arguments", None, prepared),
        ("dispatch_tools", history, results),
    ]
    write_task(run, TASK, [turn], answer="27", ground_truth="27")
    return ImageRun(run, small, str(image["blob"]), str(screenshot["blob"]))


@pytest.fixture()
def image_run(tmp_path: Path) -> ImageRun:
    return write_image_run(tmp_path / "run")


def short(blob: str) -> str:
    return blob[: len("blobs/") + 12] + "..."


def test_the_blobs_are_the_real_store_s(image_run: ImageRun) -> None:
    sha = hashlib.sha256(image_run.small).hexdigest()
    assert image_run.small_blob == f"blobs/{sha}.png"
    assert (image_run.path / image_run.small_blob).read_bytes() == image_run.small
    assert (image_run.path / image_run.big_blob).stat().st_size > MAX_EMBED_BYTES


def test_node_names_images_instead_of_showing_base64(image_run: ImageRun, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(image_run.path), "node", TASK, "1", "call_model"]) == 0
    out = capsys.readouterr().out
    assert f"[image 64x40 png, {short(image_run.small_blob)}]" in out  # the reference, as one line
    assert f"[inline base64 image/png, {len(image_run.small):,} bytes]" in out  # the request's inline copy
    assert b64(image_run.small)[:24] not in out and "media_type" not in out
    assert main([str(image_run.path), "node", TASK, "1", "dispatch_tools", "--only", "output"]) == 0
    assert f"[image 3000x2000 png, {short(image_run.big_blob)}]" in capsys.readouterr().out
    # --raw and --json keep the record as saved.
    assert main([str(image_run.path), "node", TASK, "1", "call_model", "--raw"]) == 0
    raw = capsys.readouterr().out
    assert image_run.small_blob in raw and b64(image_run.small)[:24] in raw
    assert main([str(image_run.path), "node", TASK, "1", "call_model", "--json", "--only", "input"]) == 0
    saved = json.loads(capsys.readouterr().out)["input"]["messages"][0]["content"][0]
    assert (saved["blob"], saved["width"], saved["height"]) == (image_run.small_blob, 64, 40)


def test_task_view_names_a_tool_s_image(image_run: ImageRun, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(image_run.path), "task", TASK]) == 0
    assert f"[image 3000x2000 png, {short(image_run.big_blob)}]" in capsys.readouterr().out


def test_report_embeds_each_image_once_and_names_one_too_large(image_run: ImageRun, tmp_path: Path) -> None:
    report, info = write_report(image_run.path, tmp_path / "report.html")
    html = report.read_text(encoding="utf-8")
    uri = "data:image/png;base64," + b64(image_run.small)
    assert html.count(uri) == 1  # referenced from three nodes' inputs and outputs, embedded once
    assert info["bytes"] < MAX_EMBED_BYTES  # the large one is not in the file
    data = build_report_data(image_run.path)
    small, big = data["media"][image_run.small_blob], data["media"][image_run.big_blob]
    assert small == {"label": f"[image 64x40 png, {short(image_run.small_blob)}]", "src": uri, "note": None}
    assert big["src"] is None
    assert big["label"] == f"[image 3000x2000 png, {short(image_run.big_blob)}, too large to embed]"
    # The page shows them with the nodes: <img> elements are made from this table when a node is opened.
    assert "renderMedia(value)" in html and 'el("img", {src: m.src' in html


def test_report_of_a_run_whose_blob_file_is_gone(image_run: ImageRun) -> None:
    (image_run.path / image_run.small_blob).unlink()
    entry = build_report_data(image_run.path)["media"][image_run.small_blob]
    assert entry["src"] is None and entry["label"].endswith(", file missing]")


def test_a_blob_path_outside_the_run_s_blobs_folder_is_not_read(image_run: ImageRun, tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(png(2, 2))
    node = image_run.path / "tasks" / TASK / "turn_001" / "01_trim_history" / "input.json"
    value = json.loads(node.read_text())
    value["messages"][0]["content"][0]["blob"] = "blobs/../../secret.png"
    node.write_text(json.dumps(value))
    data = build_report_data(image_run.path)
    assert "blobs/../../secret.png" not in data["media"]
    assert b64(png(2, 2)) not in json.dumps(data)
