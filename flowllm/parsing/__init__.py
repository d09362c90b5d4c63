"""Parsing: tool calls out of model replies, and JSON repair for their arguments.

    from flowllm.parsing import parse_tool_calls, repair_json, repair_arguments
    parsed = parse_tool_calls(payload, servers=None)   # -> Parsed(calls, bad, content, formats)
    r = repair_json(text, key=None, stages=None)       # -> Repaired(ok, value, stage, error, raw)
    r = repair_arguments(text)                         # the same, value always a dict when ok

``STAGES`` (a ``Registry``: built-ins and plug-ins of ``flowllm.repair_stages``) maps repair stage names to their
stages and ``validate_stages`` checks a configured chain; ``FORMATS`` (plug-ins: ``flowllm.toolcall_formats``)
holds the tool-call formats ``parse_tool_calls(formats=...)`` accepts.
"""

from flowllm.parsing.repair import (
    CODE_FIELDS,
    PRESETS,
    STAGES,
    repair_arguments,
    repair_json,
    validate_stages,
)
from flowllm.parsing.streaming import StreamingToolCallParser
from flowllm.parsing.toolcalls import FORMATS, parse_tool_calls, validate_formats
from flowllm.parsing.types import BadToolCall, Parsed, Repaired, ToolCall

__all__ = [
    "CODE_FIELDS",
    "FORMATS",
    "PRESETS",
    "STAGES",
    "BadToolCall",
    "Parsed",
    "Repaired",
    "StreamingToolCallParser",
    "ToolCall",
    "parse_tool_calls",
    "repair_arguments",
    "repair_json",
    "validate_formats",
    "validate_stages",
]
