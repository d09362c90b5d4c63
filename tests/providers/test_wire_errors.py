"""Errors that name the URL and the fix, and usage that says when it is estimated, over real loopback HTTP.

The servers here are a few lines of asyncio speaking raw HTTP/1.1, so they can misbehave the way real ones
do: close the connection before answering, end a stream before its final event once a second request
arrives (llama.cpp with one slot), or report a prompt of zero tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from flowllm.core.interfaces import CallContext
from flowllm.emulator import Emulator
from flowllm.providers import build_provider
from flowllm.providers.base import BaseProvider
from flowllm.providers.errors import ProviderCallError, refused_field_hint

from .conftest import SYSTEM, make_cfg

HELLO = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> dict[str, Any]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    body = await reader.readexactly(length)
    return dict(json.loads(body))


def chunk(**delta: Any) -> bytes:
    event = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    event["choices"] = [{"index": 0, "delta": delta, "finish_reason": None}]
    return f"data: {json.dumps(event)}\n\n".encode()


@asynccontextmanager
async def http_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()


def chat(base_url: str, **overrides: Any) -> BaseProvider:
    return build_provider(make_cfg("openai_chat", **overrides), base_url=base_url, api_key="k")


async def call(provider: BaseProvider, task: str = "t") -> Any:
    try:
        request = provider.build_request(system=SYSTEM, messages=HELLO, tools=[])
        return provider.normalize(await provider.send(request, context=CallContext(task, 1)))
    finally:
        await provider.aclose()


async def test_a_connection_dropped_mid_request_names_the_url() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async with http_server(hang_up) as base:
        with pytest.raises(ProviderCallError) as info:
            await call(chat(base))
    text = str(info.value)
    assert info.value.kind == "connection" and info.value.retryable
    assert f"{base}/chat/completions" in text and "dropped mid-request" in text


async def test_nothing_listening_says_the_server_is_not_running() -> None:
    async with http_server(lambda r, w: asyncio.sleep(0)) as base:
        pass  # closed: connections are now refused
    with pytest.raises(ProviderCallError) as info:
        await call(chat(base))
    assert info.value.kind == "connection"
    assert base in str(info.value) and "is the server running" in str(info.value)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_base_url_without_v1_gets_the_fix_in_the_404(stream: bool) -> None:
    with Emulator({"default": [{"text": "hi"}]}) as emulator, pytest.raises(ProviderCallError) as info:
        await call(chat(emulator.base_url, stream=stream))  # the OpenAI API lives under /v1
    assert info.value.kind == "not_found" and info.value.status == 404
    assert f"try provider.base_url={emulator.base_url.rstrip('/')}/v1" in str(info.value)


def cut_streams(together: int) -> Handler:
    """A one-slot server: each stream starts, then all end without a final event once ``together`` arrived."""
    arrived: list[asyncio.StreamWriter] = []
    ready = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        writer.write(chunk(role="assistant", content="Hel"))
        await writer.drain()
        arrived.append(writer)
        if len(arrived) >= together:
            ready.set()
        await ready.wait()
        writer.close()  # the body ends cleanly, but with no finish_reason and no [DONE]

    return handler


@pytest.mark.parametrize("together", [1, 2])
async def test_a_stream_cut_while_another_request_runs_names_the_setting(together: int) -> None:
    async with http_server(cut_streams(together)) as base:
        shared = chat(base, stream=True)
        request = shared.build_request(system=SYSTEM, messages=HELLO, tools=[])
        sends = [shared.send(request, context=CallContext(f"t{i}", 1)) for i in range(together)]
        try:
            results = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), timeout=60)
        finally:
            await shared.aclose()
    for result in results:
        assert isinstance(result, ProviderCallError) and result.kind == "truncated"
        # Alone, the cut is reported as it is; with another request in flight, with its cause and the setting.
        assert ("provider.rate_limit.max_in_flight" in str(result)) == (together > 1), str(result)


def body_with_usage(usage: dict[str, int] | None) -> Handler:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body: dict[str, Any] = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
        }
        if usage is not None:
            body["usage"] = usage
        data = json.dumps(body).encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
        writer.write(head.encode() + data)
        await writer.drain()
        writer.close()

    return answer


@pytest.mark.parametrize(
    ("usage", "estimated"),
    [
        ({"prompt_tokens": 21, "completion_tokens": 3, "total_tokens": 24}, False),
        ({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, True),  # LiteLLM's streamed zeros
        (None, True),
    ],
)
async def test_usage_that_cannot_be_true_is_estimated_on_the_prompt_text(
    usage: dict[str, int] | None, estimated: bool
) -> None:
    async with http_server(body_with_usage(usage)) as base:
        response = await call(chat(base))
    assert response.usage.estimated is estimated
    if estimated:
        prompt = len(SYSTEM[0]["text"]) + len("Say hello.")
        assert response.usage.input_tokens == -(-prompt // 4)  # the text sent, not the JSON around it
        assert response.usage.output_tokens == 2  # "Hello!"
    else:
        assert (response.usage.input_tokens, response.usage.output_tokens) == (21, 3)


@pytest.mark.parametrize(
    ("message", "setting"),
    [
        # LiteLLM 1.108's proxy in front of a chat backend, for a Responses request with reasoning on.
        (
            "litellm.UnsupportedParamsError: flowllm-emulator doesn't support `reasoning.effort` (its model cost map "
            "entry lacks `supports_reasoning`). To drop unsupported params set `litellm.drop_params = True`",
            "provider.wire.reasoning_effort=false",
        ),
        ("Unrecognized request argument supplied: stream_options", "provider.wire.stream_usage=false"),
        ("Extra inputs are not permitted: parallel_tool_calls", "provider.wire.parallel_tool_calls=null"),
        ("Unknown parameter: 'store'.", "provider.wire.store=null"),
    ],
)
def test_a_refused_optional_field_names_the_setting_that_leaves_it_out(message: str, setting: str) -> None:
    assert refused_field_hint(message).endswith(f": set {setting})")


def test_other_bad_requests_are_left_as_the_server_said() -> None:
    for message in ("messages: field required", "the reasoning was sound, the JSON was not"):
        assert refused_field_hint(message) == message
