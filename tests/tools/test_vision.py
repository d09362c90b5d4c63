"""tool-vision: images read from the task folder or a URL (web cache, replay), refused when they are no image or
lie outside the folder; and ask_image end to end through the real command line, in the three wire protocols, on
a replay, and with a provider that takes no images."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from flowllm.agent.vision import ImageError, VisionSpec, fetch_image, load_image_file
from flowllm.core.images import image_media_type
from flowllm.resources import bundled
from flowllm.tools.browse import UrlPolicy
from flowllm.tools.web.cache import CacheMode, WebCache
from tests.appfork import run_app
from tests.loopback import serve_http

ROOT = Path(__file__).resolve().parents[2]
BOAT = bundled("data/web_sample") / "boat.png"
TASK = "web-10-image-question"


def test_media_types_come_from_the_bytes_not_the_name() -> None:
    assert image_media_type(BOAT.read_bytes()) == "image/png"
    assert image_media_type(b"\xff\xd8\xff\xe0" + b"\0" * 16) == "image/jpeg"
    assert image_media_type(b"GIF89a" + b"\0" * 16) == "image/gif"
    assert image_media_type(b"RIFF\x10\0\0\0WEBPVP8 ") == "image/webp"
    assert image_media_type(b"%PDF-1.7") is None
    assert image_media_type(b"") is None


def test_files_are_confined_to_the_task_folder_and_must_be_images(workspace: Path, tmp_path: Path) -> None:
    (workspace / "boat.png").write_bytes(BOAT.read_bytes())
    assert load_image_file(workspace, "boat.png", 1 << 20) == ("image/png", BOAT.read_bytes())
    (workspace / "notes.png").write_text("not an image at all")
    with pytest.raises(ImageError, match="not an image a model can take"):
        load_image_file(workspace, "notes.png", 1 << 20)
    with pytest.raises(ImageError, match="outside the task folder"):
        load_image_file(workspace, "../secret.png", 1 << 20)
    with pytest.raises(ImageError, match="no such file"):
        load_image_file(workspace, "missing.png", 1 << 20)
    with pytest.raises(ImageError, match="too large"):
        load_image_file(workspace, "boat.png", 10)
    os.link(workspace / "boat.png", workspace / "linked.png")  # a hard link could point anywhere on the disk
    with pytest.raises(ImageError, match="cannot read"):
        load_image_file(workspace, "linked.png", 1 << 20)


@pytest.fixture
def photo_server(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server with the photo and a text file, standing in for the web (as *.web.test)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "boat.png").write_bytes(BOAT.read_bytes())
    (site / "page.txt").write_text("hello")
    with serve_http(functools.partial(SimpleHTTPRequestHandler, directory=str(site))) as url:
        yield url


async def test_a_url_is_fetched_once_then_served_from_the_web_cache_and_by_a_replay(
    photo_server: str, tmp_path: Path
) -> None:
    cache = WebCache(tmp_path / "web_cache")
    spec = VisionSpec(url_policy=UrlPolicy(photo_server), cache=cache)
    url = "http://photos.web.test/boat.png"
    assert await fetch_image(url, spec) == ("image/png", BOAT.read_bytes())
    assert await fetch_image(url, spec) == ("image/png", BOAT.read_bytes())
    assert (cache.stats.misses, cache.stats.hits) == (1, 1)
    with pytest.raises(ImageError, match="not an image"):
        await fetch_image("http://photos.web.test/page.txt", spec)
    # A replay reads the saved image with no server at all, and refuses what the run never fetched.
    replay = VisionSpec(url_policy=UrlPolicy(None), cache=WebCache(tmp_path / "web_cache", CacheMode.REPLAY))
    assert await fetch_image(url, replay) == ("image/png", BOAT.read_bytes())
    with pytest.raises(ImageError, match="was not called with these arguments"):
        await fetch_image("http://photos.web.test/other.png", replay)


async def test_private_addresses_and_runs_without_urls_are_refused(tmp_path: Path) -> None:
    spec = VisionSpec(url_policy=UrlPolicy(None), cache=WebCache(None))
    with pytest.raises(ImageError, match="this machine"):
        await fetch_image("http://localhost/boat.png", spec)
    with pytest.raises(ImageError, match="private or local"):
        await fetch_image("http://169.254.169.254/latest", spec)
    with pytest.raises(ImageError, match="reads no URLs"):
        await fetch_image("https://example.com/boat.png", VisionSpec())


def run(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return run_app(
        [
            "+experiment=web_sample",
            f"dataset.task_ids=[{TASK}]",
            "progress=false",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        cwd=ROOT,
        timeout=600,  # a hang guard only
        env={k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
    )


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("provider", ["offline_chat", "offline_responses"])
def test_ask_image_in_the_openai_protocols_is_recorded_counted_and_replayed(tmp_path: Path, provider: str) -> None:
    # (The Anthropic protocol runs the same task in test_web_sample.py, under every runner.)
    run_dir = tmp_path / "run"
    proc = run(run_dir, f"provider={provider}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = summary_of(run_dir)
    assert summary["correct"] == 1, summary
    # The vision call is recorded under the turn that made it, as agent "vision", with the image as a blob.
    calls = list((run_dir / "tasks" / TASK / "turn_001" / "subagents").glob("vision-*/turn_001/03_call_model"))
    assert len(calls) == 1
    sent = json.loads((calls[0] / "input.json").read_text())
    image = sent["prompt_messages"][0]["content"][0]
    assert image["type"] == "image" and image["blob"].startswith("blobs/d46f37944737f9d5")
    assert (run_dir / image["blob"]).read_bytes() == BOAT.read_bytes()
    ledger = [json.loads(line) for line in (run_dir / "usage.jsonl").read_text().splitlines()]
    vision = [e for e in ledger if e.get("type") == "attempt" and e.get("agent") == "vision"]
    assert len(vision) == 1 and vision[0]["outcome"] == "ok" and vision[0]["usage"]["input_tokens"] > 0
    # Its tokens are the task's tokens.
    result = json.loads((run_dir / "tasks" / TASK / "result.json").read_text())
    billed = sum(e["usage"]["input_tokens"] for e in ledger if e.get("type") == "attempt" and e["outcome"] == "ok")
    assert result["usage"]["input_tokens"] == billed
    # A replay serves the vision call too: exact, correct, nothing spent.
    again = tmp_path / "replay"
    proc = run(again, "provider=replay", f"provider.run_dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    replayed = summary_of(again)
    assert replayed["replay"]["exact"] == 1 and replayed["correct"] == 1, replayed


def test_a_provider_that_takes_no_images_is_not_offered_the_tool(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run(run_dir, "provider.accepts=[text]")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tool-vision is not offered: provider 'offline' takes no images" in proc.stdout + proc.stderr
    summary = summary_of(run_dir)
    assert "takes no images" in summary["tools"]["unavailable"]["tool-vision"]
    # The scripted call goes to a tool that is not there: the task completes with a wrong answer, never a made-up
    # right one.
    assert summary["completed"] == 1 and summary["correct"] == 0, summary


def test_a_text_only_main_model_asks_a_vision_provider_of_another_protocol(tmp_path: Path) -> None:
    # As provider=deepseek tools.vision.provider=claude would: the main model (Anthropic protocol) takes no
    # images, the vision model (OpenAI Chat protocol, its own emulator) does.
    run_dir = tmp_path / "run"
    script = bundled("data/web_sample") / "script.yaml"
    proc = run(
        run_dir,
        "provider.accepts=[text]",
        "tools.vision.provider=offline_chat",
        f"tools.vision.emulator_script={script}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = summary_of(run_dir)
    assert summary["correct"] == 1 and summary["tools"]["unavailable"] == {}, summary
    ledger = [json.loads(line) for line in (run_dir / "usage.jsonl").read_text().splitlines()]
    protocols = {(e["agent"], e["protocol"]) for e in ledger if e.get("type") == "attempt"}
    assert protocols == {("main", "anthropic"), ("vision", "openai_chat")}


def test_a_named_vision_provider_that_takes_no_images_is_a_config_error(tmp_path: Path) -> None:
    proc = run(tmp_path / "run", "tools.vision.provider=deepseek")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tools.vision.provider 'deepseek' takes no images" in proc.stderr
    assert "Traceback" not in proc.stderr
