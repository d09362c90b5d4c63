"""Shared fixtures: one emulator for the module, provider configs pointing at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from flowllm.config.provider_schema import CacheConfig, ProviderConfig, ThinkingConfig
from flowllm.emulator import Emulator
from flowllm.providers import build_provider
from flowllm.providers.base import BaseProvider

PROTOCOLS = ("anthropic", "openai_chat", "openai_responses")

SCRIPT: dict[str, Any] = {
    "default": [{"text": "I could not solve this task. \\boxed{none}"}],
    "tasks": {
        # Three turns of native tool use with thinking: call, call again, answer from both results.
        "calc": [
            {
                "thinking": "I need to add first.",
                "text": "Let me add.",
                "tool_calls": [{"name": "tool-math-calculate", "input": {"expression": "2+2"}}],
            },
            {
                "thinking": "",  # an empty thinking block still has to go back with its signature
                "tool_calls": [
                    {"name": "tool-math-calculate", "input": {"expression": "${last_tool_result}*10"}},
                    {"name": "tool-files-read_file", "input": {"path": "notes.txt"}},
                ],
            },
            {"thinking": "Both results are in.", "text": "\\boxed{${tool_result_2}} (${tool_result_3})"},
        ],
        # The engine's xml protocol: tool calls in text, results back as user text.
        "xml": [
            {"text": "<use_mcp_tool>\n<server_name>tool-math</server_name>\n</use_mcp_tool>"},
            {"text": "The answer is \\boxed{${last_tool_result}}"},
        ],
    },
}

TOOLS = [
    {
        "server": "tool-math",
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
    {
        "server": "tool-files",
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
]
SYSTEM = [{"type": "text", "text": "You are a careful assistant."}]


def make_cfg(protocol: str = "anthropic", **overrides: Any) -> ProviderConfig:
    thinking = overrides.pop("thinking", "disabled")
    cfg = ProviderConfig(
        name="offline",
        protocol=protocol,
        model="flowllm-emulator",
        thinking=ThinkingConfig(mode=thinking, budget_tokens=2000),
        cache=CacheConfig(enabled=overrides.pop("cache", True)),
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with Emulator(SCRIPT) as emu:
        yield emu


@pytest.fixture
async def connect(emulator: Emulator) -> AsyncIterator[Any]:
    """``connect(protocol, **cfg overrides)`` -> a provider on the module's emulator, closed after the
    test."""
    opened: list[BaseProvider] = []

    def factory(protocol: str = "anthropic", **overrides: Any) -> BaseProvider:
        cfg = make_cfg(protocol, **overrides)
        base = emulator.base_url if protocol == "anthropic" else emulator.openai_base_url
        provider = build_provider(cfg, base_url=base, api_key="test-key")
        opened.append(provider)
        return provider

    yield factory
    for provider in opened:
        await provider.aclose()
