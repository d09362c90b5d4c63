"""compact_history: past a token threshold, the older turns become a summary written by a model.

An ``on_history`` hook (``agent.compaction.enabled=true``): it sits before everything that reads the history,
so the compacted history is what the turn sends *and* what dispatch_tools extends, and the summary is paid for
once, not every turn.

The compacted history is ``[task + summary, <the last keep_turns turns verbatim>]``: the summary is appended
to the task message as a ``<conversation_summary>`` text block (the task's own text is untouched), and the
kept part starts at an assistant message. So roles still alternate, every kept ``tool_use`` keeps its
``tool_result``, and signed thinking or reasoning items are replayed unchanged: the next request is valid for
every protocol. A second compaction folds the earlier summary into the new one.

The summary call goes through the run's provider as agent ``agent.compaction.agent`` ("compactor"), so
``provider.agent_models.compactor=<provider>[:<model>]`` sends it to any configured model. It is a plain
text conversation (the transcript is rendered as text), valid for every protocol and tool mode. Its raw
exchange is recorded in the node's ``compaction`` output and its tokens count toward the task (``model_usage``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from flowllm.core.interfaces import CallContext
from flowllm.core.types import Block, Message, ToolSpec, Usage, text_block, user_message
from flowllm.engine import Node, TurnContext
from flowllm.errors import ConfigError
from flowllm.nodes.tokens import TokenCount, count_context
from flowllm.rundir.layout import nested_scope

SUMMARY_TAG = "conversation_summary"
_SUMMARY_BLOCK = re.compile(rf"^<{SUMMARY_TAG}\b[^>]*>\n?(.*?)\n?</{SUMMARY_TAG}>\s*$", re.DOTALL)
# The text protocol's tool calls are instructions to run tools; in a summary they would be run again.
_TOOL_MARKUP = re.compile(r"<use_mcp_tool>.*?(?:</use_mcp_tool>|$)|<tool_call>.*?(?:</tool_call>|$)", re.DOTALL | re.I)

SUMMARY_SYSTEM = (
    "You compress the transcript of an AI agent's work into a summary the agent will continue from. Keep every "
    "fact it learned (exact numbers, names, file contents that matter), what it tried and how that went, and "
    "what remains to be done. Do not solve the task, do not call tools, write plain text."
)


def _render_block(block: Block, max_chars: int) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_use":
        args = block.get("arguments_text") or json.dumps(block.get("input", {}), ensure_ascii=False)
        return f"[tool call {block.get('name')} {args}]"
    if kind == "tool_result":
        content = block.get("content", [])
        parts = [content] if isinstance(content, str) else [_render_block(b, max_chars) for b in content]
        text = "\n".join(parts)
        if len(text) > max_chars:
            text = text[:max_chars] + f" [... {len(text) - max_chars} characters cut]"
        return f"[tool result{' (error)' if block.get('is_error') else ''}: {text}]"
    if kind in ("image", "audio", "document", "file"):
        return f"[{kind} {block.get('media_type', '')}]"
    return ""  # thinking and reasoning: private to the model, and signed


def render_transcript(messages: list[Message], max_result_chars: int) -> str:
    lines = []
    for message in messages:
        text = "\n".join(t for t in (_render_block(b, max_result_chars) for b in message["content"]) if t)
        if len(text) > max_result_chars * 4:
            text = text[: max_result_chars * 4] + " [... cut]"
        lines.append(f"{message['role'].upper()}: {text}")
    return "\n\n".join(lines)


def split_summary(task: Message) -> tuple[Message, str]:
    """The task message without an earlier summary block, and that summary ("" when none)."""
    summary = ""
    kept: list[Block] = []
    for block in task["content"]:
        match = _SUMMARY_BLOCK.match(str(block.get("text", ""))) if block.get("type") == "text" else None
        if match:
            summary = match.group(1)
        else:
            kept.append(block)
    bare: Message = {"role": task["role"], "content": kept}
    if "meta" in task:
        bare["meta"] = dict(task["meta"])
    return bare, summary


def fallback_summary(transcript: str, limit: int) -> str:
    """When the model gives no usable text: the transcript's tail, so nothing recent is lost."""
    tail = transcript[-limit:]
    return f"(No summary could be written; the end of the earlier transcript follows.)\n{tail}"


class CompactHistory(Node):
    """(messages, system, tools, last_usage?) -> (messages, compaction, model_usage)."""

    outputs = ("messages", "compaction", "model_usage")

    def __init__(
        self,
        threshold_tokens: int | None = None,
        threshold_fraction: float = 0.8,
        max_context_tokens: int | None = None,
        keep_turns: int = 2,
        agent: str = "compactor",
        max_result_chars: int = 2000,
        max_summary_tokens: int = 1024,
    ) -> None:
        if threshold_tokens is None:
            if max_context_tokens is None:
                raise ConfigError("compact_history needs agent.compaction.threshold_tokens or agent.max_context_tokens")
            threshold_tokens = int(max_context_tokens * threshold_fraction)
        if threshold_tokens <= 0:
            raise ConfigError(f"compaction threshold must be positive, not {threshold_tokens}")
        if keep_turns < 1:
            raise ConfigError(f"agent.compaction.keep_turns must be at least 1, not {keep_turns}")
        self.threshold = threshold_tokens
        self.keep_turns = keep_turns
        self.agent = agent
        self.max_result_chars = max_result_chars
        self.max_summary_chars = max_summary_tokens * 4

    def split_point(self, messages: list[Message]) -> int | None:
        """Index of the first kept message (an assistant message), or None when there is nothing to fold."""
        assistants = [i for i, m in enumerate(messages) if i > 0 and m["role"] == "assistant"]
        if len(assistants) <= self.keep_turns:
            return None
        split = assistants[-self.keep_turns]
        return split if split > 1 else None

    async def run(
        self,
        ctx: TurnContext,
        messages: list[Message],
        system: list[Block],
        tools: list[ToolSpec],
        last_usage: Usage | None = None,
    ) -> dict[str, Any]:
        count = count_context(system, messages, tools, last_usage)
        info: dict[str, Any] = {"threshold": self.threshold, "count": count.to_dict(), "compacted": False}
        split = self.split_point(messages) if count.tokens > self.threshold else None
        if split is None:
            if count.tokens > self.threshold:
                info["reason"] = f"fewer than {self.keep_turns + 1} turns: nothing old enough to fold"
            return {"messages": messages, "compaction": info, "model_usage": Usage()}
        if ctx.provider is None:
            raise RuntimeError("compact_history needs a provider for its summary call")
        task, earlier = split_summary(messages[0])
        folded = messages[1:split]
        transcript = render_transcript(folded, self.max_result_chars)
        task_text = "\n".join(str(b.get("text", "")) for b in task["content"] if b.get("type") == "text")
        prompt = [f"The task:\n{task_text}"]
        if earlier:
            prompt.append(f"Summary of the work before this transcript:\n{earlier}")
        prompt.append(f"Transcript to summarise:\n{transcript}")
        prompt.append("Write the summary now.")
        provider = ctx.provider
        request = provider.build_request(
            system=[text_block(SUMMARY_SYSTEM)], messages=[user_message("\n\n".join(prompt))], tools=[]
        )
        # A one-turn conversation of its own: turn 1, scoped under the turn that compacted, so the emulator's
        # script and the ledger see it apart from the agent's turns (and replay reports it as a miss, not as
        # some other turn's reply).
        context = CallContext(
            task_id=ctx.task_id, turn=1, agent=self.agent, scope=nested_scope(ctx.scope, ctx.turn, self.agent)
        )
        raw = await provider.send(request, context=context)
        reply = provider.normalize(raw)
        summary = _TOOL_MARKUP.sub("", reply.text).strip()[: self.max_summary_chars]
        if not summary:
            summary = fallback_summary(transcript, self.max_summary_chars)
        turns = sum(1 for m in folded if m["role"] == "assistant") + int(task.get("meta", {}).get("compacted_turns", 0))
        compacted_task: Message = {
            "role": task["role"],
            "content": [*task["content"], text_block(f'<{SUMMARY_TAG} turns="{turns}">\n{summary}\n</{SUMMARY_TAG}>')],
            "meta": {**task.get("meta", {}), "compacted_turns": turns},
        }
        compacted = [compacted_task, *messages[split:]]
        after: TokenCount = count_context(system, compacted, tools, None)
        info.update(
            compacted=True,
            folded_messages=len(folded),
            folded_turns=turns,
            summary=summary,
            after=after.to_dict(),
            raw_request=request,
            raw_response=raw,
            usage=reply.usage.to_dict(),
        )
        return {"messages": compacted, "compaction": info, "model_usage": reply.usage}
