"""Programs that run first in a sandboxed child, before anything of flowllm can be imported there.

Each is a real module (checked by ruff and mypy like the rest), written with the standard library alone and
without ``from __future__`` imports, so that its text can be handed to a fresh interpreter with ``python -c``:
the child needs neither flowllm nor the project's folders in view. ``program`` joins a module's text after the
helpers it uses (``limits``), which it names only under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

# The helpers every child program gets ahead of its own text.
SHARED = ("limits",)


@cache
def program(name: str) -> str:
    """The text to run with ``python -c`` for the child program ``name`` (a module of this package)."""
    folder = files(__name__)
    return "\n\n".join(folder.joinpath(f"{part}.py").read_text(encoding="utf-8") for part in (*SHARED, name))
