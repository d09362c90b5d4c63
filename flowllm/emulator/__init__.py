"""A loopback emulator of the Anthropic Messages, OpenAI Chat Completions and OpenAI Responses protocols.

It lets the real SDK code path run offline: replies come from a per-task script (see ``script.py``), requests
are validated as strictly as the real APIs do, and every id and count is deterministic.
"""

from flowllm.emulator.script import NO_SCRIPTED_REPLY, Reply, Script, ScriptError
from flowllm.emulator.server import Emulator, EmulatorApp, RequestRecord

__all__ = ["NO_SCRIPTED_REPLY", "Emulator", "EmulatorApp", "Reply", "RequestRecord", "Script", "ScriptError"]
