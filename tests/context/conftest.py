"""Shared pieces: a composed config, a tool backend for synthetic work, and an emulator with long scripts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from flowllm.config.provider_schema import ProviderConfig, ThinkingConfig
from flowllm.config.schema import register_configs
from flowllm.core.forwarding import ToolBackendDefaults
from flowllm.core.types import ToolResult, ToolSpec
from flowllm.emulator import Emulator
from flowllm.providers import build_provider
from flowllm.providers.base import BaseProvider
from flowllm.resources import CONFIG_DIR

PROTOCOLS = ("anthropic", "openai_chat", "openai_responses")
LONG_TURNS = 12
SUMMARY = "Pages 1 to 3 of the archive were read; each lists shipments by week and carrier."
FILLER = "The archive lists shipments by week, carrier, weight and destination. " * 30  # ~2 KB per result


def _native_long() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [
        {
            "thinking": f"Step {turn}: fetch page {turn}.",
            "text": f"Reading page {turn}.",
            "tool_calls": [{"name": "tool-archive-read_page", "input": {"page": turn}}],
        }
        for turn in range(1, LONG_TURNS + 1)
    ]
    entries.append({"thinking": "Done.", "text": "The last page said ${last_tool_result}. \\boxed{done}"})
    return entries


def _xml_long() -> list[dict[str, Any]]:
    call = (
        "<use_mcp_tool>\n<server_name>tool-archive</server_name>\n<tool_name>read_page</tool_name>\n"
        '<arguments>{"page": 1}</arguments>\n</use_mcp_tool>'
    )
    return [{"text": f"Reading.\n{call}"} for _ in range(LONG_TURNS)] + [{"text": "\\boxed{done}"}]


SCRIPT: dict[str, Any] = {
    "default": [{"text": "Summary: pages were read; their shipments were listed. \\boxed{none}"}],
    "tasks": {
        "native-long": _native_long(),
        "xml-long": _xml_long(),
        # compact_history's summary calls (agent "compactor"), scripted per task like a sub-agent's.
        "native-long/compactor": [{"text": SUMMARY}],
        "xml-long/compactor": [{"text": SUMMARY}],
        "snap": [
            {"text": "Taking a picture.", "tool_calls": [{"name": "tool-camera-snap", "input": {}}]},
            {"text": "I looked at it. \\boxed{seen}"},
        ],
        # A model that keeps writing after its answer and invents the user's next message.
        "invents-user": [{"text": "It is \\boxed{4}.\n\nUser: thanks! Now answer \\boxed{5} instead.\nAssistant: ok"}],
    },
}


class ArchiveTools(ToolBackendDefaults):
    """A tool backend standing in for a real server: ``read_page`` returns a long page (the point is size)."""

    def __init__(self) -> None:
        self.calls = 0

    async def list_tools(self) -> list[ToolSpec]:
        return [
            {
                "server": "tool-archive",
                "name": "read_page",
                "description": "Read one page of the shipment archive.",
                "input_schema": {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
            }
        ]

    async def call(
        self, server: str | None, name: str, arguments: dict[str, Any], *, call_id: str, timeout_s: float
    ) -> ToolResult:
        self.calls += 1
        page = arguments.get("page")
        return ToolResult(call_id=call_id, server=server, name=name, content=f"page {page}: {FILLER}")


@pytest.fixture(scope="session")
def compose_cfg() -> Any:
    """``compose_cfg(*overrides)``: the app's config as Hydra composes it."""
    register_configs()

    def make(*overrides: str) -> Any:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    return make


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with Emulator(SCRIPT) as emu:
        yield emu


@pytest.fixture
async def connect(emulator: Emulator) -> AsyncIterator[Any]:
    """``connect(protocol, tool_protocol=..., thinking=...)`` -> a provider on the module's emulator."""
    opened: list[BaseProvider] = []

    def factory(
        protocol: str, tool_protocol: str = "native", thinking: str = "disabled", api_key: str = "test-key"
    ) -> BaseProvider:
        cfg = ProviderConfig(
            name="offline",
            protocol=protocol,
            model="flowllm-emulator",
            tool_protocol=tool_protocol,
            thinking=ThinkingConfig(mode=thinking, budget_tokens=1024),
        )
        base = emulator.base_url if protocol == "anthropic" else emulator.openai_base_url
        # The emulator caches prompts per key (emulator/prompt_cache.py): a test that compares two runs of the
        # same conversation gives each its own key, so the second does not read what the first wrote.
        provider = build_provider(cfg, base_url=base, api_key=api_key)
        opened.append(provider)
        return provider

    yield factory
    for provider in opened:
        await provider.aclose()
