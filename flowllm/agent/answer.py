"""Final-answer extraction: the content of the last ``\\boxed{...}`` (nested braces allowed), else the text."""

from __future__ import annotations

_MARKER = "\\boxed{"


def last_boxed(text: str) -> str | None:
    """The content of the last balanced ``\\boxed{...}`` in ``text``, or None when there is none."""
    start = text.rfind(_MARKER)
    while start != -1:
        depth = 0
        i = start + len(_MARKER)
        begin = i
        while i < len(text):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                if depth == 0:
                    return text[begin:i].strip()
                depth -= 1
            i += 1
        # Unbalanced (truncated reply): try an earlier one.
        start = text.rfind(_MARKER, 0, start)
    return None


def extract_answer(text: str) -> str:
    boxed = last_boxed(text)
    return boxed if boxed is not None else text.strip()
