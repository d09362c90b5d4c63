"""What degrade_media records is what goes on the wire, for every provider config flowllm ships.

Each shipped ``conf/provider/<name>.yaml`` is composed as a run would compose it, opened through
``open_provider`` (the resilient chain, as in a run) against the emulator, and sent a prompt holding an image.
The emulator writes down the bytes it received ($FLOWLLM_EMULATOR_CAPTURE). A text-only model (local, deepseek,
qwen, minimax) must get the image's text description, and degrade_media must have recorded that replacement;
a model that takes images must get the image's bytes, and degrade_media must have recorded nothing. The
replay provider declares what the replayed run's provider declared.
"""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flowllm.config.providers import provider_config
from flowllm.config.schema import register_configs
from flowllm.core.interfaces import Provider
from flowllm.core.types import Message
from flowllm.emulator.server import CAPTURE_ENV
from flowllm.engine import TurnContext
from flowllm.nodes.media import DegradeMedia, accepted_media
from flowllm.providers import open_provider
from flowllm.providers.errors import ProviderCallError
from flowllm.providers.replay import build_replay_provider
from flowllm.resources import CONFIG_DIR

SHIPPED = sorted(p.stem for p in (CONFIG_DIR / "provider").glob("*.yaml"))
LIVE = [name for name in SHIPPED if name != "replay"]
TEXT_ONLY = {"local", "deepseek", "qwen", "minimax"}
# A distinctive payload: found in a request body only if the image itself was sent.
IMAGE_DATA = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"flowllm-media-probe" * 8).decode()
PROMPT: list[Message] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image", "media_type": "image/png", "data": IMAGE_DATA},
        ],
    }
]


def shipped_config(name: str) -> dict[str, Any]:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"provider={name}"])
    provider = OmegaConf.to_container(cfg.provider, resolve=True, enum_to_str=True)
    assert isinstance(provider, dict)
    return {str(k): v for k, v in provider.items()}


def test_every_shipped_config_is_covered() -> None:
    assert set(SHIPPED) > TEXT_ONLY and "replay" in SHIPPED and len(LIVE) >= 10


@pytest.mark.parametrize("name", LIVE)
async def test_what_degrade_media_records_is_what_is_sent(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = tmp_path / "capture.jsonl"
    monkeypatch.setenv(CAPTURE_ENV, str(capture))
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"default": [{"text": "A picture. \\boxed{seen}"}]}))
    cfg = shipped_config(name)
    for env in str(cfg.get("api_key_env") or "").split(","):
        if env.strip():
            monkeypatch.setenv(env.strip(), "sk-test-media")
    # The shipped protocol, model, accepts and content format, served by the emulator instead of the vendor.
    cfg.update(emulator_script=str(script), fallbacks=[])

    async with open_provider(provider_config(cfg)) as provider:
        ctx = TurnContext(task_id="media", turn=1, provider=provider)
        out = DegradeMedia().run(ctx, prompt_messages=PROMPT)
        request = provider.build_request(system=[], messages=out["prompt_messages"], tools=[])
        # The emulator refuses some vendors' extra keys (openrouter's usage) after it captured the bytes.
        with contextlib.suppress(ProviderCallError):
            await provider.send(request, context=ctx.call_context)

    lines = capture.read_text().splitlines()
    assert len(lines) == 1
    body = json.loads(json.loads(lines[0])["body"])
    sent_image = IMAGE_DATA in json.dumps(body)
    recorded = out["degraded"]
    if name in TEXT_ONLY:
        assert provider.accepted_media == frozenset()
    assert sent_image == ("image" in provider.accepted_media) == ("image" in accepted_media(provider))
    assert sent_image == (not recorded)
    if recorded:
        # The description degrade_media recorded is the text the model received in the image's place.
        assert [r["type"] for r in recorded] == ["image"]
        assert recorded[0]["text"] in json.dumps(body, ensure_ascii=False)


@pytest.mark.parametrize("source", ["deepseek", "claude"])
def test_replay_declares_what_the_replayed_provider_declared(source: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "tasks").mkdir(parents=True)
    (run / ".hydra").mkdir()
    cfg = shipped_config(source)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"provider": cfg}))
    replay = build_replay_provider(provider_config({**shipped_config("replay"), "run_dir": str(run)}))
    assert isinstance(replay, Provider)
    assert replay.accepted_media == replay.inner.accepted_media
    expected = {"image", "document"} if source == "claude" else set()
    assert accepted_media(replay) == expected
    out = DegradeMedia().run(TurnContext(task_id="t", turn=1, provider=replay), prompt_messages=PROMPT)
    wire = replay.build_request(system=[], messages=out["prompt_messages"], tools=[])
    assert (IMAGE_DATA in json.dumps(wire)) == (not out["degraded"]) == (source == "claude")
