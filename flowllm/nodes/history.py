"""trim_history: keep the context small by blanking old tool results (the request's view only).

Two rules, both applied to a copy (the history itself is never changed):

* ``keep_tool_result``: all but the latest N tool-result messages are blanked, whatever their size.
* ``max_context_tokens`` (optional): the request must fit a token budget. Counting uses the provider's count of
  the last call when the turn knows it (``last_usage``), else an estimate, and the decision records which
  (``context_budget``). Over budget, the oldest tool results are blanked first (text and images), then the
  oldest whole turns (an assistant message and the tool results answering it) are dropped. The task message
  and the last turn (the latest assistant message and what follows it) are never touched, and every remaining
  ``tool_use`` keeps its ``tool_result``, so the request stays valid for every protocol.

With ``max_context_tokens`` set the node also reads ``system``, ``tools`` and ``last_usage`` and produces
``context_budget``; without it its ports are exactly the historical ones, so default runs record the same files.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from flowllm.core.types import Block, Message, ToolSpec, Usage
from flowllm.engine import Node, TurnContext
from flowllm.errors import ConfigError
from flowllm.nodes.tokens import TokenCount, count_context, last_assistant_index, message_tokens

PLACEHOLDER = "Tool result is omitted to save tokens."


def is_tool_result_message(message: Message) -> bool:
    if message.get("meta", {}).get("kind") == "tool_results":
        return True
    return message["role"] == "user" and any(b.get("type") == "tool_result" for b in message["content"])


def _blank(block: Block) -> Block:
    if block.get("type") == "tool_result":
        return {**block, "content": [{"type": "text", "text": PLACEHOLDER}]}
    if block.get("type") == "text":
        return {**block, "text": PLACEHOLDER}
    return copy.deepcopy(block)


def trim_tool_results(messages: list[Message], keep: int, block: int = 1) -> list[Message]:
    """Replace the content of all but the last ``keep`` tool-result messages with a placeholder, ``block`` at
    a time.

    With ``block`` > 1 the old results are blanked in whole blocks: between ``keep`` and ``keep + block - 1``
    stay whole, so the prompt's prefix changes once every ``block`` tool results instead of every turn, and
    the turns between read the cache (flowllm/nodes/cache.py). The first user message (the task) is never
    touched, and blocks keep their type and ids, so every tool_use still has its tool_result and the request
    stays valid for every protocol. ``keep < 0`` keeps all.
    """
    if keep < 0:
        return messages
    positions = [i for i, m in enumerate(messages) if i > 0 and is_tool_result_message(m)]
    over = max(len(positions) - keep, 0)
    old = positions[: over // max(block, 1) * max(block, 1)]
    if not old:
        return messages
    trimmed = list(messages)
    for i in old:
        message = messages[i]
        blanked: Message = {"role": message["role"], "content": [_blank(b) for b in message["content"]]}
        if "meta" in message:
            blanked["meta"] = {**message["meta"], "trimmed": True}
        trimmed[i] = blanked
    return trimmed


def _blank_fully(message: Message) -> Message:
    """A tool-result message with every text and media part replaced by the placeholder (ids kept)."""
    blocks: list[Block] = []
    for block in message["content"]:
        if block.get("type") == "tool_result":
            blocks.append({**block, "content": [{"type": "text", "text": PLACEHOLDER}]})
        elif block.get("type") == "text":
            blocks.append({**block, "text": PLACEHOLDER})
        elif block.get("type") in ("image", "audio", "document", "file"):
            continue  # a media block of the text protocol: its placeholder text says enough
        else:
            blocks.append(copy.deepcopy(block))
    blanked: Message = {"role": message["role"], "content": blocks}
    blanked["meta"] = {**message.get("meta", {}), "trimmed": True}
    return blanked


def _is_blank(message: Message) -> bool:
    return bool(message.get("meta", {}).get("trimmed"))


@dataclass
class BudgetDecision:
    """What trim_history did to fit the budget, recorded as its ``context_budget`` output."""

    budget: int
    before: TokenCount
    after: TokenCount
    blanked: list[int] = field(default_factory=list)  # history indices of tool results blanked for the budget
    dropped_turns: int = 0  # whole old turns left out after every tool result was blanked
    over_budget: bool = False  # still over: only the task and the last turn are left

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["before"] = self.before.to_dict()
        data["after"] = self.after.to_dict()
        return data


def fit_budget(
    messages: list[Message],
    system: list[Block],
    tools: list[ToolSpec],
    budget: int,
    *,
    keep: int = -1,
    last_usage: Usage | None = None,
    block: int = 1,
) -> tuple[list[Message], BudgetDecision]:
    """The request view of ``messages`` that fits ``budget`` tokens, and the decision taken.

    Tool results are blanked for the budget ``block`` at a time (the oldest first), so the prompt's prefix
    changes once every ``block`` results, not on every turn over the budget."""

    def sent_before(prefix: list[Message]) -> list[Message]:
        # What the previous turn sent: the same rules on the shorter history, by estimate (deterministic, and
        # on the high side, so the difference we estimate on top of the provider's count errs high too).
        return fit_budget(prefix, system, tools, budget, keep=keep, block=block)[0]

    request = trim_tool_results(messages, keep, block)
    before = count_context(system, request, tools, last_usage, sent_before)
    sizes = [message_tokens(m) for m in request]
    # Everything except the messages (system, tools, the provider's correction) is a constant offset.
    offset = before.tokens - sum(sizes)
    decision = BudgetDecision(budget=budget, before=before, after=before)
    if before.tokens <= budget:
        return request, decision
    last = last_assistant_index(request)
    protected_from = last if last is not None and last > 0 else len(request)
    request = list(request)
    total = before.tokens
    for i in range(1, protected_from):
        if total <= budget and len(decision.blanked) % max(block, 1) == 0:
            break
        if is_tool_result_message(request[i]) and not _is_blank(request[i]):
            request[i] = _blank_fully(request[i])
            new_size = message_tokens(request[i])
            total -= sizes[i] - new_size
            sizes[i] = new_size
            decision.blanked.append(i)
    # Then whole turns, oldest first: an assistant message and the user message that answers it go together,
    # so roles keep alternating and no tool_use loses its tool_result.
    start = 1
    while total > budget and start + 1 < protected_from:
        if request[start]["role"] != "assistant" or request[start + 1]["role"] != "user":
            break
        total -= sizes[start] + sizes[start + 1]
        start += 2
        decision.dropped_turns += 1
    if decision.dropped_turns:
        request = [request[0], *request[start:]]
        sizes = [sizes[0], *sizes[start:]]
    after_tokens = offset + sum(sizes)
    decision.after = TokenCount(
        tokens=after_tokens,
        source=before.source,
        provider_tokens=before.provider_tokens,
        estimated_tokens=after_tokens - before.provider_tokens,
    )
    decision.over_budget = after_tokens > budget
    return request, decision


class TrimHistory(Node):
    """messages -> request_messages, with tool results older than the last ``keep_tool_result`` blanked.

    ``TrimHistory(max_context_tokens=N)`` builds a ``BudgetTrimHistory``, which also fits a token budget.
    """

    outputs: ClassVar[tuple[str, ...]] = ("request_messages",)

    def __new__(
        cls, keep_tool_result: int = -1, max_context_tokens: int | None = None, trim_block: int = 1
    ) -> TrimHistory:
        # One config entry (conf/pipeline/agent_turn.yaml) for both: the budget adds ports, which only a
        # budgeted run should record.
        if cls is TrimHistory and max_context_tokens is not None:
            return super().__new__(BudgetTrimHistory)
        return super().__new__(cls)

    def __init__(self, keep_tool_result: int = -1, max_context_tokens: int | None = None, trim_block: int = 1) -> None:
        if isinstance(trim_block, bool) or not isinstance(trim_block, int) or trim_block < 1:
            raise ConfigError(f"agent.trim_block must be a whole number of at least 1, not {trim_block!r}")
        self.keep_tool_result = keep_tool_result
        self.max_context_tokens = max_context_tokens
        self.trim_block = trim_block

    def run(self, ctx: TurnContext, messages: list[Message]) -> dict[str, Any]:
        return {"request_messages": trim_tool_results(messages, self.keep_tool_result, self.trim_block)}


class BudgetTrimHistory(TrimHistory):
    """(messages, system, tools, last_usage?) -> (request_messages, context_budget): ``keep_tool_result``, then
    the token budget."""

    outputs = ("request_messages", "context_budget")

    def __init__(self, keep_tool_result: int = -1, max_context_tokens: int | None = None, trim_block: int = 1) -> None:
        if max_context_tokens is None or max_context_tokens <= 0:
            raise ConfigError(f"agent.max_context_tokens must be a positive number, not {max_context_tokens}")
        super().__init__(keep_tool_result, max_context_tokens, trim_block)
        self.budget = max_context_tokens

    def run(  # type: ignore[override]
        self,
        ctx: TurnContext,
        messages: list[Message],
        system: list[Block],
        tools: list[ToolSpec],
        last_usage: Usage | None = None,
    ) -> dict[str, Any]:
        request, decision = fit_budget(
            messages,
            system,
            tools,
            self.budget,
            keep=self.keep_tool_result,
            last_usage=last_usage,
            block=self.trim_block,
        )
        return {"request_messages": request, "context_budget": decision.to_dict()}
