"""LiteLLM's proxy for the compatibility suite, in front of OpenAI Chat backends on 127.0.0.1.

The proxy runs from its own virtual environment (``FLOWLLM_COMPAT_LITELLM``: the ``litellm`` command of an
environment with ``litellm[proxy]``), with a config that serves two model names, each routed to a flowllm
emulator speaking OpenAI Chat: ``emu-native`` answers with native tool calls, ``emu-text`` with
``<use_mcp_tool>`` calls in its text. flowllm then talks to the proxy in the Anthropic Messages, OpenAI
Responses and OpenAI Chat protocols, which LiteLLM translates into Chat requests for the backend: what is tested
is that LiteLLM accepts what flowllm sends in each protocol and that flowllm reads what LiteLLM answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .server import CompatSetupError, free_port, stop_process, wait_until_ready

LITELLM_ENV = "FLOWLLM_COMPAT_LITELLM"
MASTER_KEY = "sk-flowllm-compat-0123456789abcdef"  # the proxy refuses to start without one; loopback only
START_TIMEOUT_S = 300.0

# Three turns whatever the task: one call, then two calls in one turn (two tool results in the next request),
# then the answer from the last result. The emulator picks replies by turn; LiteLLM forwards no flowllm header.
NATIVE_SCRIPT = {
    "default": [
        {"text": "I'll compute it.", "tool_calls": [{"name": "tool-math-calculate", "input": {"expression": "6*7"}}]},
        {
            "text": "Two checks.",
            "tool_calls": [
                {"name": "tool-math-calculate", "input": {"expression": "40+2"}},
                {"name": "tool-math-calculate", "input": {"expression": "84/2"}},
            ],
        },
        {"text": "The answer is \\boxed{${last_tool_result}}"},
    ]
}


def _xml_call(expression: str) -> str:
    return (
        "<use_mcp_tool>\n<server_name>tool-math</server_name>\n<tool_name>calculate</tool_name>\n"
        f'<arguments>\n{{"expression": "{expression}"}}\n</arguments>\n</use_mcp_tool>'
    )


TEXT_SCRIPT = {
    "default": [
        {"text": "I'll compute it.\n" + _xml_call("6*7")},
        {"text": "Two checks.\n" + _xml_call("40+2") + "\n" + _xml_call("84/2")},
        {"text": "The answer is \\boxed{${last_tool_result}}"},
    ]
}


def litellm_command() -> str:
    command = os.environ.get(LITELLM_ENV, "")
    if not command or not Path(command).exists():
        raise CompatSetupError(f"set {LITELLM_ENV} to the litellm command of an environment with litellm[proxy]")
    return command


def litellm_version(command: str) -> str:
    python = Path(command).with_name("python")
    code = "import importlib.metadata as m; print(m.version('litellm'))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


@dataclass
class LiteLLMProxy:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def root(self) -> str:
        """The proxy's root: Anthropic clients add /v1/messages themselves."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.root}/v1"

    def stop(self) -> None:
        stop_process(self.process)


def start_proxy(backends: dict[str, str], log_dir: Path) -> LiteLLMProxy:
    """Start ``litellm --config`` with one model name per backend (name -> OpenAI base URL)."""
    command = litellm_command()
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {"model": "openai/flowllm-emulator", "api_base": url, "api_key": "emulator"},
            }
            for name, url in backends.items()
        ],
        "general_settings": {"master_key": MASTER_KEY},
    }
    config_path = log_dir / "litellm.json"  # JSON is YAML: the proxy reads it as its config
    config_path.write_text(json.dumps(config))
    log_path = log_dir / f"litellm-{port}.log"
    # No download at start (the model cost map ships with the package) and no telemetry.
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    cmd = [command, "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    proxy = LiteLLMProxy(process, port, log_path)
    request = urllib.request.Request(
        f"{proxy.openai_base_url}/models", headers={"Authorization": f"Bearer {MASTER_KEY}"}
    )
    wait_until_ready(process, request, log_path, "the LiteLLM proxy", proxy.stop, START_TIMEOUT_S)
    return proxy
