"""The final reply of a saved conversation, read from the primary evidence: the wire reply the server sent.

The call node's ``output.json`` keeps the server's body (``raw_response``) as it arrived; it is normalised again
here by the protocol that produced it (named in the reply's ``flowllm_route``, else the run's provider), with
a provider whose SDK client is never used: no network, no key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowllm.config.providers import provider_config
from flowllm.errors import FlowError
from flowllm.providers.base import BaseProvider
from flowllm.providers.factory import build_provider
from flowllm.providers.replay import CALL_NODE, UNUSED_BASE_URL
from flowllm.rundir.records import NodeRecord, TurnRecord, read_artifact, read_turns

__all__ = ["FinalReply", "Normalizers", "final_reply"]

ROUTE_KEY = "flowllm_route"


@dataclass(frozen=True)
class FinalReply:
    """The last turn's reply text, or why it could not be read (``problem``), and the file it came from."""

    text: str | None
    file: Path | None
    problem: str | None = None


class Normalizers:
    """One never-connected provider per wire protocol, built on first use."""

    def __init__(self, default: dict[str, Any]) -> None:
        self._default = default  # the run's provider section (protocol, model, tool protocol...)
        self._built: dict[str, BaseProvider] = {}

    def for_reply(self, raw: dict[str, Any]) -> BaseProvider:
        route = raw.get(ROUTE_KEY) if isinstance(raw.get(ROUTE_KEY), dict) else None
        protocol = str((route or {}).get("protocol") or self._default.get("protocol") or "")
        found = self._built.get(protocol)
        if found is None:
            base = self._default if self._default.get("protocol") == protocol else {"name": protocol}
            cfg = {**base, "protocol": protocol, "emulator_script": None, "run_dir": None}
            if route and route.get("model"):
                cfg["model"] = route["model"]
            found = self._built[protocol] = build_provider(
                provider_config(_plain_provider(cfg)), base_url=UNUSED_BASE_URL
            )
        return found


def _plain_provider(cfg: dict[str, Any]) -> dict[str, Any]:
    """Only the fields a normaliser reads: a replay's or a fork's own settings are not a wire protocol's."""
    keep = ("name", "protocol", "model", "tool_protocol", "content_format", "accepts", "cache", "stream", "wire")
    return {k: v for k, v in cfg.items() if k in keep and v is not None}


def _call_node(turn: TurnRecord) -> NodeRecord | None:
    for node in turn.nodes:
        if node.name == CALL_NODE:
            return node
    return None


def final_reply(conversation: Path, normalizers: Normalizers) -> FinalReply:
    """The text of the last saved reply under ``conversation`` (a folder of ``turn_NNN`` folders)."""
    turns, _ = read_turns(conversation)
    for turn in reversed(turns):
        node = _call_node(turn)
        if node is None:
            continue
        path = node.path / "output.json"
        artifact = read_artifact(path)
        if not artifact.ok or not isinstance(artifact.value, dict):
            return FinalReply(None, path, artifact.error or "not a JSON object")
        raw = artifact.value.get("raw_response")
        if not isinstance(raw, dict):
            continue  # the call failed on this turn: no reply was saved
        try:
            response = normalizers.for_reply(raw).normalize(raw)
        except FlowError as exc:
            return FinalReply(None, path, str(exc))
        return FinalReply(response.text, path)
    return FinalReply(None, None, "no saved reply")
