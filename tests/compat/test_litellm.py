"""flowllm through LiteLLM's proxy: the Anthropic Messages, OpenAI Responses and OpenAI Chat protocols, streamed
and plain, both tool protocols, multi-turn tool loops with one and two tool results, the summary turn, four
tasks at once, and a refused field named with its setting.

Every run is ``python -m flowllm`` as a user types it, pointed at the proxy; the backends behind the proxy are
flowllm emulators speaking OpenAI Chat (tests/compat/litellm_proxy.py). Protocol behaviour is asserted
(complete replies, parsed calls, tool results sent back, usage), never accuracy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowllm.emulator import Emulator

from .conftest import run_flowllm
from .litellm_proxy import MASTER_KEY, NATIVE_SCRIPT, TEXT_SCRIPT, LiteLLMProxy, start_proxy

KEY_ENV = "FLOWLLM_COMPAT_PROXY_KEY"
TASK = "sample-01-csv-revenue"


@pytest.fixture(scope="module")
def proxy(log_dir: Path) -> Iterator[LiteLLMProxy]:
    with Emulator(NATIVE_SCRIPT) as native, Emulator(TEXT_SCRIPT) as text:
        server = start_proxy({"emu-native": native.openai_base_url, "emu-text": text.openai_base_url}, log_dir)
        try:
            yield server
        finally:
            server.stop()


PROTOCOLS = {
    # conf/provider name, its base URL on the proxy, what else the shipped config needs for this backend
    "anthropic": ("claude", "root", []),
    "responses": ("gpt5", "v1", ["provider.wire.reasoning_effort=false"]),
    "chat": ("local", "v1", []),
}


def overrides(proxy: LiteLLMProxy, protocol: str, tool_protocol: str, stream: bool, *extra: str) -> list[str]:
    name, base, needs = PROTOCOLS[protocol]
    return [
        f"provider={name}",
        f"provider.base_url={proxy.root if base == 'root' else proxy.openai_base_url}",
        f"provider.model={'emu-native' if tool_protocol == 'native' else 'emu-text'}",
        f"provider.api_key_env={KEY_ENV}",
        f"provider.tool_protocol={tool_protocol}",
        f"provider.stream={str(stream).lower()}",
        "preflight.providers=false",  # a /models listing is not what is tested here
        "progress=false",
        *needs,
        *extra,
    ]


def run(tmp_path: Path, args: list[str]) -> tuple[Any, dict[str, Any]]:
    run_dir = tmp_path / "run"
    proc = run_flowllm(run_dir, *args, env={KEY_ENV: MASTER_KEY})
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return proc, summary


def result(tmp_path: Path, task: str = TASK) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "tasks" / task / "result.json").read_text())


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_protocol", ["native", "xml"])
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_tool_loop_past_turn_two(
    proxy: LiteLLMProxy, tmp_path: Path, protocol: str, tool_protocol: str, stream: bool
) -> None:
    proc, _ = run(tmp_path, overrides(proxy, protocol, tool_protocol, stream, f"dataset.task_ids=[{TASK}]"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = result(tmp_path)
    assert done["status"] == "completed" and done["error"] is None, done
    # Three turns: one call, two calls (two results sent back together), the answer from the last result.
    assert (done["turns"], done["tool_calls"], done["bad_tool_calls"], done["failed_tool_calls"]) == (3, 3, 0, 0)
    assert done["answer"] in ("42", "42.0"), done
    assert done["usage"]["input_tokens"] > 0 and done["usage"]["output_tokens"] > 0


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_the_summary_turn(proxy: LiteLLMProxy, tmp_path: Path, protocol: str) -> None:
    # One turn of tools, then the summary prompt joins the tool results in one user message.
    args = overrides(proxy, protocol, "native", False, f"dataset.task_ids=[{TASK}]", "agent.max_turns=1")
    proc, _ = run(tmp_path, args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = result(tmp_path)
    assert done["status"] == "completed" and done["stop"] == "max_turns" and done["turns"] == 2, done


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_four_tasks_at_once(proxy: LiteLLMProxy, tmp_path: Path, protocol: str) -> None:
    args = overrides(
        proxy,
        protocol,
        "native",
        True,
        "dataset.limit=4",
        "experiment.max_concurrent=4",
        "provider.rate_limit.max_in_flight=4",
    )
    proc, summary = run(tmp_path, args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["completed"] == 4 and summary["failed"] == 0, summary


def test_a_refused_reasoning_field_fails_with_the_setting_to_change(proxy: LiteLLMProxy, tmp_path: Path) -> None:
    # gpt5.yaml as shipped sends reasoning.effort, which LiteLLM refuses for a backend it knows no reasoning of.
    args = [a for a in overrides(proxy, "responses", "native", False) if "reasoning_effort" not in a]
    proc, summary = run(tmp_path, [*args, f"dataset.task_ids=[{TASK}]"])
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]  # every task failed
    error = result(tmp_path)["error"]
    assert "reasoning" in error and "set provider.wire.reasoning_effort=false" in error, error
    assert summary["failed"] == 1
