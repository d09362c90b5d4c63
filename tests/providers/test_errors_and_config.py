"""Bad input: configuration mistakes, unreachable servers, broken or failing replies. Each a clear error."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flowllm.config.providers import provider_config
from flowllm.config.schema import register_configs
from flowllm.core.interfaces import CallContext, Provider
from flowllm.providers import (
    ProviderCallError,
    ProviderConfigError,
    ProviderResponseError,
    build_provider,
    check_provider_config,
    open_provider,
)
from flowllm.providers.base import BaseProvider

from .conftest import SCRIPT, SYSTEM, make_cfg

CONF = Path(__file__).resolve().parents[2] / "flowllm" / "conf" / "provider"
HELLO = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWLLM_TEST_KEY", raising=False)
    cfg = make_cfg("anthropic", name="claude", api_key_env="FLOWLLM_TEST_KEY")
    with pytest.raises(ProviderConfigError) as info:
        check_provider_config(cfg)
    message = str(info.value)
    assert "FLOWLLM_TEST_KEY" in message and "export" in message and "\n" not in message
    monkeypatch.setenv("FLOWLLM_TEST_KEY", "k")
    check_provider_config(cfg)


def test_local_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWLLM_TEST_KEY", raising=False)
    check_provider_config(
        make_cfg("openai_chat", name="local", api_key_env="FLOWLLM_TEST_KEY", base_url="http://127.0.0.1:8000/v1")
    )


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"protocol": "carrier_pigeon"}, r"^provider\.protocol must be one of anthropic, .*, not 'carrier_pigeon'$"),
        ({"tool_protocol": "json"}, "tool_protocol"),
        ({"auth": "basic"}, "provider.auth"),
        ({"emulator_script": "no/such/script.yaml"}, "file not found"),
    ],
)
def test_invalid_configs_are_refused_before_any_call(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProviderConfigError, match=fragment):
        check_provider_config(make_cfg(**overrides))


def test_every_shipped_provider_yaml_composes() -> None:
    register_configs()
    names = sorted(p.stem for p in CONF.glob("*.yaml"))
    assert {
        "claude",
        "gpt5",
        "gpt4o",
        "deepseek",
        "openrouter",
        "qwen",
        "minimax",
        "local",
        "offline",
    } <= set(names)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(CONF, Path(tmp) / "provider")
        (Path(tmp) / "root.yaml").write_text("defaults:\n  - provider: offline\n  - _self_\n")
        with initialize_config_dir(config_dir=tmp, version_base="1.3"):
            for name in names:
                cfg = provider_config(compose(config_name="root", overrides=[f"provider={name}"]).provider)
                assert cfg.protocol in ("anthropic", "openai_chat", "openai_responses", "replay"), name
                assert cfg.model, name


@asynccontextmanager
async def canned_server(status: str, content_type: str, body: bytes) -> AsyncIterator[str]:
    """A loopback HTTP server that answers every request with one fixed response (what a broken server
    does)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
            0,
        )
        await reader.readexactly(length)
        writer.write(
            f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def send_hello(cfg: Any, base_url: str) -> tuple[BaseProvider, dict[str, Any]]:
    """One plain request to ``base_url`` through a provider made for it (closed again): the provider and the raw
    reply; whatever ``send`` raises propagates."""
    provider = build_provider(cfg, base_url=base_url, api_key="k")
    try:
        raw = await provider.send(
            provider.build_request(system=SYSTEM, messages=HELLO, tools=[]), context=CallContext("t", 1)
        )
    finally:
        await provider.aclose()
    return provider, raw


async def test_unreachable_base_url_is_a_connection_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # the port is now closed: connections are refused
    with pytest.raises(ProviderCallError) as info:
        await send_hello(make_cfg("openai_chat"), f"http://127.0.0.1:{port}/v1")
    assert info.value.kind == "connection" and info.value.retryable
    assert "base_url" in str(info.value)


async def test_anthropic_error_event_after_200_is_classified_by_its_type() -> None:
    start = {
        "type": "message_start",
        "message": {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "x",
            "content": [],
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    }
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    body = (f"event: message_start\ndata: {json.dumps(start)}\n\nevent: error\ndata: {json.dumps(error)}\n\n").encode()
    async with canned_server("200 OK", "text/event-stream", body) as url:
        with pytest.raises(ProviderCallError) as info:
            await send_hello(make_cfg("anthropic", stream=True), url)
    assert info.value.kind == "overloaded" and info.value.retryable
    assert info.value.error_type == "overloaded_error"


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        ("429 Too Many Requests", "rate_limit", True),
        ("529 Overloaded", "overloaded", True),
        ("401 Unauthorized", "auth", False),
        ("404 Not Found", "not_found", False),
    ],
)
async def test_http_errors_are_classified(status: str, kind: str, retryable: bool) -> None:
    async with canned_server(status, "application/json", b'{"error": {"message": "no"}}') as url:
        with pytest.raises(ProviderCallError) as info:
            await send_hello(make_cfg("openai_chat"), url + "/v1")
    assert (info.value.kind, info.value.retryable) == (kind, retryable)


_BODIES = {
    # Keys in an order no SDK model declares, and a field no SDK version knows.
    "anthropic": {
        "usage": {"output_tokens": 3, "input_tokens": 5},
        "type": "message",
        "stop_reason": "end_turn",
        "content": [{"text": "hi", "type": "text"}],
        "role": "assistant",
        "id": "msg_1",
        "model": "m",
        "vendor_trace": {"region": "eu"},
    },
    "openai_chat": {
        "usage": {"total_tokens": 8, "prompt_tokens": 5, "completion_tokens": 3},
        "choices": [{"message": {"content": "hi", "role": "assistant"}, "finish_reason": "stop", "index": 0}],
        "object": "chat.completion",
        "model": "m",
        "created": 1,
        "id": "c1",
        "vendor_trace": {"region": "eu"},
    },
    "openai_responses": {
        "output": [
            {
                "content": [{"text": "hi", "type": "output_text", "annotations": []}],
                "role": "assistant",
                "type": "message",
                "status": "completed",
                "id": "m1",
            }
        ],
        "status": "completed",
        "usage": {"total_tokens": 8, "output_tokens": 3, "input_tokens": 5},
        "object": "response",
        "model": "m",
        "created_at": 1,
        "id": "r1",
        "vendor_trace": {"region": "eu"},
    },
}


@pytest.mark.parametrize("protocol", sorted(_BODIES))
async def test_the_reply_kept_is_the_servers_json_as_sent(protocol: str) -> None:
    """A plain call keeps the body the server sent, key order and unknown fields included, not the SDK's
    model of it dumped back (flowllm/providers/base.py, ``_body``); reading it gives the same reply."""
    sent = _BODIES[protocol]
    async with canned_server("200 OK", "application/json", json.dumps(sent).encode()) as url:
        base_url = url if protocol == "anthropic" else url + "/v1"
        provider, raw = await send_hello(make_cfg(protocol), base_url)
    assert json.dumps(raw) == json.dumps(sent)
    reply = provider.normalize(raw)
    assert reply.text == "hi"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (5, 3)


@pytest.mark.parametrize(
    ("protocol", "body", "says"),
    [
        ("anthropic", b"<html>gateway</html>", "not JSON (application/json, 20 bytes: b'<html>gateway</html>')"),
        ("openai_chat", b"", "not JSON"),
        ("openai_responses", b"[1, 2]", "not an object (a list)"),
    ],
)
async def test_a_reply_that_is_no_json_object_is_a_bad_response(protocol: str, body: bytes, says: str) -> None:
    async with canned_server("200 OK", "application/json", body) as url:
        with pytest.raises(ProviderResponseError) as info:
            await send_hello(make_cfg(protocol), url if protocol == "anthropic" else url + "/v1")
    assert info.value.kind == "bad_response" and says in str(info.value)


async def test_open_provider_runs_the_emulator_from_a_dictconfig_the_loader_typed(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump(SCRIPT))
    cfg = OmegaConf.create(
        {
            "name": "offline",
            "protocol": "openai_responses",
            "model": "m",
            "emulator_script": str(script),
            "stream": True,
        }
    )
    async with open_provider(provider_config(cfg)) as provider:
        assert isinstance(provider, Provider)
        reply = provider.normalize(
            await provider.send(
                provider.build_request(system=SYSTEM, messages=HELLO, tools=[]),
                context=CallContext("nope", 1),
            )
        )
    assert reply.text == "I could not solve this task. \\boxed{none}"


def test_errors_and_reprs_never_show_the_key() -> None:
    secret = "sk-very-secret-" + os.urandom(4).hex()
    provider = build_provider(make_cfg("anthropic"), base_url="http://127.0.0.1:9", api_key=secret)
    assert secret not in repr(provider)
    error = ProviderCallError("boom", kind="server", provider="claude", status=500)
    assert secret not in json.dumps(error.to_dict())
