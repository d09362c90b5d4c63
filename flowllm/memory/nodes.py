"""recall_memory and remember: long-term memory as two hook nodes, switched on by ``memory.enabled=true``.

* ``RecallMemory`` (``on_system_prompt``): embeds the task (the first text of the task message, so the query
  stays the same every turn, compacted or not), takes the ``top_k`` memories whose similarity reaches
  ``min_score``, and appends them to the system prompt inside a ``<long_term_memory>`` block. By default it
  only sees memories written before this run started, so what a task recalls does not depend on which other
  tasks of the run happened to finish first (and the three runners record the same thing).
* ``Remember`` (``after_turn``): on the task's last turn (the model called no tool, or the turn limit's summary
  turn) it stores the task with its final answer (``answer``) and every ``<remember>...</remember>`` fact the
  model wrote during the task (``tagged``).

Both open the store lazily from ``memory.path``, so nothing outside the pipeline config has to pass it in.
Only the agents listed in ``agents`` (the main agent by default) use memory.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from flowllm.agent.answer import extract_answer
from flowllm.core.types import Block, Message, ModelResponse, text_block
from flowllm.engine import Node, TurnContext
from flowllm.errors import ConfigError
from flowllm.memory.embeddings import Embedder, make_embedder
from flowllm.memory.store import MemoryStore
from flowllm.parsing import BadToolCall, ToolCall

MEMORY_TAG = "long_term_memory"
_TAGGED = re.compile(r"<remember>(.*?)</remember>", re.DOTALL | re.IGNORECASE)
KINDS = ("answer", "tagged")


def task_text(messages: list[Message]) -> str:
    """The task: the first text block of the first message (a compaction summary comes later, in its own block)."""
    if not messages:
        return ""
    for block in messages[0]["content"]:
        if block.get("type") == "text":
            return str(block.get("text", ""))
    return ""


class _MemoryNode:
    """The store and embedder, opened on first use and shared by the node's calls."""

    def __init__(self, path: str, namespace: str, embedding: dict[str, Any] | None, agents: list[str] | None) -> None:
        self.path = path
        self.namespace = namespace
        self.embedding = dict(embedding or {})
        self.agents = set(agents or ["main"])
        self._store: MemoryStore | None = None
        self._embedder: Embedder | None = None
        make_embedder(self.embedding)  # a wrong embedding config fails when the pipeline is built

    @property
    def store(self) -> MemoryStore:
        if self._store is None:
            self._store = MemoryStore(self.path)
        return self._store

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = make_embedder(self.embedding)
        return self._embedder


class RecallMemory(_MemoryNode, Node):
    """(system, messages) -> (system, recalled): relevant memories appended to the system prompt."""

    outputs = ("system", "recalled")

    def __init__(
        self,
        path: str,
        namespace: str = "default",
        top_k: int = 5,
        min_score: float = 0.25,
        include_current_run: bool = False,
        max_block_chars: int = 4000,
        embedding: dict[str, Any] | None = None,
        agents: list[str] | None = None,
    ) -> None:
        super().__init__(path, namespace, embedding, agents)
        if top_k < 1:
            raise ConfigError(f"memory.top_k must be at least 1, not {top_k}")
        self.top_k = top_k
        self.min_score = min_score
        self.max_block_chars = max_block_chars
        # Built once per run, before its first task: the run's own memories stay out unless asked for.
        self.cutoff = None if include_current_run else time.time()
        self._vectors: dict[str, list[float]] = {}

    async def _query_vector(self, text: str) -> list[float]:
        if text not in self._vectors:
            self._vectors[text] = (await self.embedder.embed([text]))[0]
        return self._vectors[text]

    def block(self, texts: list[str]) -> str:
        lines = []
        used = 0
        for text in texts:
            safe = re.sub(rf"<\s*/?\s*{MEMORY_TAG}", "&lt;" + MEMORY_TAG, text)  # a memory cannot end the block
            if used + len(safe) > self.max_block_chars:
                break
            lines.append(f"- {safe}")
            used += len(safe)
        intro = "Notes from earlier tasks, most relevant first. Use them when they help; they may be outdated."
        return f"<{MEMORY_TAG}>\n{intro}\n" + "\n".join(lines) + f"\n</{MEMORY_TAG}>"

    async def run(self, ctx: TurnContext, system: list[Block], messages: list[Message]) -> dict[str, Any]:
        query = task_text(messages)
        if ctx.agent not in self.agents or not query.strip():
            return {"system": system, "recalled": []}
        vector = await self._query_vector(query)
        found = await asyncio.to_thread(
            self.store.search,
            self.namespace,
            self.embedder.name,
            vector,
            top_k=self.top_k,
            min_score=self.min_score,
            created_before=self.cutoff,
        )
        if not found:
            return {"system": system, "recalled": []}
        return {
            "system": [*system, text_block(self.block([m.text for m in found]))],
            "recalled": [m.to_dict() for m in found],
        }


class Remember(_MemoryNode, Node):
    """(next_messages, response, tool_calls, bad_tool_calls) -> remembered: facts stored at the task's end."""

    outputs = ("remembered",)

    def __init__(
        self,
        path: str,
        namespace: str = "default",
        remember: list[str] | None = None,
        max_turns: int | None = None,
        embedding: dict[str, Any] | None = None,
        agents: list[str] | None = None,
    ) -> None:
        super().__init__(path, namespace, embedding, agents)
        kinds = list(remember if remember is not None else KINDS)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ConfigError(f"memory.remember: unknown kinds {sorted(unknown)} (known: {', '.join(KINDS)})")
        self.kinds = kinds
        self.max_turns = max_turns

    def facts(self, history: list[Message], response: ModelResponse) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        if "tagged" in self.kinds:
            for message in history:
                if message["role"] != "assistant":
                    continue
                for block in message["content"]:
                    if block.get("type") == "text":
                        found.extend(("tagged", m.strip()) for m in _TAGGED.findall(str(block.get("text", ""))))
        if "answer" in self.kinds:
            answer = extract_answer(response.text).strip() or response.text.strip()[-300:]
            task = task_text(history).strip()
            if answer and task:
                found.append(("answer", f"Task: {task[:600]}\nAnswer: {answer}"))
        unique: dict[str, str] = {}  # text -> kind, first occurrence wins
        for kind, text in found:
            if text and text not in unique:
                unique[text] = kind
        return [(kind, text) for text, kind in unique.items()]

    async def run(
        self,
        ctx: TurnContext,
        next_messages: list[Message],
        response: ModelResponse,
        tool_calls: list[ToolCall],
        bad_tool_calls: list[BadToolCall],
    ) -> dict[str, Any]:
        last_turn = not tool_calls and not bad_tool_calls
        if self.max_turns is not None and ctx.turn > self.max_turns:
            last_turn = True  # the turn limit's summary turn ends the task whatever it says
        if ctx.agent not in self.agents or not last_turn:
            return {"remembered": []}
        facts = self.facts(next_messages, response)
        if facts:
            vectors = await self.embedder.embed([t for _, t in facts])
            for kind in dict.fromkeys(k for k, _ in facts):
                pairs = [(t, v) for (k, t), v in zip(facts, vectors, strict=True) if k == kind]
                await asyncio.to_thread(
                    self.store.add,
                    self.namespace,
                    self.embedder.name,
                    [t for t, _ in pairs],
                    [v for _, v in pairs],
                    kind=kind,
                    source=ctx.task_id,
                )
        return {"remembered": [{"kind": k, "text": t} for k, t in facts]}
