"""What the parsing stage does with input it cannot read safely: a size cap and a clear reason for every failure.

A model reply is untrusted input. Whatever it holds (nesting deeper than the interpreter's stack, a literal
so long that ``ast`` runs out of memory, a lone surrogate that cannot be encoded), ``parse_tool_calls`` and
``repair_arguments`` answer with a bad call or a failed repair that says why, never with an exception that
would fail the task. Beyond ``DEFAULT_MAX_CHARS`` a reply is not parsed at all: every stage is linear, but a
bound on the input is what bounds the time a reply can take.
"""

from __future__ import annotations

# 1 MiB of text: about four times the longest reply any current model can write in one turn.
DEFAULT_MAX_CHARS = 1 << 20

# Call blocks of one format read per reply; the rest is one bad call. Each block costs a repair, so this is
# what keeps a reply of 80,000 `<tool_call>{` fragments from costing a minute.
MAX_CALL_BLOCKS = 1000

# How much of an unreadable input a bad call keeps (it is shown to the model and written to the run dir).
RAW_KEEP = 2000


def failure_reason(exc: BaseException) -> str:
    """A one-line reason for an exception met while reading model output."""
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    if isinstance(exc, MemoryError):
        return "too large to read (out of memory)"
    if isinstance(exc, UnicodeError):
        return "holds characters that cannot be encoded (a lone surrogate?)"
    text = str(exc).strip().splitlines()
    detail = text[0][:200] if text else ""
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def too_long_reason(size: int, limit: int) -> str:
    return (
        f"the text is {size:,} characters, more than the parser's limit of {limit:,}; "
        "it was not parsed (raise max_chars on the parse_tool_calls / repair_arguments nodes to read longer ones)"
    )


def too_many_blocks_reason(fmt: str, limit: int) -> str:
    return f"more than {limit:,} {fmt} tool-call blocks in one reply; the rest of the reply was not read"


def clip(text: str, keep: int = RAW_KEEP) -> str:
    """The start of a long text, saying how much was left out."""
    if len(text) <= keep:
        return text
    return text[:keep] + f"... [{len(text) - keep:,} more characters]"
